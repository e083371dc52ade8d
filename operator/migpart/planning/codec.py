"""The JSON form of the planner's input and output (the `migpart plan` contract).

Parsing validates everything the planner relies on, so the planner itself never sees a bad
snapshot: every error is an `InvalidInput` whose path names the field exactly
(`nodes[3].gpus[0].model: unknown model and no profile table given`).

Two shapes in the document belong to the api models, which planning may not import: a model's
profile (`models[...].profiles[i]`, the MigNode status's `ProfileInfo`) and the optional
`policy` object, a GpuPartitionPolicy's spec (`{"profiles": {"allow": [...]}, "spares": [...],
...}`). The caller passes the functions that parse them (`migpart.commands.plan.PARSERS`), so a
new field needs the api model only; their errors are reported under the path of the object.
What depends on the model's table (slice counts, placements in range) is checked here. Requests may
carry an optional `nodes` list and an optional `sameGpu` boolean (all `count` devices on one
GPU, `Request.same_gpu`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from migpart.errors import InvalidInput
from migpart.mig import CATALOG, Instance, ModelTable, Profile, layout_problems
from migpart.planning.model import (
    GpuState,
    InstanceState,
    NodeState,
    Plan,
    PolicyView,
    Request,
    Snapshot,
)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Parsers:
    """The api models' parsers. Each raises InvalidInput with a path inside what it parses."""

    policy: Callable[[object], PolicyView]
    profile: Callable[[object], Profile]


@dataclass(frozen=True, slots=True)
class PlanInput:
    """Everything one snapshot document holds."""

    snapshot: Snapshot
    requests: tuple[Request, ...]
    policy: PolicyView


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _object(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(path or "input", f"expected an object, got {_describe(value)}")
    return value


def _field(obj: Mapping[str, Any], key: str, path: str) -> object:
    if key not in obj:
        raise InvalidInput(_join(path, key), "missing")
    return obj[key]


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(path, f"expected a string, got {_describe(value)}")
    if not value:
        raise InvalidInput(path, "must not be empty")
    return value


def _int(value: object, path: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(path, f"expected an integer, got {_describe(value)}")
    if minimum is not None and value < minimum:
        raise InvalidInput(path, f"must be at least {minimum}, got {value}")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(path, f"expected true or false, got {_describe(value)}")
    return value


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput(path, f"expected a list, got {_describe(value)}")
    return value


def _unknown_keys(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            raise InvalidInput(_join(path, str(key)), "unknown field")


def _profile(raw: object, path: str, parse: Parsers, compute: int, memory: int) -> Profile:
    prof = _within(path, parse.profile, raw)
    for key, value, limit in (
        ("computeSlices", prof.compute_slices, compute),
        ("memorySlices", prof.memory_slices, memory),
    ):
        if value < 1:
            raise InvalidInput(_join(path, key), "must be at least 1")
        if value > limit:
            raise InvalidInput(_join(path, key), f"{value} exceeds the model's {limit}")
    placements_path = _join(path, "placements")
    for j, start in enumerate(prof.placements):
        if start + prof.memory_slices > memory:
            raise InvalidInput(
                f"{placements_path}[{j}]",
                f"start {start} + {prof.memory_slices} slices exceeds {memory}",
            )
    if not prof.placements:
        raise InvalidInput(placements_path, "must not be empty")
    if len(set(prof.placements)) != len(prof.placements):
        raise InvalidInput(placements_path, "duplicate start")
    if prof.max_instances < 1:
        raise InvalidInput(_join(path, "maxInstances"), "must be at least 1")
    if prof.memory_mib < 1:
        raise InvalidInput(_join(path, "memoryMiB"), "must be at least 1")
    return prof


def _table(model: str, raw: object, path: str, parse: Parsers) -> ModelTable:
    obj = _object(raw, path)
    _unknown_keys(obj, {"computeSlices", "memorySlices", "profiles"}, path)
    compute = _int(_field(obj, "computeSlices", path), _join(path, "computeSlices"), 1)
    memory = _int(_field(obj, "memorySlices", path), _join(path, "memorySlices"), 1)
    profiles_path = _join(path, "profiles")
    profiles: list[Profile] = []
    names: set[str] = set()
    raw_profiles = _list(_field(obj, "profiles", path), profiles_path)
    for i, raw_profile in enumerate(raw_profiles):
        prof = _profile(raw_profile, f"{profiles_path}[{i}]", parse, compute, memory)
        if prof.name in names:
            raise InvalidInput(f"{profiles_path}[{i}].name", f"duplicate profile {prof.name!r}")
        names.add(prof.name)
        profiles.append(prof)
    if not profiles:
        raise InvalidInput(profiles_path, "must not be empty")
    return ModelTable(model, compute, memory, tuple(profiles))


def _tables(raw: object, parse: Parsers) -> dict[str, ModelTable]:
    obj = _object(raw, "models")
    return {
        str(model): _table(str(model), body, f"models[{model!r}]", parse)
        for model, body in obj.items()
    }


def _gpu(raw: object, path: str, node: str, tables: dict[str, ModelTable]) -> GpuState:
    obj = _object(raw, path)
    _unknown_keys(obj, {"index", "model", "instances"}, path)
    index = _int(_field(obj, "index", path), _join(path, "index"), 0)
    model_path = _join(path, "model")
    model = _str(_field(obj, "model", path), model_path)
    table = tables.get(model) or CATALOG.get(model)
    if table is None:
        raise InvalidInput(model_path, "unknown model and no profile table given")
    instances_path = _join(path, "instances")
    instances: list[InstanceState] = []
    for i, raw_inst in enumerate(_list(obj.get("instances", []), instances_path)):
        ipath = f"{instances_path}[{i}]"
        inst = _object(raw_inst, ipath)
        _unknown_keys(inst, {"profile", "start", "used"}, ipath)
        profile = _str(_field(inst, "profile", ipath), _join(ipath, "profile"))
        if not table.has(profile):
            raise InvalidInput(
                _join(ipath, "profile"),
                f"{profile!r} is not offered by {model} "
                f"(offered: {', '.join(table.profile_names)})",
            )
        start = _int(_field(inst, "start", ipath), _join(ipath, "start"), 0)
        used = _bool(inst.get("used", False), _join(ipath, "used"))
        instances.append(InstanceState(profile, start, used))
    problems = layout_problems(table, [Instance(i.profile, i.start) for i in instances])
    if problems:
        where, _, message = problems[0].partition(": ")
        raise InvalidInput(f"{path}.{where}", message)
    return GpuState(node=node, index=index, model=model, instances=tuple(instances))


def _nodes(raw: object, tables: dict[str, ModelTable]) -> tuple[NodeState, ...]:
    nodes: list[NodeState] = []
    seen: dict[str, int] = {}
    for n, raw_node in enumerate(_list(raw, "nodes")):
        path = f"nodes[{n}]"
        obj = _object(raw_node, path)
        _unknown_keys(obj, {"name", "gpus"}, path)
        name = _str(_field(obj, "name", path), _join(path, "name"))
        if name in seen:
            raise InvalidInput(
                _join(path, "name"), f"duplicate node {name!r} (nodes[{seen[name]}])"
            )
        seen[name] = n
        gpus: list[GpuState] = []
        indexes: dict[int, int] = {}
        for g, raw_gpu in enumerate(_list(obj.get("gpus", []), _join(path, "gpus"))):
            gpu = _gpu(raw_gpu, f"{path}.gpus[{g}]", name, tables)
            if gpu.index in indexes:
                raise InvalidInput(
                    f"{path}.gpus[{g}].index",
                    f"duplicate GPU index {gpu.index} ({path}.gpus[{indexes[gpu.index]}])",
                )
            indexes[gpu.index] = g
            gpus.append(gpu)
        nodes.append(NodeState(name=name, gpus=tuple(gpus)))
    return tuple(nodes)


def _known_profiles(tables: dict[str, ModelTable]) -> set[str]:
    known = {p.name for t in CATALOG.values() for p in t.profiles}
    known.update(p.name for t in tables.values() for p in t.profiles)
    return known


def _profile_list(raw: object, path: str, known: set[str]) -> tuple[str, ...]:
    names: list[str] = []
    for j, raw_name in enumerate(_list(raw, path)):
        name = _str(raw_name, f"{path}[{j}]")
        if name not in known:
            raise InvalidInput(f"{path}[{j}]", f"unknown profile {name!r}: no model offers it")
        names.append(name)
    return tuple(names)


def _requests(raw: object, known: set[str]) -> tuple[Request, ...]:
    requests: list[Request] = []
    seen: dict[str, int] = {}
    for i, raw_req in enumerate(_list(raw, "requests")):
        path = f"requests[{i}]"
        obj = _object(raw_req, path)
        _unknown_keys(obj, {"name", "profiles", "count", "priority", "nodes", "sameGpu"}, path)
        name = _str(_field(obj, "name", path), _join(path, "name"))
        if name in seen:
            raise InvalidInput(
                _join(path, "name"), f"duplicate request {name!r} (requests[{seen[name]}])"
            )
        seen[name] = i
        profiles_path = _join(path, "profiles")
        profiles = _profile_list(_field(obj, "profiles", path), profiles_path, known)
        if not profiles:
            raise InvalidInput(profiles_path, "must not be empty")
        count = _int(obj.get("count", 1), _join(path, "count"), 1)
        priority = _int(obj.get("priority", 0), _join(path, "priority"))
        nodes: frozenset[str] | None = None
        if "nodes" in obj:
            nodes_path = _join(path, "nodes")
            nodes = frozenset(
                _str(v, f"{nodes_path}[{k}]") for k, v in enumerate(_list(obj["nodes"], nodes_path))
            )
        same_gpu = _bool(obj.get("sameGpu", False), _join(path, "sameGpu"))
        requests.append(Request(name, profiles, count, priority, nodes, same_gpu))
    return tuple(requests)


def _within(path: str, parse: Callable[[object], _T], raw: object) -> _T:
    """`parse(raw)`, with the path of an InvalidInput made relative to the document."""
    try:
        return parse(raw)
    except InvalidInput as error:
        where = _join(path, error.path) if error.path else path
        raise InvalidInput(where, error.message) from None


def parse_input(raw: object, parse: Parsers) -> PlanInput:
    """Validate and convert a decoded snapshot document; raises InvalidInput naming the field.

    `parse` holds the api models' parsers for the profiles and the optional `policy`.
    """
    obj = _object(raw, "")
    _unknown_keys(obj, {"models", "nodes", "requests", "policy"}, "")
    tables = _tables(obj["models"], parse) if "models" in obj else {}
    nodes = _nodes(_field(obj, "nodes", ""), tables)
    requests = _requests(obj.get("requests", []), _known_profiles(tables))
    policy = _within("policy", parse.policy, obj["policy"]) if "policy" in obj else PolicyView()
    return PlanInput(Snapshot(nodes=nodes, tables=tables), requests, policy)


def encode_plan(plan: Plan, plan_millis: float) -> dict[str, Any]:
    """The contract's plan JSON; `plan_millis` is measured by the caller (the planner is pure)."""
    return {
        "gpus": [
            {
                "node": g.node,
                "index": g.index,
                "instances": [{"profile": i.profile, "start": i.start} for i in g.instances],
            }
            for g in plan.gpus
        ],
        "assignments": [
            {
                "request": a.request,
                "node": a.node,
                "devices": [
                    {"gpu": d.gpu, "profile": d.profile, "start": d.start} for d in a.devices
                ],
            }
            for a in plan.assignments
        ],
        "unsatisfied": list(plan.unsatisfied),
        "stats": {
            "destroyed": plan.stats.destroyed,
            "created": plan.stats.created,
            "gpusChanged": plan.stats.gpus_changed,
            "planMillis": round(plan_millis, 3),
        },
    }
