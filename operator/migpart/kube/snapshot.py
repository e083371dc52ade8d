"""MigNodes -> the planner's Snapshot: what each GPU holds and which instances are in use.

A GPU's layout, as the planner must see it, is the desired one where the operator already
wrote a plan for it (`MigNodeSpec.desired`), so that instances still being created count as
there and are not planned twice; instances the status reports in use but the spec dropped are
added (the agent never destroys them). `used` is true for instances that are Prepared or Busy
on the node, or that any ResourceClaim's allocation names (the scheduler may allocate before
the agent prepares). An allocation may name a placement that has no instance yet (made in
offer mode, whose agent makes it at prepare, before the node was handed back to reactive
mode): it counts as a used instance of its GPU as well, where it fits next to the others, so
that no plan takes its memory slices meanwhile.
A desired instance the agent reports it could not create (`status.failedInstances`: an NVML
error, an overlap) counts as used too while the failure lasts: no plan hands the pending claim
it was planned for to an instance that is not there, so the claim is planned elsewhere, and no
plan takes its place while the agent retries it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from migpart.api.models import GpuStatus, MigNode
from migpart.mig import Instance, ModelTable, device_name, layout_problems
from migpart.planning.model import GpuState, InstanceState, NodeState, Snapshot
from migpart.slices.dra import DeviceId


def node_name(node: MigNode) -> str:
    return str(node.metadata.get("name", ""))


NONE_FAILED: frozenset[Instance] = frozenset()


def gpu_state(
    name: str,
    gpu: GpuStatus,
    desired: frozenset[Instance] | None,
    allocated: frozenset[DeviceId],
    failed: frozenset[Instance] = NONE_FAILED,
) -> GpuState:
    """One GPU's current layout for the planner (see the module docstring); `desired` is
    None where the spec wants nothing of this GPU; `failed`: the instances of the GPU the
    agent reports it could not create."""
    actual = {Instance(i.profile, i.start): i for i in gpu.instances}

    def used(key: Instance) -> bool:
        inst = actual.get(key)
        if inst is not None and inst.state != "Free":
            return True
        if inst is None and key in failed:
            return True
        return DeviceId.of(name, gpu.index, key.profile, key.start) in allocated

    keys = set(actual) if desired is None else set(desired)
    keys |= {k for k in actual if used(k)}
    keys |= allocated_placements(name, gpu, keys, allocated)
    instances = tuple(InstanceState(k.profile, k.start, used(k)) for k in sorted(keys))
    return GpuState(node=name, index=gpu.index, model=gpu.model, instances=instances)


def allocated_placements(
    name: str, gpu: GpuStatus, keys: set[Instance], allocated: frozenset[DeviceId]
) -> set[Instance]:
    """The placements of `gpu` that `allocated` names and `keys` lacks, each where it fits
    next to `keys` and those taken before it (in device order)."""
    prefix = f"gpu-{gpu.index}-"
    named = {d.device for d in allocated if d.pool == name and d.device.startswith(prefix)}
    named -= {device_name(gpu.index, k.profile, k.start) for k in keys}
    if not named or not gpu.profiles:
        return set()
    table = gpu.table()
    found = sorted(
        (device, Instance(p.name, start))
        for p in table.profiles
        for start in p.placements
        if (device := device_name(gpu.index, p.name, start)) in named
    )
    taken = set(keys)
    extra: set[Instance] = set()
    for _, inst in found:
        if not layout_problems(table, [inst, *sorted(taken)]):
            taken.add(inst)
            extra.add(inst)
    return extra


def node_state(
    node: MigNode, allocated: frozenset[DeviceId]
) -> tuple[NodeState | None, dict[str, ModelTable]]:
    """One node for the planner, with the profile tables its agent reports (None: no status
    or no MIG-enabled GPU, nothing can be planned there)."""
    if node.status is None:
        return None, {}
    name = node_name(node)
    planned = node.desired()
    gpus: list[GpuState] = []
    tables: dict[str, ModelTable] = {}
    failed: dict[int, frozenset[Instance]] = {}
    for f in node.status.failed_instances:  # usually none: then no set is made per GPU
        failed[f.gpu] = failed.get(f.gpu, NONE_FAILED) | {Instance(f.profile, f.start)}
    for gpu in sorted(node.status.gpus, key=lambda g: g.index):
        if not gpu.mig_enabled:
            continue
        if gpu.profiles and gpu.model not in tables:
            tables[gpu.model] = gpu.table()
        refused = failed.get(gpu.index, NONE_FAILED)
        gpus.append(gpu_state(name, gpu, planned.get(gpu.index), allocated, refused))
    return (NodeState(name=name, gpus=tuple(gpus)) if gpus else None), tables


def _assemble(
    states: Iterable[tuple[NodeState | None, Mapping[str, ModelTable]]],
    known_tables: Mapping[str, ModelTable] | None,
) -> Snapshot:
    tables: dict[str, ModelTable] = dict(known_tables or {})
    nodes: list[NodeState] = []
    for state, own in states:
        if state is None:
            continue
        nodes.append(state)
        for model in {g.model for g in state.gpus} - tables.keys():
            if model in own:
                tables[model] = own[model]
    return Snapshot(nodes=tuple(nodes), tables=tables)


class SnapshotCache:
    """The planner's view of a node set planned again and again. GPUs without MIG mode or
    nodes without status are left out (nothing can be planned on them). A node's state is
    rebuilt only when its MigNode (the parsed object, by identity: the operator parses each
    resourceVersion once) or the allocated devices in its pool changed, so a plan costs what
    changed, not the cluster; a fresh cache builds the same snapshots from scratch."""

    def __init__(self) -> None:
        self._nodes: dict[
            str,
            tuple[MigNode, frozenset[DeviceId], tuple[NodeState | None, dict[str, ModelTable]]],
        ] = {}

    def build(
        self,
        nodes: Iterable[MigNode],
        allocated: frozenset[DeviceId],
        known_tables: Mapping[str, ModelTable] | None = None,
    ) -> Snapshot:
        """The snapshot of `nodes`. `known_tables`: the models' profile tables as the caller
        already built them from these nodes (else taken from each GPU's status)."""
        by_pool: dict[str, set[DeviceId]] = {}
        for device in allocated:
            by_pool.setdefault(device.pool, set()).add(device)
        ordered = sorted(nodes, key=node_name)
        seen = {node_name(n) for n in ordered}
        for gone in self._nodes.keys() - seen:
            del self._nodes[gone]
        states = []
        for node in ordered:
            name = node_name(node)
            mine = frozenset(by_pool.get(name, ()))
            known = self._nodes.get(name)
            if known is not None and known[0] is node and known[1] == mine:
                states.append(known[2])
                continue
            state = node_state(node, mine)
            self._nodes[name] = (node, mine, state)
            states.append(state)
        return _assemble(states, known_tables)


def reconfiguring(node: MigNode) -> bool:
    """The agent has not yet carried out the node's latest plan."""
    if node.spec is None or node.spec.plan_id is None:
        return False
    observed = node.status.observed_plan_id if node.status else None
    return node.spec.plan_id != observed
