"""controller.watching.mignodes.MigNodeWatch: the MigNode index, and one slice write per node at
a time, only once the slice watch has listed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from migpart.api.models import MigNode
from migpart.controller.watching.mignodes import MigNodeWatch
from migpart.kube.slice_publisher import Published
from tests.unit.controller.factories import mignode, offline_state


class Publisher:
    """Records what the watch asks of the slice publisher; `gate` holds writes back."""

    def __init__(self) -> None:
        self.published: list[str] = []
        self.forgotten: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    def observe(self, node: MigNode) -> None:
        pass

    async def publish(self, name: str) -> Published:
        await self.gate.wait()
        self.published.append(name)
        return Published(name, len(self.published), True, frozenset(), None)

    def forget(self, name: str) -> None:
        self.forgotten.append(name)

    term = None  # as the effects port: no election

    def leading(self) -> bool:  # as the effects port: this operator leads
        return True


def watch() -> tuple[MigNodeWatch, Publisher, asyncio.Event]:
    publisher = Publisher()
    # the recorder stands in for the publisher and for the write port that publishes through it
    fake = cast(Any, publisher)
    state = offline_state(fake, publisher=fake)
    listed = asyncio.Event()
    return MigNodeWatch(state, listed), publisher, listed


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_no_slice_is_written_before_the_slice_watch_listed() -> None:
    w, publisher, listed = watch()
    w.listed([mignode("a", 1, gpus=[])])
    assert list(w) == ["a"]
    await settle()
    assert publisher.published == []
    listed.set()
    await settle()
    assert publisher.published == ["a"]


async def test_with_offer_publishing_nothing_is_written_before_the_take_over() -> None:
    """A new leader's MigNode events publish nothing until its take-over has said which nodes
    offer (`OperatorState.publishing`): before, an offering node's pool would be computed as
    reactive mode's slice. The take-over then publishes every node itself."""
    w, publisher, listed = watch()
    w.state.offer.publishing = True
    listed.set()
    w.changed("ADDED", mignode("a", 1, gpus=[]))
    await settle()
    assert publisher.published == []
    w.state.offer.known = True  # as the take-over sets it
    w.changed("MODIFIED", mignode("a", 2, gpus=[]))
    await settle()
    assert publisher.published == ["a"]


async def test_events_during_a_write_give_one_more_write_not_one_each() -> None:
    w, publisher, listed = watch()
    listed.set()
    publisher.gate.clear()
    w.changed("ADDED", mignode("a", 1, gpus=[]))
    await settle()
    for revision in (2, 3, 4):
        w.changed("MODIFIED", mignode("a", revision, gpus=[]))
    publisher.gate.set()
    await settle()
    assert publisher.published == ["a", "a"]


async def test_a_deleted_node_is_forgotten_and_not_written() -> None:
    w, publisher, listed = watch()
    w.listed([mignode("a", 1, gpus=[]), mignode("b", 1, gpus=[])])
    w.changed("DELETED", mignode("a", 2, gpus=[]))
    w.listed([])  # b went while the watch was down
    listed.set()
    await settle()
    assert publisher.forgotten == ["a", "b"]
    assert publisher.published == []
    assert list(w) == []


async def test_a_deleted_slice_is_written_again_through_the_nodes_one_write_task() -> None:
    """The slice watch hands a deleted slice to the MigNode watch: a write for the node already
    in flight then gives exactly one more, as for any MigNode event."""
    from migpart.kube.slice_publisher import SlicePublisher
    from migpart.kube.slice_watch import SliceWatch
    from migpart.slices.content import slice_name
    from migpart.slices.dra import DRIVER

    w, publisher, listed = watch()
    real = SlicePublisher(api=cast(Any, None))
    real.observe(MigNode.model_validate(mignode("a", 1, gpus=[])))
    slices = SliceWatch(real, listed, w.publish)
    body = {
        "metadata": {"name": slice_name("a"), "resourceVersion": "5"},
        "spec": {"driver": DRIVER, "nodeName": "a", "pool": {"name": "a", "generation": 3}},
    }
    slices.listed([body])
    assert listed.is_set()
    publisher.gate.clear()
    w.changed("ADDED", mignode("a", 1, gpus=[]))
    await settle()
    slices.changed("DELETED", body)
    slices.changed("DELETED", {**body, "spec": {**body["spec"], "nodeName": "unknown"}})
    publisher.gate.set()
    await settle()
    assert publisher.published == ["a", "a"]


async def test_a_slice_deleted_while_the_watch_was_down_is_written_again_at_the_relist() -> None:
    """No DELETED event comes for a slice deleted during a watch outage: the relist that
    follows does not hold it, the publisher forgets it and the node's write task writes it
    again (before, the view kept it, and every resync found its digest unchanged)."""
    from migpart.kube.slice_publisher import SlicePublisher
    from migpart.kube.slice_watch import SliceWatch
    from migpart.slices.content import slice_name
    from migpart.slices.dra import DRIVER

    w, publisher, listed = watch()
    real = SlicePublisher(api=cast(Any, None))
    real.observe(MigNode.model_validate(mignode("a", 1, gpus=[])))

    def body(node: str) -> dict[str, Any]:
        return {
            "metadata": {"name": slice_name(node), "resourceVersion": "5"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 3}},
        }

    slices = SliceWatch(real, listed, w.publish)
    slices.listed([body("a"), body("b")])  # b: a slice whose MigNode is not known (yet)
    w.changed("ADDED", mignode("a", 1, gpus=[]))
    await settle()
    publisher.published.clear()
    slices.broken()
    slices.listed([])
    await settle()
    assert publisher.published == ["a"]  # b has no MigNode: nothing to write for it
    assert "a" not in real.view._slices
    assert "b" not in real.view._slices
    assert real.view._floors == {"a": 3, "b": 3}  # a new slice continues the generations
