"""The plan contract's correctness rules, checked on any plan (table-driven and property
tests alike)."""

from __future__ import annotations

from migpart.mig import Instance, layout_problems
from migpart.planning.model import Plan, PolicyView, Request, Snapshot


def check_plan(
    snapshot: Snapshot, requests: list[Request], policy: PolicyView, result: Plan
) -> None:
    """The contract's correctness rules, checked one by one."""
    gpus = {(n.name, g.index): g for n in snapshot.nodes for g in n.gpus}
    targets = {(g.node, g.index): set(g.instances) for g in result.gpus}
    assert set(targets) == set(gpus), "a target for every GPU, and only those"
    assert len(result.gpus) == len(gpus)
    for key, gpu in gpus.items():
        target = targets[key]
        table = snapshot.table(gpu.model)
        assert not layout_problems(table, sorted(target)), (key, target)
        original = {i.geometry for i in gpu.instances}
        for inst in gpu.instances:
            if inst.used:
                assert inst.geometry in target, f"used {inst} moved or destroyed"
        for inst in target - original:
            assert policy.permits(inst.profile), f"created non-permitted {inst}"
    used = {
        (n.name, g.index, i.geometry)
        for n in snapshot.nodes
        for g in n.gpus
        for i in g.instances
        if i.used
    }
    by_name = {r.name: r for r in requests}
    seen: set[tuple[str, int, Instance]] = set()
    for a in result.assignments:
        request = by_name[a.request]
        assert len(a.devices) == request.count
        if request.nodes is not None:
            assert a.node in request.nodes
        if request.same_gpu:
            assert len({d.gpu for d in a.devices}) == 1, "same-GPU request spread over GPUs"
        for d in a.devices:
            ref = (a.node, d.gpu, Instance(d.profile, d.start))
            assert Instance(d.profile, d.start) in targets[(a.node, d.gpu)], "device not in target"
            assert ref not in used, "a used instance was handed out"
            assert ref not in seen, "a device was assigned twice"
            assert d.profile in request.profiles
            seen.add(ref)
    assigned = {a.request for a in result.assignments}
    assert len(assigned) == len(result.assignments)
    assert set(result.unsatisfied) == {r.name for r in requests} - assigned
    assert len(result.unsatisfied) + len(assigned) == len(requests)
    # stats agree with the layouts
    current = {key: {i.geometry for i in gpu.instances} for key, gpu in gpus.items()}
    destroyed = sum(len(current[k] - targets[k]) for k in current)
    created = sum(len(targets[k] - current[k]) for k in current)
    changed = sum(current[k] != targets[k] for k in current)
    assert (result.stats.destroyed, result.stats.created, result.stats.gpus_changed) == (
        destroyed,
        created,
        changed,
    )
