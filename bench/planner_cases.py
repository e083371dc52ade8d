"""bench/planner.py's problems and yardsticks: random and trace-driven instances, the
first-fit baseline, and the exact optimum (CP-SAT) that plans are measured against."""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ortools.sat.python import cp_model

from migpart.mig import CATALOG, Instance, ModelTable, addable_placements
from migpart.planning.model import (
    GpuState,
    InstanceState,
    NodeState,
    PolicyView,
    Request,
    Snapshot,
)

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "fixtures" / "traces" / "openb_pod_list_default.csv"

MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A30"]
BIG_MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]

# Profiles with the same geometry (compute slices, memory slices) across the catalog, so that a
# request can name "a 3g.40gb or whatever is the same cut on an H200".
GEOMETRY: dict[tuple[int, int], list[str]] = {}
for _table in CATALOG.values():
    for _prof in _table.profiles:
        if "+" not in _prof.name:
            names = GEOMETRY.setdefault((_prof.compute_slices, _prof.memory_slices), [])
            if _prof.name not in names:
                names.append(_prof.name)


# --- instance generation ----------------------------------------------------------------------


def random_layout(rng: random.Random, table: ModelTable, fill: float) -> tuple[InstanceState, ...]:
    layout: list[Instance] = []
    while rng.random() < fill:
        options = [i for i in addable_placements(table, layout) if "+" not in i.profile]
        if not options:
            break
        layout.append(rng.choice(options))
    return tuple(InstanceState(i.profile, i.start, rng.random() < 0.5) for i in sorted(layout))


def random_request(rng: random.Random, name: str, models: Sequence[str]) -> Request:
    table = CATALOG[rng.choice(list(models))]
    plain = [p for p in table.profiles if "+" not in p.name]
    weights = [1.0 / p.compute_slices for p in plain]
    first = rng.choices(plain, weights)[0]
    chosen = [first]
    if rng.random() < 0.4:  # alternatives: a bigger cut also serves
        bigger = [p for p in plain if p.compute_slices >= first.compute_slices and p != first]
        if bigger:
            chosen.append(rng.choice(bigger))
    profiles: list[str] = []
    for prof in chosen:
        profiles.append(prof.name)
        if rng.random() < 0.5:  # the same cut on the other models
            key = (prof.compute_slices, prof.memory_slices)
            profiles += [n for n in GEOMETRY[key] if n not in profiles]
    count = 1 if rng.random() < 0.7 else rng.choice([2, 2, 3, 4])
    priority = 1 if rng.random() < 0.2 else 0
    return Request(name, tuple(dict.fromkeys(profiles)), count, priority)


def random_instance(rng: random.Random) -> tuple[Snapshot, list[Request]]:
    models = rng.sample(MODELS, rng.choice([1, 2, 2, 3]))
    nodes = []
    for n in range(rng.randint(2, 6)):
        model = rng.choice(models)
        table = CATALOG[model]
        gpus = tuple(
            GpuState(f"node-{n}", g, model, random_layout(rng, table, rng.choice([0.0, 0.5, 0.8])))
            for g in range(rng.randint(1, 4))
        )
        nodes.append(NodeState(f"node-{n}", gpus))
    requests = [random_request(rng, f"r{i}", models) for i in range(rng.randint(5, 20))]
    return Snapshot(tuple(nodes)), requests


def trace_pods() -> list[tuple[int, int]]:
    """(num_gpu, gpu_milli) of every GPU pod in the trace, in trace order."""
    with TRACE.open() as fh:
        rows = [(int(r["num_gpu"]), int(r["gpu_milli"])) for r in csv.DictReader(fh)]
    return [(n, m) for n, m in rows if n > 0]


def trace_profiles(num_gpu: int, gpu_milli: int) -> tuple[tuple[str, ...], int]:
    """MIG profiles (every model's name for that cut) and count for one trace pod."""
    if num_gpu > 1:
        return tuple(GEOMETRY[(7, 8)]), num_gpu
    sevenths = 7 * gpu_milli / 1000
    compute = next(c for c in (1, 2, 3, 4, 7) if sevenths <= c + 1e-9)
    memory = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}[compute]
    return tuple(GEOMETRY[(compute, memory)]), 1


def profiles_for(table: ModelTable, names: Sequence[str]) -> list[str]:
    return [n for n in names if table.has(n)]


def trace_instance(
    rng: random.Random,
    pods: Sequence[tuple[int, int]],
    nodes: int,
    gpus: int,
    requests: int,
    models: Sequence[str] = BIG_MODELS,
) -> tuple[Snapshot, list[Request]]:
    """Nodes partly filled with running trace pods (used) and left-over free instances,
    then the next trace pods as requests."""
    cursor = rng.randrange(len(pods))
    snapshot_nodes = []
    for n in range(nodes):
        model = rng.choice(list(models))
        table = CATALOG[model]
        gpu_states = []
        for g in range(gpus):
            layout: list[InstanceState] = []
            target = rng.choice([0, 1, 2, 3])
            for _ in range(target):
                num, milli = pods[cursor % len(pods)]
                cursor += 1
                names, _count = trace_profiles(1, milli if num == 1 else 1000)
                wanted = set(profiles_for(table, names))
                current = [Instance(i.profile, i.start) for i in layout]
                options = [i for i in addable_placements(table, current) if i.profile in wanted]
                if options:
                    inst = options[0]
                    layout.append(InstanceState(inst.profile, inst.start, rng.random() < 0.7))
            gpu_states.append(GpuState(f"node-{n}", g, model, tuple(layout)))
        snapshot_nodes.append(NodeState(f"node-{n}", tuple(gpu_states)))
    reqs = []
    for i in range(requests):
        num, milli = pods[cursor % len(pods)]
        cursor += 1
        names, count = trace_profiles(num, milli)
        reqs.append(Request(f"pod-{i}", names, count, 1 if rng.random() < 0.1 else 0))
    return Snapshot(tuple(snapshot_nodes)), reqs


# --- first-fit baseline -----------------------------------------------------------------------


def first_fit(snapshot: Snapshot, requests: Sequence[Request]) -> int:
    """Requests satisfied by first fit: requests by priority then arrival, nodes in order;
    reuse a free instance or create one at the first free placement; never destroy."""
    layouts = {
        (n.name, g.index): [i.geometry for i in g.instances] for n in snapshot.nodes for g in n.gpus
    }
    free = {
        (n.name, g.index): {i.geometry for i in g.instances if not i.used}
        for n in snapshot.nodes
        for g in n.gpus
    }
    satisfied = 0
    for request in sorted(requests, key=lambda r: -r.priority):
        for node in snapshot.nodes:
            taken: list[tuple[tuple[str, int], Instance, bool]] = []
            for _ in range(request.count):
                pick = None
                for gpu in node.gpus:
                    key = (node.name, gpu.index)
                    table = snapshot.table(gpu.model)
                    reuse = sorted(i for i in free[key] if i.profile in request.profiles)
                    if reuse:
                        pick = (key, reuse[0], False)
                        break
                    options = [
                        i
                        for i in addable_placements(table, layouts[key])
                        if i.profile in request.profiles
                    ]
                    if options:
                        pick = (key, options[0], True)
                        break
                if pick is None:
                    break
                key, inst, new = pick
                if new:
                    layouts[key].append(inst)
                else:
                    free[key].discard(inst)
                taken.append(pick)
            if len(taken) == request.count:
                satisfied += 1
                break
            for key, inst, new in taken:  # undo a partial fit on this node
                if new:
                    layouts[key].remove(inst)
                else:
                    free[key].add(inst)
    return satisfied


# --- exact optimum ----------------------------------------------------------------------------


@dataclass
class Optimum:
    satisfied: int
    by_priority: dict[int, int]
    destroyed: int
    optimal: bool


def priority_weights(requests: Sequence[Request]) -> dict[int, int]:
    """Weights that make one request of a higher priority outweigh all lower ones together."""
    weights: dict[int, int] = {}
    below = 0
    for level in sorted({r.priority for r in requests}):
        weights[level] = below + 1
        below += weights[level] * sum(1 for r in requests if r.priority == level)
    return weights


def optimum(
    snapshot: Snapshot, requests: Sequence[Request], policy: PolicyView, limit_s: float = 20.0
) -> Optimum:
    """CP-SAT: maximise priority-weighted satisfied requests, then minimise destroyed."""
    model = cp_model.CpModel()
    weights = priority_weights(requests)
    present: dict[tuple[str, int, Instance], cp_model.IntVar] = {}
    destroyed_terms = []
    take: dict[tuple[int, str], list[cp_model.IntVar]] = {}
    for node in snapshot.nodes:
        for gpu in node.gpus:
            table = snapshot.table(gpu.model)
            used = {i.geometry for i in gpu.instances if i.used}
            free = {i.geometry for i in gpu.instances if not i.used}
            candidates = [
                Instance(p.name, s)
                for p in table.profiles
                for s in p.placements
                if policy.permits(p.name) or Instance(p.name, s) in free | used
            ]
            var = {}
            for inst in candidates:
                v = model.new_bool_var(f"a_{node.name}_{gpu.index}_{inst.profile}_{inst.start}")
                var[inst] = v
                present[(node.name, gpu.index, inst)] = v
                if inst in used:
                    model.add(v == 1)
                if inst in free:
                    destroyed_terms.append(1 - v)
            for k in range(table.memory_slices):
                covering = [
                    v for i, v in var.items() if table.profile(i.profile).mask(i.start) >> k & 1
                ]
                if len(covering) > 1:
                    model.add(sum(covering) <= 1)
            model.add(
                sum(table.profile(i.profile).compute_slices * v for i, v in var.items())
                <= table.compute_slices
            )
            for prof in table.profiles:
                same = [v for i, v in var.items() if i.profile == prof.name]
                if len(same) > prof.max_instances:
                    model.add(sum(same) <= prof.max_instances)
            # requests taking free (not used) instances
            for inst, v in var.items():
                if inst in used:
                    continue
                takers = []
                for r, request in enumerate(requests):
                    if inst.profile not in request.profiles:
                        continue
                    if request.nodes is not None and node.name not in request.nodes:
                        continue
                    z = model.new_bool_var("")
                    takers.append(z)
                    take.setdefault((r, node.name), []).append(z)
                if takers:
                    model.add(sum(takers) <= v)
    served = []
    by_level: dict[int, list[cp_model.IntVar]] = {}
    for r, request in enumerate(requests):
        ys = []
        for node in snapshot.nodes:
            zs = take.get((r, node.name))
            if not zs:
                continue
            y = model.new_bool_var("")
            model.add(sum(zs) == request.count * y)
            ys.append(y)
        if ys:
            model.add(sum(ys) <= 1)
            s = model.new_bool_var("")
            model.add(s == sum(ys))
            served.append((weights[request.priority], s))
            by_level.setdefault(request.priority, []).append(s)
    objective = sum(w * s for w, s in served)
    model.maximize(objective)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = limit_s
    solver.parameters.num_workers = 1
    status = solver.solve(model)
    optimal = status == cp_model.OPTIMAL
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Optimum(0, {}, 0, False)
    best = round(solver.objective_value)
    model.add(objective == best)
    model.minimize(sum(destroyed_terms))
    status2 = solver.solve(model)
    optimal = optimal and status2 == cp_model.OPTIMAL
    levels = {p: sum(solver.value(s) for s in ss) for p, ss in by_level.items()}
    return Optimum(sum(levels.values()), levels, round(solver.objective_value), optimal)
