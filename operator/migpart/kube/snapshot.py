"""MigNodes -> the planner's Snapshot: what each GPU holds and which instances are in use.

A GPU's layout, as the planner must see it, is the desired one where the operator already
wrote a plan for it (`spec`), so that instances still being created count as there and are not
planned twice; instances the status reports in use but the spec dropped are added (the agent
never destroys them). `used` is true for instances that are Prepared or Busy on the node, or
that any ResourceClaim's allocation names (the scheduler may allocate before the agent
prepares).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from migpart.api.models import GpuStatus, MigNode
from migpart.kube.claims import AllocatedDevice
from migpart.mig import ModelTable, device_name
from migpart.planning.model import GpuState, InstanceState, NodeState, Snapshot


def node_name(node: MigNode) -> str:
    return str(node.metadata.get("name", ""))


def gpu_state(
    name: str,
    gpu: GpuStatus,
    desired: list[tuple[str, int]] | None,
    allocated: frozenset[AllocatedDevice],
) -> GpuState:
    """One GPU's current layout for the planner (see the module docstring)."""
    actual = {(i.profile, i.start): i for i in gpu.instances}

    def used(profile: str, start: int) -> bool:
        inst = actual.get((profile, start))
        if inst is not None and inst.state != "Free":
            return True
        return AllocatedDevice(name, device_name(gpu.index, profile, start)) in allocated

    keys = list(actual) if desired is None else list(desired)
    keys += [k for k in actual if k not in keys and used(*k)]
    instances = tuple(
        InstanceState(profile, start, used(profile, start)) for profile, start in sorted(keys)
    )
    return GpuState(node=name, index=gpu.index, model=gpu.model, instances=instances)


def build_snapshot(
    nodes: Iterable[MigNode],
    allocated: frozenset[AllocatedDevice],
    known_tables: Mapping[str, ModelTable] | None = None,
) -> Snapshot:
    """The planner's view of `nodes`; GPUs without MIG mode or nodes without status are left
    out (nothing can be planned on them). `known_tables`: the models' profile tables as the
    caller already built them from these nodes (else built here from each GPU's status)."""
    states: list[NodeState] = []
    tables: dict[str, ModelTable] = dict(known_tables or {})
    for node in sorted(nodes, key=node_name):
        if node.status is None:
            continue
        name = node_name(node)
        planned: dict[int, list[tuple[str, int]]] = {}
        if node.spec is not None and node.spec.plan_id is not None:
            planned = {g.index: [(i.profile, i.start) for i in g.instances] for g in node.spec.gpus}
        gpus: list[GpuState] = []
        for gpu in sorted(node.status.gpus, key=lambda g: g.index):
            if not gpu.mig_enabled:
                continue
            if gpu.profiles and gpu.model not in tables:
                tables[gpu.model] = gpu.table()
            gpus.append(gpu_state(name, gpu, planned.get(gpu.index), allocated))
        if gpus:
            states.append(NodeState(name=name, gpus=tuple(gpus)))
    return Snapshot(nodes=tuple(states), tables=tables)


def reconfiguring(node: MigNode) -> bool:
    """The agent has not yet carried out the node's latest plan."""
    if node.spec is None or node.spec.plan_id is None:
        return False
    observed = node.status.observed_plan_id if node.status else None
    return node.spec.plan_id != observed
