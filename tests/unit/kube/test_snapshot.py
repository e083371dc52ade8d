"""The planner's snapshot of MigNodes, and the cache that rebuilds only the nodes that changed."""

from __future__ import annotations

from migpart.api.models import GpuSpec, MigInstanceSpec, MigNode, MigNodeSpec, MigNodeStatus
from migpart.dra import DeviceId
from migpart.kube.snapshot import SnapshotCache
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
