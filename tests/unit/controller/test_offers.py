"""Offer mode's wiring (controller/offers.py): which nodes publish offers, what their pools list,
when they are computed again, the relay's predicate, and that without `--offer-publishing`
everything is as before. The destroy protocol is tried against it: a free instance withdrawn
stays listed, tainted, and one allocated inside the window is still kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from migpart.api.models import FailedInstance, MigNode
from migpart.controller.effects import InMemoryEffects
from migpart.controller.handlers import _wire_offers
from migpart.controller.indexes import waiting_entry
from migpart.controller.mignodes import MigNodeWatch
from migpart.controller.offer_relay import OfferRelay
from migpart.controller.offers import NodeOffer, Offers, offer_pool
from migpart.controller.reconcile import PolicyRound
from migpart.controller.scope import Cluster
from migpart.controller.state import OperatorState
from migpart.dra import DRIVER, INSTANCE_FAILED, INSTANCE_READY
from migpart.kube.features import DraFeatures
from migpart.kube.placement import NodeFacts
from migpart.kube.slice_publisher import SlicePublisher
from migpart.offer_content import FAILED_TAINT, WITHDRAWN_TAINT
from migpart.planning.model import PolicyView
from migpart.slice_content import DeviceCache, SliceContent, node_slices
from migpart.testing.builders import ClaimBuilder, PodBuilder, profile_is
from tests.unit.controller.factories import (
    DEVICE_CLASS,
    claim,
    mignode,
    offline_state,
    placement,
    policy,
)
from tests.unit.controller.test_offer_relay import Cluster as RelayCluster
from tests.unit.controller.test_offer_relay import node_body, offered
from tests.unit.controller.test_round import allocation, clock_of
from tests.unit.kube.factories import gpu

SERVED = DraFeatures(True, True, "served: partitionable devices, binding conditions")
NONE = DraFeatures(False, False, "not served: partitionable devices, binding conditions")
EVERY_PROFILE = PolicyView(allowed=None)


def node(*gpus: Any, failed: list[FailedInstance] | None = None) -> MigNode:
    body = mignode("a", 1, gpus=list(gpus) or [gpu(0), gpu(1)])
    if failed:
        body["status"]["failedInstances"] = [f.model_dump(by_alias=True) for f in failed]
    return MigNode.model_validate(body)


def devices(pool: list[SliceContent]) -> list[dict[str, Any]]:
    return [d for s in pool for d in s.devices]


def by_name(pool: list[SliceContent]) -> dict[str, dict[str, Any]]:
    return {str(d["name"]): d for d in devices(pool)}


def memory(device: dict[str, Any]) -> set[tuple[str, str]]:
    """(counter set, memory slice) a device consumes."""
    return {
        (c["counterSet"], name)
        for c in device.get("consumesCounters") or []
        for name in c["counters"]
        if name.startswith("memory-slice-")
    }


def world(
    nodes: dict[str, dict[str, Any]],
    claims: Sequence[dict[str, Any]] = (),
    *,
    generation: int = 1,
    unschedulable: bool = True,
    **spec: Any,
) -> Cluster:
    """Node pool `a`, policy `pa` with `spec`, each claim used by a waiting pod that the
    scheduler found `unschedulable` (or has not)."""
    labels = {name: {"pool": "a"} for name in nodes}
    waits = {**placement(), "unschedulable": True} if unschedulable else placement()
    spec.setdefault("reconfiguration", {"batchWindowSeconds": 0})
    return Cluster(
        mignodes=nodes,
        node_labels=labels,
        policies={"pa": policy("pa", "a", generation, **spec)},
        claims={f"ns/{c['metadata']['name']}": c for c in claims},
        waiting={f"ns/{c['metadata']['name']}": (waits,) for c in claims},
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={name: NodeFacts(v, ()) for name, v in labels.items()},
    )


def offering_state(effects: InMemoryEffects, publishing: bool = True) -> OperatorState:
    state = offline_state(effects)
    state.dra = SERVED
    state.offer_publishing = publishing
    return state


async def run(state: OperatorState, cluster: Cluster) -> None:
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()


# ------------------------------------------------------------------ which nodes offer


@pytest.mark.parametrize(
    ("publishing", "features", "spec", "offers"),
    [
        (True, SERVED, {"allocation": "Offer"}, True),
        (True, SERVED, {}, True),  # Auto
        (True, SERVED, {"allocation": "Reactive"}, False),
        (True, SERVED, {"allocation": "Offer", "mode": "DryRun"}, False),
        (True, NONE, {"allocation": "Offer"}, False),
        (True, NONE, {}, False),
        (False, SERVED, {"allocation": "Offer"}, False),
        (False, SERVED, {}, False),
    ],
)
async def test_a_round_makes_its_nodes_offer_only_in_offer_mode_with_the_flag(
    publishing: bool, features: DraFeatures, spec: dict[str, Any], offers: bool
) -> None:
    nodes = {"a": mignode("a", 1), "b": mignode("b", 1)}
    state = offering_state(InMemoryEffects(mignodes=dict(nodes)), publishing)
    state.dra = features
    told: list[str] = []
    state.offers = Offers(on_change=told.append)
    await run(state, world(nodes, **spec))
    assert [state.offers.offered(n) for n in ("a", "b")] == [offers, offers]
    assert told == (["a", "b"] if offers else [])


async def test_an_offer_changes_only_when_the_policy_or_its_scope_does() -> None:
    nodes = {"a": mignode("a", 1)}
    state = offering_state(InMemoryEffects(mignodes=dict(nodes)))
    told: list[str] = []
    state.offers = Offers(on_change=told.append)
    await run(state, world(nodes, allocation="Offer"))
    await run(state, world(nodes, allocation="Offer"))  # nothing changed: nothing told
    assert told == ["a"]
    await run(state, world(nodes, generation=2, allocation="Offer", profiles={"deny": ["7g.80gb"]}))
    assert told == ["a", "a"]
    known = state.offers.of("a")
    assert known is not None
    assert not known.view.permits("7g.80gb")
    await run(state, world(nodes, generation=3, allocation="Reactive"))
    assert told == ["a", "a", "a"]
    assert not state.offers.offered("a")


def test_a_node_leaving_the_scope_or_a_deleted_policy_publishes_reactively_again() -> None:
    told: list[str] = []
    offers = Offers(on_change=told.append)
    offer = NodeOffer("pa", EVERY_PROFILE)
    assert offers.assign("pa", ["a", "b"], offer) == ["a", "b"]
    assert offers.assign("pa", ["a"], offer) == ["b"]
    assert offers.assign("pb", ["c"], NodeOffer("pb", EVERY_PROFILE)) == ["c"]
    assert offers.drop("pa") == ["a"]
    assert [offers.offered(n) for n in "abc"] == [False, False, True]
    assert told == ["a", "b", "b", "c", "a"]


class Publishes:
    """The MigNode watch's `publish`, recorded."""

    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, name: str) -> None:
        self.published.append(name)


def test_the_wiring_without_the_flag_keeps_reactive_slices_and_an_idle_relay() -> None:
    for publishing in (False, True):
        state = offline_state(InMemoryEffects(), SlicePublisher(api=None))  # type: ignore[arg-type]
        watch = Publishes()
        relay = _wire_offers(state, publishing, cast("MigNodeWatch", watch))
        assert state.relay is relay
        assert state.offer_publishing == publishing
        if publishing:
            assert state.publisher.slices == state.offers.slices
        else:
            assert state.publisher.slices is None  # node_slices, as before
        assert not relay.offered("a")
        state.offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
        assert relay.offered("a")  # the relay's predicate: the node's policy offers
        assert watch.published == ["a"]  # computed again and published


def test_a_node_that_does_not_offer_gets_exactly_the_reactive_slice() -> None:
    n = node(gpu(0, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Prepared")), gpu(1))
    offers = Offers()
    offers.assign("pa", ["b"], NodeOffer("pa", EVERY_PROFILE))
    for withdrawn in (frozenset(), frozenset({"gpu-0-3g40gb-0"})):
        for available in (True, False):
            got = offers.slices(n, withdrawn, available, DeviceCache())
            assert got == node_slices(n, withdrawn, available, DeviceCache())


# ------------------------------------------------------------------ what an offering node lists


def test_an_offering_node_lists_its_offer_with_binding_conditions_on_placements() -> None:
    n = node(gpu(0, ("3g.40gb", 4, "Prepared")), gpu(1))
    deny = PolicyView(allowed=None, denied=frozenset({"7g.80gb"}))
    pool = offer_pool(n, deny, frozenset(), True, frozenset(), frozenset())
    assert pool[0].counter_sets
    assert not pool[0].devices
    listed = by_name(pool)
    names = list(listed)
    # beside the instance in use first (best fit), then the empty GPU; no denied profile
    assert names[0].startswith("gpu-0-")
    assert not [n for n in names if "7g80gb" in n]
    created = listed["gpu-0-3g40gb-4"]
    assert "bindingConditions" not in created
    assert "bindsToNode" not in created
    placement = listed["gpu-1-3g40gb-0"]
    assert placement["bindingConditions"] == [INSTANCE_READY]
    assert placement["bindingFailureConditions"] == [INSTANCE_FAILED]
    assert placement["bindsToNode"] is True
    # nothing offered over the instance in use
    used = memory(created)
    assert not [d for name, d in listed.items() if name != "gpu-0-3g40gb-4" and memory(d) & used]


def test_a_placement_a_claim_holds_is_listed_and_nothing_is_offered_over_it() -> None:
    n = node(gpu(0), gpu(1))
    held = frozenset({"gpu-1-3g40gb-4"})
    listed = by_name(offer_pool(n, EVERY_PROFILE, frozenset(), True, held, frozenset()))
    taken = memory(listed["gpu-1-3g40gb-4"])
    assert not [d for name, d in listed.items() if name not in held and memory(d) & taken]
    assert "gpu-0-7g80gb-0" in listed  # the other GPU is offered whole


def test_a_failed_placement_is_never_offered_and_tainted_while_a_claim_holds_it() -> None:
    failure = FailedInstance(gpu=1, profile="7g.80gb", start=0, reason="NvmlError", message="x")
    n = node(gpu(0), gpu(1), failed=[failure])
    free = by_name(offer_pool(n, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset()))
    assert "gpu-1-7g80gb-0" not in free
    assert "gpu-0-7g80gb-0" in free
    held = frozenset({"gpu-1-7g80gb-0"})
    listed = by_name(offer_pool(n, EVERY_PROFILE, frozenset(), True, held, frozenset()))
    assert listed["gpu-1-7g80gb-0"]["taints"] == [FAILED_TAINT]
    # a placement the relay refused: the same, while held; forgotten once no claim holds it
    refused = frozenset({"gpu-0-7g80gb-0"})
    both = held | refused
    listed = by_name(offer_pool(n, EVERY_PROFILE, frozenset(), True, both, refused))
    assert listed["gpu-0-7g80gb-0"]["taints"] == [FAILED_TAINT]
    listed = by_name(offer_pool(n, EVERY_PROFILE, frozenset(), True, frozenset(), refused))
    assert "taints" not in listed["gpu-0-7g80gb-0"]


def test_a_placement_backing_off_is_not_offered_and_tainted_while_a_claim_holds_it() -> None:
    """The relay dropped gpu-1-7g80gb-0 from the spec (its create failed, no claim held it):
    the agent no longer reports it failed, and the GPU is empty, but it is not offered until
    its back-off ends."""
    n = node(gpu(0), gpu(1))
    cooling = frozenset({"gpu-1-7g80gb-0"})
    offers = Offers(backing_off=lambda name: cooling)
    offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
    free = by_name(offers.slices(n, frozenset(), True, DeviceCache()))
    assert "gpu-1-7g80gb-0" not in free
    assert "gpu-0-7g80gb-0" in free
    held = by_name(
        offer_pool(n, EVERY_PROFILE, frozenset(), True, cooling, frozenset(), None, cooling)
    )
    assert held["gpu-1-7g80gb-0"]["taints"] == [FAILED_TAINT]
    # once it ended: offered again
    again = by_name(offer_pool(n, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset()))
    assert "gpu-1-7g80gb-0" in again


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
