"""The JSON form of the planner's input and output (the `migpart plan` contract).

Parsing validates everything the planner relies on, so the planner itself never sees a bad
snapshot: every error is an `InvalidInput` whose path names the field exactly
(`nodes[3].gpus[0].model: unknown model and no profile table given`).

Beyond the contract, the snapshot may carry an optional `policy` object, a GpuPartitionPolicy's
spec (`{"profiles": {"allow": [...], "deny": [...]}, "spares": [...], ...}`). Its shape belongs
to the api model, which planning may not import, so the caller passes the function that parses
it (`migpart.commands.plan.policy_view`); its errors are reported under `policy`. Requests may
carry an optional `nodes` list and an optional `sameGpu` boolean (all `count` devices on one
GPU, `Request.same_gpu`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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

# Parses a GpuPartitionPolicy spec; raises InvalidInput with a path inside the spec.
PolicyParser = Callable[[object], PolicyView]


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


_PROFILE_KEYS = {
    "name", "computeSlices", "memorySlices", "placements", "maxInstances", "memoryMiB",
    "multiprocessors", "copyEngines", "decoders", "encoders", "jpegs", "ofas",
}  # fmt: skip


def _profile(raw: object, path: str, compute: int, memory: int) -> Profile:
    obj = _object(raw, path)
    _unknown_keys(obj, _PROFILE_KEYS, path)
    name = _str(_field(obj, "name", path), _join(path, "name"))
    cs = _int(_field(obj, "computeSlices", path), _join(path, "computeSlices"), 1)
    ms = _int(_field(obj, "memorySlices", path), _join(path, "memorySlices"), 1)
    if cs > compute:
        raise InvalidInput(_join(path, "computeSlices"), f"{cs} exceeds the model's {compute}")
    if ms > memory:
        raise InvalidInput(_join(path, "memorySlices"), f"{ms} exceeds the model's {memory}")
    placements_path = _join(path, "placements")
    placements = []
    for j, raw_start in enumerate(_list(_field(obj, "placements", path), placements_path)):
        start = _int(raw_start, f"{placements_path}[{j}]", 0)
        if start + ms > memory:
            raise InvalidInput(
                f"{placements_path}[{j}]", f"start {start} + {ms} slices exceeds {memory}"
            )
        placements.append(start)
    if not placements:
        raise InvalidInput(placements_path, "must not be empty")
    if len(set(placements)) != len(placements):
        raise InvalidInput(placements_path, "duplicate start")
    extra = {
        key: _int(obj[key], _join(path, key), 0)
        for key in ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegs", "ofas")
        if key in obj
    }
    return Profile(
        name=name,
        compute_slices=cs,
        memory_slices=ms,
        placements=tuple(placements),
        max_instances=_int(_field(obj, "maxInstances", path), _join(path, "maxInstances"), 1),
        memory_mib=_int(_field(obj, "memoryMiB", path), _join(path, "memoryMiB"), 1),
        multiprocessors=extra.get("multiprocessors", 0),
        copy_engines=extra.get("copyEngines", 0),
        decoders=extra.get("decoders", 0),
        encoders=extra.get("encoders", 0),
        jpegs=extra.get("jpegs", 0),
        ofas=extra.get("ofas", 0),
    )


def _table(model: str, raw: object, path: str) -> ModelTable:
    obj = _object(raw, path)
    _unknown_keys(obj, {"computeSlices", "memorySlices", "profiles"}, path)
    compute = _int(_field(obj, "computeSlices", path), _join(path, "computeSlices"), 1)
    memory = _int(_field(obj, "memorySlices", path), _join(path, "memorySlices"), 1)
    profiles_path = _join(path, "profiles")
    profiles: list[Profile] = []
    names: set[str] = set()
    raw_profiles = _list(_field(obj, "profiles", path), profiles_path)
    for i, raw_profile in enumerate(raw_profiles):
        prof = _profile(raw_profile, f"{profiles_path}[{i}]", compute, memory)
        if prof.name in names:
            raise InvalidInput(f"{profiles_path}[{i}].name", f"duplicate profile {prof.name!r}")
        names.add(prof.name)
        profiles.append(prof)
    if not profiles:
        raise InvalidInput(profiles_path, "must not be empty")
    return ModelTable(model, compute, memory, tuple(profiles))


def _tables(raw: object) -> dict[str, ModelTable]:
    obj = _object(raw, "models")
    return {
        str(model): _table(str(model), body, f"models[{model!r}]") for model, body in obj.items()
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


def _policy(raw: object, parse: PolicyParser) -> PolicyView:
    try:
        return parse(raw)
    except InvalidInput as error:
        where = f"policy.{error.path}" if error.path else "policy"
        raise InvalidInput(where, error.message) from None


def parse_input(raw: object, parse_policy: PolicyParser) -> PlanInput:
    """Validate and convert a decoded snapshot document; raises InvalidInput naming the field.

    `parse_policy` parses the document's `policy`, when it has one.
    """
    obj = _object(raw, "")
    _unknown_keys(obj, {"models", "nodes", "requests", "policy"}, "")
    tables = _tables(obj["models"]) if "models" in obj else {}
    nodes = _nodes(_field(obj, "nodes", ""), tables)
    requests = _requests(obj.get("requests", []), _known_profiles(tables))
    policy = _policy(obj["policy"], parse_policy) if "policy" in obj else PolicyView()
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
