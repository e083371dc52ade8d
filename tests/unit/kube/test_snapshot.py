"""The planner's snapshot of MigNodes, and the cache that rebuilds only the nodes that changed."""

from __future__ import annotations

from migpart.api.models import (
    FailedInstance,
    GpuSpec,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.kube.snapshot import SnapshotCache
from migpart.planning.model import Request
from migpart.planning.planner import plan
from migpart.slices.dra import DeviceId
from tests.unit.kube.factories import gpu


def node(
    name: str, *gpus_: tuple[int, tuple[tuple[str, int, str], ...]], plan: bool = False
) -> MigNode:
    spec = None
    if plan:
        spec = MigNodeSpec(
            plan_id="p1",
            gpus=[GpuSpec(index=0, instances=[MigInstanceSpec(profile="7g.80gb", start=0)])],
        )
    return MigNode(
        metadata={"name": name},
        spec=spec,
        status=MigNodeStatus(gpus=[gpu(i, *insts) for i, insts in gpus_]),
    )


def test_the_cache_builds_what_a_fresh_cache_builds_as_nodes_and_allocations_change() -> None:
    a = node("a", (0, (("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Busy"))), (1, ()))
    b = node("b", (0, (("1g.10gb", 0, "Free"),)))
    cache = SnapshotCache()
    steps: list[tuple[list[MigNode], frozenset[DeviceId]]] = [
        ([a, b], frozenset()),
        ([b, a], frozenset()),  # the same nodes in another order: reused
        ([a, b], frozenset({DeviceId.of("b", 0, "1g.10gb", 0)})),  # b's instance allocated
        ([a, node("b", (0, (("1g.10gb", 0, "Free"),)), plan=True)], frozenset()),  # b replanned
        ([a], frozenset({DeviceId.of("a", 0, "3g.40gb", 0)})),  # b gone, a's instance allocated
    ]
    for nodes, allocated in steps:
        assert cache.build(nodes, allocated) == SnapshotCache().build(nodes, allocated)


def test_a_node_is_rebuilt_only_when_its_object_or_its_allocations_change() -> None:
    a = node("a", (0, (("3g.40gb", 0, "Free"),)))
    b = node("b", (0, (("1g.10gb", 0, "Free"),)))
    cache = SnapshotCache()
    first = cache.build([a, b], frozenset())
    again = cache.build([a, b], frozenset({DeviceId.of("b", 0, "1g.10gb", 0)}))
    assert again.nodes[0] is first.nodes[0]  # a: same object, nothing allocated on it
    assert again.nodes[1] is not first.nodes[1]
    assert again.nodes[1].gpus[0].instances[0].used


def test_a_pending_claim_whose_instance_the_agent_could_not_create_is_planned_elsewhere() -> None:
    """Node a's spec wants the 7g.80gb a round planned for the claim, and its agent reports the
    create failed (an NVML error): the claim is planned on node b. Before, the planner counted
    a's instance as there and free and gave it the claim again: nothing changed, the pod stayed
    unschedulable for as long as the create failed."""
    planned = node("a", (0, ()), plan=True)
    failed = FailedInstance(gpu=0, profile="7g.80gb", start=0, reason="NvmlError", message="x")
    failing = planned.model_copy(
        update={"status": MigNodeStatus(gpus=[gpu(0)], failed_instances=[failed])}
    )
    healthy = node("b", (0, ()))
    snapshot = SnapshotCache().build([failing, healthy], frozenset())
    [a, _] = snapshot.nodes
    [kept] = a.gpus[0].instances
    assert ((kept.profile, kept.start), kept.used) == (("7g.80gb", 0), True)
    [assignment] = plan(snapshot, [Request("c", ("7g.80gb",))]).assignments
    assert assignment.node == "b"
    # once created, it is a free instance like any other
    created = node("a", (0, (("7g.80gb", 0, "Free"),)), plan=True)
    again = SnapshotCache().build([created, healthy], frozenset())
    [assignment] = plan(again, [Request("c", ("7g.80gb",))]).assignments
    assert assignment.node == "a"
