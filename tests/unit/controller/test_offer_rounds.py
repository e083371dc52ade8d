"""Offer mode's relay and rounds: the relay's predicate, a failed placement published tainted
before its claim is failed, rounds that plan only for pods the scheduler found unschedulable,
and the destroy protocol tried against offers: a free instance withdrawn stays listed, tainted,
and one allocated inside the window is still kept."""

from __future__ import annotations

import pytest

from migpart.api.models import (
    MigNode,
)
from migpart.controller.indexes import waiting_entry
from migpart.controller.offer_relay import OfferRelay
from migpart.controller.offers import NodeOffer, Offers
from migpart.dra import INSTANCE_FAILED
from migpart.offer_content import WITHDRAWN_TAINT
from migpart.slice_content import DeviceCache
from migpart.testing.builders import ClaimBuilder, PodBuilder, profile_is
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import (
    allocation,
    claim,
    mignode,
    node_body,
    offered,
)
from tests.unit.controller.harness import RelayCluster, clock_of
from tests.unit.controller.offer_world import (
    EVERY_PROFILE,
    SERVED,
    by_name,
    memory,
    node,
    offering_state,
    run,
    world,
)
from tests.unit.kube.factories import gpu

# ------------------------------------------------------------------ the relay and the offer


async def test_the_relay_tells_when_the_devices_held_on_a_node_change() -> None:
    told: list[str] = []
    world_ = RelayCluster(node_body(5, None))
    relay = OfferRelay(world_.state, changed=told.append)
    first = offered("c1", "gpu-0-3g40gb-4")
    relay.claim_changed("ADDED", first)
    relay.claim_changed("MODIFIED", first)  # the same devices: nothing to compute again
    assert told == ["a"]
    assert relay.held("a") == {"gpu-0-3g40gb-4"}
    relay.claim_changed("DELETED", first)
    assert told == ["a", "a"]
    assert relay.held("a") == frozenset()
    await relay.idle()


async def test_a_failed_placement_is_published_tainted_before_the_claim_is_failed() -> None:
    world_ = RelayCluster(node_body(5, None))
    order: list[str] = []
    offers = Offers(on_change=lambda n: order.append(f"changed {n}"))
    offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
    order.clear()

    async def publish_first(name: str) -> None:
        assert world_.effects.claim_devices == []  # no failure condition written yet
        order.append(f"published {name}")

    relay = OfferRelay(world_.state, offers.offered, offers.touch, publish_first)
    offers.refused = lambda n: relay.refused.get(n, frozenset())
    first, second = offered("c1", "gpu-0-4g40gb-0"), offered("c2", "gpu-0-7g80gb-0")
    relay.claim_changed("MODIFIED", second)
    relay.claim_changed("MODIFIED", first)
    await relay.idle()
    assert relay.refused == {"a": frozenset({"gpu-0-7g80gb-0"})}
    assert "published a" in order
    assert order.index("changed a") < order.index("published a")
    [(key, written)] = world_.effects.claim_devices
    assert key == "ns/c2"
    assert written[0]["conditions"][0]["type"] == INSTANCE_FAILED


async def test_a_claim_allocated_before_its_node_offered_is_relayed_when_it_does() -> None:
    """An operator that starts or takes over lists the claims before its first round says
    which nodes offer: an allocation made while it was down is relayed when the round does,
    with no other event of the claim or the node (its pod waits in PreBind)."""
    body = node_body(5, None)
    world_ = RelayCluster(body)
    state = world_.state
    state.dra, state.offer_publishing = SERVED, True
    state.offers = Offers()
    state.relay = relay = OfferRelay(state, state.offers.offered)
    relay.claims_listed([offered("c1", "gpu-0-3g40gb-4")])
    await relay.idle()
    assert world_.effects.specs == []  # no node offers yet
    await run(state, world({"a": body}, allocation="Offer"))
    await relay.idle()
    assert world_.wanted() == [("3g.40gb", 4)]
    await run(state, world({"a": body}, allocation="Offer"))  # the offer did not change
    await relay.idle()
    assert len(world_.effects.specs) == 1


async def test_the_relay_leaves_a_node_that_does_not_offer_alone() -> None:
    world_ = RelayCluster(node_body(5, None))
    offers = Offers()
    relay = OfferRelay(world_.state, offers.offered)
    relay.claim_changed("MODIFIED", offered("c1", "gpu-0-3g40gb-4"))
    await relay.idle()
    assert world_.effects.specs == []
    assert world_.effects.claim_devices == []


# ------------------------------------------------------------------ the destroy protocol


def test_a_withdrawn_free_instance_stays_listed_tainted_and_nothing_is_offered_over_it() -> None:
    n = node(gpu(0, ("7g.80gb", 0, "Free")), gpu(1))
    withdrawn = frozenset({"gpu-0-7g80gb-0"})
    offers = Offers()
    offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
    listed = by_name(offers.slices(n, withdrawn, True, DeviceCache()))
    leaving = listed["gpu-0-7g80gb-0"]
    assert leaving["taints"] == [WITHDRAWN_TAINT]  # not allocatable, its counters count
    gone = memory(leaving)
    assert not [d for name, d in listed.items() if name not in withdrawn and memory(d) & gone]


async def test_in_offer_mode_an_instance_allocated_inside_the_window_is_kept() -> None:
    nodes = {"a": mignode("a", 1, gpus=[gpu(0, ("7g.80gb", 0, "Free"))])}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = offering_state(effects)

    async def scheduler_wins(node: str, devices: frozenset[str]) -> None:
        # what was withdrawn is tainted, not gone, in offer mode: allocate it anyway
        listed = by_name(
            state.offers.slices(MigNode.model_validate(nodes["a"]), devices, True, DeviceCache())
        )
        assert listed["gpu-0-7g80gb-0"]["taints"] == [WITHDRAWN_TAINT]
        effects.claims.append(allocation("racer", node, "gpu-0-7g80gb-0"))

    effects.on_withdraw = scheduler_wins
    await run(state, world(nodes, [claim("c1", "3g.40gb")], allocation="Offer"))
    assert state.offers.offered("a")
    assert effects.restores == [("a", frozenset({"gpu-0-7g80gb-0"}))]
    assert "DestroyAborted" in [e.reason for e in effects.events]
    for _, spec in effects.specs:  # whatever was planned again keeps the device
        assert "7g.80gb" in [i.profile for i in spec.gpus[0].instances]
    assert clock_of(state).slept_s >= state.withdraw_grace_s


async def test_in_offer_mode_a_held_instance_is_never_planned_away() -> None:
    held = ClaimBuilder("holder", "ns").uid("uid-holder").request(profile_is("7g.80gb"))
    holder = held.allocated("a", "gpu-0-7g80gb-0").obj()
    nodes = {"a": mignode("a", 1, gpus=[gpu(0, ("7g.80gb", 0, "Free"))])}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = offering_state(effects)
    await run(state, world(nodes, [holder, claim("c1", "3g.40gb")], allocation="Offer"))
    assert effects.withdrawals == []
    for _, spec in effects.specs:
        assert "7g.80gb" in [i.profile for i in spec.gpus[0].instances]


# ------------------------------------------------------------------ rounds in offer mode


@pytest.mark.parametrize("allocation_", ["Offer", "Reactive"])
async def test_an_offering_policy_plans_only_for_pods_the_scheduler_found_unschedulable(
    allocation_: str,
) -> None:
    nodes = {"a": mignode("a", 1, gpus=[gpu(0)])}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = offering_state(effects)
    pending = [claim("c1", "3g.40gb")]
    await run(state, world(nodes, pending, unschedulable=False, allocation=allocation_))
    if allocation_ == "Offer":
        assert effects.specs == []  # the scheduler takes it from the offer: no round
        assert [e.reason for e in effects.events] == []
    else:
        assert [e.reason for e in effects.events] == ["Repartitioning"]
    clock_of(state).advance(60)  # past the pacing of the first round
    await run(state, world(nodes, pending, generation=2, allocation=allocation_))
    assert [e.reason for e in effects.events] == ["Repartitioning"]  # found unschedulable


def test_the_waiting_index_tells_which_pods_the_scheduler_found_unschedulable() -> None:
    waiting = PodBuilder("p", "ns").claim("c1")
    [(key, fresh)] = (waiting_entry(waiting.obj()) or {}).items()
    assert key == "ns/c1"
    assert "unschedulable" not in fresh  # as before: a reactive cluster's entries are unchanged
    [tried] = (waiting_entry(waiting.unschedulable().obj()) or {}).values()
    assert tried["unschedulable"] is True
