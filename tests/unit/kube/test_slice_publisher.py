"""The slice writer: what it writes and when it writes nothing (no API call: the publisher has
no client in these tests), the MigNode bodies it keeps, its view of a slice after a write
raced a deletion, and offer mode's pools of several slices."""

from __future__ import annotations

from typing import Any, cast

import pytest

from migpart.api.models import FailedInstance, MigNode
from migpart.kube import slice_publisher
from migpart.kube.slice_publisher import SlicePublisher
from migpart.kube.slice_watch import SliceState
from migpart.slices.content import SliceContent, node_slices, slice_name
from migpart.slices.dra import DRIVER
from migpart.testing.builders import H100
from tests.pools import every_placement, offering
from tests.unit.kube.factories import gpu
from tests.unit.kube.factories import spec_node as node
from tests.unit.kube.factories import watched_slice as watched
from tests.unit.kube.slice_store import SliceStore


def content(n: MigNode) -> SliceContent:
    [only] = node_slices(n)
    return only


def names(n: MigNode) -> list[str]:
    return [str(d["name"]) for d in content(n).devices]


def watched_with(n: MigNode) -> dict[str, Any]:
    """The slice of MigNode `n`'s content, as the watch shows it."""
    return content(n).body(1, "10")


def test_a_recreated_slice_continues_the_generations_of_the_deleted_one() -> None:
    publisher = SlicePublisher(cast(Any, None))
    publisher.view.observe(watched("n1", 7, 70))
    assert publisher.view.deleted(watched("n1", 7, 70)) == "n1"
    assert publisher.view._floors["n1"] == 7  # the next create writes generation 8
    publisher.forget("n1")  # the MigNode went: a new one starts afresh
    assert "n1" not in publisher.view._floors


async def test_an_unavailable_node_without_a_slice_gets_none_written() -> None:
    """No API call at all (the publisher has no client here): a wiped slice stays wiped."""
    publisher = SlicePublisher(cast(Any, None), gate=lambda node: "LeaseExpired")
    n1 = node([gpu(0, ("1g.10gb", 0, "Free"))])
    publisher.observe(n1.model_copy(update={"metadata": {"name": "n1"}}))
    result = await publisher.publish("n1")
    assert not result.written
    assert result.devices == frozenset()


async def test_an_unchanged_node_is_neither_recomputed_nor_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resync publishes every node every period: for a node whose MigNode, withdrawals
    and availability did not change, that is a dict lookup (no API call: the publisher has no
    client here)."""
    publisher = SlicePublisher(cast(Any, None))
    n1 = node([gpu(0, ("1g.10gb", 0, "Free"), ("1g.10gb", 1, "Free"))]).model_copy(
        update={"metadata": {"name": "n1"}}
    )
    publisher.observe(n1)
    devices = content(n1).devices
    publisher.view.observe(watched_with(n1))
    computed: list[MigNode] = []
    compute = slice_publisher.node_slices

    def counting(n: MigNode, *args: Any) -> list[SliceContent]:
        computed.append(n)
        return compute(n, *args)

    monkeypatch.setattr(slice_publisher, "node_slices", counting)
    for _ in range(3):
        result = await publisher.publish("n1")
        assert not result.written
        assert result.devices == {str(d["name"]) for d in devices}
    assert len(computed) == 1  # once, then from the cache
    # a new body of the same MigNode (a watch event) is computed again ...
    publisher.observe(n1.model_copy())
    await publisher.publish("n1")
    assert len(computed) == 2
    # ... and so is a withdrawal, and a change of availability (both change the content)
    current = publisher.node("n1")
    assert current is not None
    publisher._withdrawn["n1"] = {str(devices[0]["name"])}
    assert len(publisher._content("n1", current, True)[0].devices) == 1
    assert publisher._content("n1", current, False)[0].devices == []
    assert len(computed) == 4


def test_a_patch_response_older_than_a_watched_status_does_not_hide_its_instances() -> None:
    """The race CI hit once: the operator patches a spec; the agent creates the instance and
    writes its status; the watch shows that status before the patch's response is taken in.
    Both bodies carry the same generation (a status write does not bump it); the response is
    the older revision and must not replace the newer body, or the slice never lists the
    instance (no later event would show it again)."""
    publisher = SlicePublisher(cast(Any, None))
    created = node([gpu(0, ("3g.40gb", 4, "Free"))], spec={0: [("3g.40gb", 4)]})
    response = node([], spec={0: [("3g.40gb", 4)]})
    publisher.observe(created.model_copy(update={"metadata": _meta(generation=2, rv="11")}))
    publisher.observe(response.model_copy(update={"metadata": _meta(generation=2, rv="10")}))
    kept = publisher.node("n1")
    assert kept is not None
    assert kept.metadata["resourceVersion"] == "11"
    assert names(kept) == ["gpu-0-3g40gb-4"]
    # and the other way round: a watch event older than a patch already seen is ignored too
    older_spec = node([], spec={0: [("7g.80gb", 0)]})
    publisher.observe(older_spec.model_copy(update={"metadata": _meta(generation=1, rv="9")}))
    assert publisher.node("n1") is kept
    # a newer body replaces it, whatever its generation
    publisher.observe(response.model_copy(update={"metadata": _meta(generation=2, rv="12")}))
    newest = publisher.node("n1")
    assert newest is not None
    assert newest.metadata["resourceVersion"] == "12"


def test_without_revisions_the_generation_orders_mignode_bodies() -> None:
    publisher = SlicePublisher(cast(Any, None))
    first = node([gpu(0, ("1g.10gb", 0, "Free"))])
    publisher.observe(first.model_copy(update={"metadata": {"name": "n1", "generation": 3}}))
    publisher.observe(first.model_copy(update={"metadata": {"name": "n1", "generation": 2}}))
    assert publisher.node("n1") is not None
    assert publisher.node("n1").metadata["generation"] == 3  # type: ignore[union-attr]
    same = first.model_copy(update={"metadata": {"name": "n1", "generation": 3, "x": 1}})
    publisher.observe(same)
    assert publisher.node("n1") is same  # a tie keeps the body seen last


def _meta(*, generation: int, rv: str) -> dict[str, Any]:
    return {"name": "n1", "generation": generation, "resourceVersion": rv}


def test_a_write_response_older_than_a_watched_deletion_does_not_revive_the_slice() -> None:
    """The replace is answered at revision 300; the watch shows the slice deleted at 301
    before the response is taken in. The response must not bring the slice back into the
    view, or the rewrite that the deletion asked for (and every resync) would find the digest
    unchanged and never create it again. A GET answered before the deletion is the same."""
    publisher = SlicePublisher(cast(Any, None))
    view = publisher.view
    view.observe(watched("n1", 4, 290))
    assert view.deleted(watched("n1", 5, 301)) == "n1"
    publisher._wrote("n1", watched("n1", 5, 300))
    assert "n1" not in view._slices
    assert view._floors["n1"] == 5  # the create that follows writes generation 6
    view.keep("n1", SliceState.of(watched("n1", 5, 300)))
    assert "n1" not in view._slices
    # a slice written after the deletion is taken in, and the deletion is forgotten
    publisher._wrote("n1", watched("n1", 6, 310))
    assert view.get("n1").generation == 6  # type: ignore[union-attr]
    assert "n1" not in view._deleted


async def test_a_fenced_publish_sends_nothing() -> None:
    """The fence runs right before the write: when it raises, no request is made (the
    publisher has no client here: one would fail differently)."""
    from migpart.errors import NotLeader

    publisher = SlicePublisher(cast(Any, None))
    n1 = node([gpu(0, ("1g.10gb", 0, "Free"))]).model_copy(update={"metadata": {"name": "n1"}})
    publisher.observe(n1)
    checked: list[str] = []

    def fence() -> None:
        checked.append("n1")
        raise NotLeader("slice n1: not written")

    with pytest.raises(NotLeader):
        await publisher.publish("n1", fence)
    with pytest.raises(NotLeader):
        await publisher.withdraw("n1", ["gpu-0-1g10gb-0"], fence)
    assert checked == ["n1", "n1"]
    # a publish that needs no write does not ask
    publisher.view.observe(watched_with(n1))
    publisher._withdrawn.clear()
    assert not (await publisher.publish("n1", fence)).written
    assert checked == ["n1", "n1"]


# ------------------------------------------------------------ pools of several slices (offer)


def offer_node(*instances: tuple[str, int, str], gpus: int = 4, unusable: bool = False) -> MigNode:
    """MigNode n1 with `gpus` H100s, `instances` on GPU 0; `unusable`: the agent reports it
    cannot make GPU 0's 7g.80gb (its device is tainted)."""
    n = node([gpu(0, *instances), *(gpu(i) for i in range(1, gpus))])
    assert n.status is not None
    failed = [FailedInstance(gpu=0, profile="7g.80gb", start=0, reason="NvmlError")]
    status = n.status.model_copy(update={"failed_instances": failed if unusable else []})
    return n.model_copy(update={"metadata": {"name": "n1"}, "status": status})


async def test_a_pool_of_several_slices_is_written_at_one_generation() -> None:
    store = SliceStore()
    publisher = SlicePublisher(cast(Any, store), slices=offering(every_placement(H100, 4)))
    publisher.observe(offer_node())
    first = await publisher.publish("n1")
    assert first.written
    assert first.generation == 1
    # 4 counter sets in one slice, then 100 placements in slices of 64
    assert store.pool("n1") == {
        slice_name("n1"): (1, 3),
        slice_name("n1", 1): (1, 3),
        slice_name("n1", 2): (1, 3),
    }
    assert len(first.devices) == 100
    # nothing changed: no request at all
    taken = len(store.requests)
    assert not (await publisher.publish("n1")).written
    assert len(store.requests) == taken
    # an instance is made: the pool is stable, nothing is written
    publisher.observe(offer_node(("7g.80gb", 0, "Free")))
    assert not (await publisher.publish("n1")).written
    assert len(store.requests) == taken
    # a placement becomes unusable: every slice is written again, at the next generation
    publisher.observe(offer_node(("7g.80gb", 0, "Free"), unusable=True))
    second = await publisher.publish("n1")
    assert second.written
    assert set(store.pool("n1").values()) == {(2, 3)}
    assert [m for m, _ in store.requests[taken:]] == ["PUT"] * 3


async def test_slices_the_pool_no_longer_has_are_deleted_after_the_others_are_written() -> None:
    store = SliceStore()
    offer = every_placement(H100, 4)
    publisher = SlicePublisher(cast(Any, store), slices=offering(offer))
    publisher.observe(offer_node())
    await publisher.publish("n1")
    taken = len(store.requests)
    offer[:] = offer[:10]  # the planner offers less: one device slice is enough
    publisher.invalidate("n1")
    result = await publisher.publish("n1")
    assert result.generation == 2
    assert store.pool("n1") == {slice_name("n1"): (2, 2), slice_name("n1", 1): (2, 2)}
    assert store.requests[taken:] == [
        ("PUT", slice_name("n1")),
        ("PUT", slice_name("n1", 1)),
        ("DELETE", slice_name("n1", 2)),
    ]
    # its DELETED event is the publisher's own doing: no rewrite asked
    gone = {"metadata": {"name": slice_name("n1", 2), "resourceVersion": "999"}}
    gone["spec"] = {"driver": DRIVER, "nodeName": "n1", "pool": {"generation": 1}}
    assert publisher.view.deleted(gone) is None
    assert publisher.view.floor("n1") == 1


async def test_back_to_reactive_mode_leaves_one_slice() -> None:
    store = SliceStore()
    publisher = SlicePublisher(cast(Any, store), slices=offering(every_placement(H100, 4)))
    publisher.observe(offer_node(("7g.80gb", 0, "Free")))
    await publisher.publish("n1")
    publisher.slices = None
    publisher.invalidate("n1")
    result = await publisher.publish("n1")
    assert result.generation == 2
    assert store.pool("n1") == {slice_name("n1"): (2, 1)}
    assert result.devices == {"gpu-0-7g80gb-0"}
    stored = store.slices[slice_name("n1")]["spec"]
    assert "sharedCounters" not in stored
    assert [d["name"] for d in stored["devices"]] == ["gpu-0-7g80gb-0"]


async def test_an_unavailable_node_keeps_one_empty_slice_of_its_pool() -> None:
    store = SliceStore()
    down: list[str] = []
    publisher = SlicePublisher(
        cast(Any, store),
        slices=offering(every_placement(H100, 4)),
        gate=lambda n: "LeaseExpired" if down else None,
    )
    publisher.observe(offer_node())
    await publisher.publish("n1")
    down.append("n1")
    publisher.invalidate("n1")
    result = await publisher.publish("n1")
    assert result.devices == frozenset()
    assert store.pool("n1") == {slice_name("n1"): (2, 1)}
    assert store.slices[slice_name("n1")]["spec"]["devices"] == []


async def test_a_conflict_in_the_middle_of_a_pool_write_starts_it_over_at_a_new_generation() -> (
    None
):
    store = SliceStore()
    publisher = SlicePublisher(cast(Any, store), slices=offering(every_placement(H100, 4)))
    publisher.observe(offer_node())
    await publisher.publish("n1")
    store.touch(slice_name("n1", 1))  # written by someone else since
    publisher.observe(offer_node(unusable=True))
    result = await publisher.publish("n1")
    assert result.written
    assert publisher.reads == 1
    # generation 2 was half written when the conflict came: all three are at 3 now
    assert set(store.pool("n1").values()) == {(3, 3)}
    assert result.generation == 3


async def test_a_slice_deleted_underneath_is_created_again_in_the_pools_next_generation() -> None:
    store = SliceStore()
    publisher = SlicePublisher(cast(Any, store), slices=offering(every_placement(H100, 4)))
    publisher.observe(offer_node())
    await publisher.publish("n1")
    body = store.slices.pop(slice_name("n1", 2))
    assert publisher.view.deleted(body) == "n1"  # the watch asks a rewrite
    result = await publisher.publish("n1")
    assert result.written
    assert set(store.pool("n1").values()) == {(2, 3)}
