"""Offer mode's wiring (controller/offers.py): which nodes publish offers, what their pools list,
when they are computed again, the relay's predicate, and that without `--offer-publishing`
everything is as before. The destroy protocol is tried against it: a free instance withdrawn
stays listed, tainted, and one allocated inside the window is still kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.api.models import (
    FailedInstance,
    GpuSpec,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.clock import ManualClock
from migpart.controller import handlers
from migpart.controller.handlers import _wire_offers
from migpart.controller.indexes import waiting_entry
from migpart.controller.mignodes import MigNodeWatch
from migpart.controller.offer_relay import OfferRelay
from migpart.controller.offers import NodeOffer, Offers, offer_pool, planned_overlaps
from migpart.controller.reconcile import PolicyRound
from migpart.controller.relay import placements, relay
from migpart.controller.scope import Cluster
from migpart.controller.state import OperatorState
from migpart.dra import DRIVER, INSTANCE_FAILED, INSTANCE_READY
from migpart.kube.election import LeaderElector
from migpart.kube.features import DraFeatures
from migpart.kube.placement import NodeFacts
from migpart.kube.slice_publisher import STEERING_DELAY_S, Published, SlicePublisher
from migpart.mig import CATALOG, Instance, addable_placements, layout_problems
from migpart.offer_content import FAILED_TAINT, WITHDRAWN_TAINT, scheduler_needs
from migpart.planning.model import PolicyView
from migpart.planning.offer import DEFAULT_DEPTH
from migpart.slice_content import DeviceCache, SliceContent, node_slices
from migpart.testing.builders import H100, ClaimBuilder, PodBuilder, profile_is
from migpart.testing.effects import InMemoryEffects
from migpart.testing.leases import InMemoryLeaseStore
from tests.unit.controller.factories import (
    DEVICE_CLASS,
    allocation,
    claim,
    mignode,
    node_body,
    offered,
    offline_state,
    placement,
    policy,
)
from tests.unit.controller.harness import RelayCluster, clock_of, indexed
from tests.unit.kube.factories import gpu
from tests.unit.kube.slice_store import SliceStore
from tests.unit.planning.strategies import layouts

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
            assert state.publisher.needs == state.offers.needs
        else:
            assert state.publisher.slices is None  # node_slices, as before
            assert state.publisher.needs is None  # every change written at once
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
    placement = next(d for name, d in listed.items() if name.startswith("gpu-1-3g40gb-"))
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


# ------------------------------------------------------------------ taking over


@dataclass
class Pools(InMemoryEffects):
    """The twin, recording with each slice publish whether `offers` made the node's pool
    offer mode's at that moment (`Offers.slices`), or reactive mode's slice."""

    offers: Offers = field(default_factory=Offers)
    pools: list[tuple[str, bool]] = field(default_factory=list)

    async def publish(self, node: str) -> Published:
        self.pools.append((node, self.offers.offered(node)))
        return await super().publish(node)


@pytest.mark.parametrize(("features", "offers"), [(SERVED, True), (NONE, False)])
async def test_a_new_leader_publishes_an_offering_node_as_offering_from_its_first_write(
    features: DraFeatures, offers: bool
) -> None:
    """A standby runs no round, so its `Offers` knew no offering node: taking over, it wrote
    reactive mode's slice over each offering node's pool (every offered placement gone while
    kube-scheduler may be allocating one), and the offer pool again after its first round.
    The take-over now says which nodes offer, from its synced indexes, before it publishes.
    Node `b` is in no policy's scope: reactive either way; where offers are not served (1.34),
    `a` is reactive too."""
    nodes = {"a": mignode("a", 5), "b": mignode("b", 5)}
    cluster = world(nodes)  # policy `pa`, Auto, over the nodes labelled pool=a
    labels = {"a": {"pool": "a"}, "b": {"pool": "b"}}
    facts = {name: NodeFacts(v, ()) for name, v in labels.items()}
    cluster = replace(cluster, node_labels=labels, node_facts=facts)
    elector = LeaderElector(InMemoryLeaseStore(), "standby", clock=lambda: 0.0)
    effects = Pools(mignodes=dict(nodes), leadership=elector)  # no term: a standby
    publisher = SlicePublisher(cast(Any, None))
    state = indexed(offline_state(effects, publisher), cluster)
    state.dra = features
    _wire_offers(state, True, cast("MigNodeWatch", Publishes()))
    effects.offers = state.offers
    for body in nodes.values():
        publisher.observe(MigNode.model_validate(body))
    assert await elector.try_acquire_or_renew()
    handlers.lead(state, elector.current())
    [take_over] = [t for t in state.tasks if t.get_name() == "take-over"]
    await take_over
    assert effects.pools == [("a", offers), ("b", False)]
    assert state.offers.offered("a") == offers  # as the first round will say


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


# ------------------------------------------------------------------ what the scheduler needs now


def test_a_change_the_scheduler_can_act_on_is_needed_at_once() -> None:
    """`scheduler_needs`: what a pool write must not wait for. Placement `gpu-1-3g40gb-4` is
    held by a claim throughout unless said otherwise."""
    held = frozenset({"gpu-1-3g40gb-4"})
    empty = node(gpu(0), gpu(1))
    pool = offer_pool(empty, EVERY_PROFILE, frozenset(), True, held, frozenset())

    def needs(after: list[SliceContent], allocated: frozenset[str] = held) -> bool:
        return scheduler_needs(pool, after, allocated)

    assert not needs(pool)
    # a free instance made by a round: it may be allocated (and its counters must count)
    made = node(gpu(0, ("1g.10gb", 6, "Free")), gpu(1))
    assert needs(offer_pool(made, EVERY_PROFILE, frozenset(), True, held, frozenset()))
    # a profile no longer permitted: its placements must not be allocated
    deny = PolicyView(allowed=None, denied=frozenset({"1g.10gb"}))
    assert needs(offer_pool(empty, deny, frozenset(), True, held, frozenset()))
    # the held placement failed: tainted before its claim is failed
    failure = FailedInstance(gpu=1, profile="3g.40gb", start=4, reason="NvmlError", message="x")
    failed = node(gpu(0), gpu(1), failed=[failure])
    assert needs(offer_pool(failed, EVERY_PROFILE, frozenset(), True, held, frozenset()))
    # its claim let go: the placement, still listed, may be allocated again; which
    # placements of its profile are offered beside it is steering, and may wait
    released = offer_pool(empty, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset())
    assert not needs(released, frozenset())
    # a withdrawn free instance: tainted before the destroy protocol goes on
    free = node(gpu(0, ("7g.80gb", 0, "Free")), gpu(1))
    before = offer_pool(free, EVERY_PROFILE, frozenset(), True, held, frozenset())
    withdrawn = frozenset({"gpu-0-7g80gb-0"})
    after = offer_pool(free, EVERY_PROFILE, withdrawn, True, held, frozenset())
    assert scheduler_needs(before, after, held)


def test_which_placements_are_offered_may_wait_while_their_profile_is_offered() -> None:
    """The offer's depth: a claim takes a placement, and the next of its profile joins the
    offer; the scheduler can still take the others of that profile meanwhile, so the write may
    wait. A placement whose creation failed must leave at once; so must a profile's last."""
    empty = node(gpu(0), gpu(1))

    def pool(held: frozenset[str] = frozenset(), failed: frozenset[str] = frozenset()) -> Any:
        return offer_pool(
            empty, EVERY_PROFILE, frozenset(), True, held, frozenset(), None, failed, depth=2
        )

    before = pool()
    small = [n for n in by_name(before) if "-1g10gb-" in n]
    assert len(small) == 2
    taken = frozenset(small[:1])
    after = pool(taken)
    joined = [n for n in by_name(after) if "-1g10gb-" in n and n not in by_name(before)]
    assert joined  # the next 1g.10gb placement is offered
    assert not scheduler_needs(before, after, taken)
    # the other offered one failed (the relay backs off from it): leaving the offer, it must
    # not be allocated again
    failed = frozenset(small[1:])
    without = pool(failed=failed)
    assert small[1] not in by_name(without)
    assert scheduler_needs(before, without, frozenset(), unusable=failed)
    assert not scheduler_needs(before, without, frozenset())  # a mere re-steer may wait
    # a profile's last placement leaving the offer (not permitted now) may not wait
    deny = PolicyView(allowed=None, denied=frozenset({"1g.10gb"}))
    denied = offer_pool(empty, deny, frozenset(), True, frozenset(), frozenset(), depth=2)
    assert scheduler_needs(before, denied, frozenset())
    assert scheduler_needs(denied, before, frozenset())  # nor a profile joining it


def test_a_placement_a_planned_instance_overlaps_leaves_the_offer_at_once() -> None:
    """A round planned a 3g.40gb at 4 on GPU 0 (the spec wants it, the agent has not made it):
    the placements over it leave the offer. Their profiles are still offered elsewhere, so as
    a re-steer it could wait; over an instance on its way, it may not."""
    offers = Offers()
    offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
    plain = node(gpu(0), gpu(1))
    wanted = [MigInstanceSpec(profile="3g.40gb", start=4)]
    spec = MigNodeSpec(plan_id="p1", gpus=[GpuSpec(index=0, instances=wanted)])
    planned = plain.model_copy(update={"spec": spec})
    before = offers.slices(plain, frozenset(), True, DeviceCache())
    after = offers.slices(planned, frozenset(), True, DeviceCache())
    gone = set(by_name(before)) - set(by_name(after))
    assert gone
    assert gone <= planned_overlaps(planned)
    assert not scheduler_needs(before, after, frozenset())  # a re-steer alone may wait
    assert offers.needs("a", before, after)
    assert planned_overlaps(plain) == frozenset()


def test_a_free_instance_let_go_must_not_wait_behind_the_placements() -> None:
    """Allocated, a free instance moves behind the offer (the scheduler cannot take it twice:
    that may wait); let go, it must come first again at once, or first fit gives its next pod
    a new placement instead."""
    n = node(gpu(0, ("3g.40gb", 4, "Free")), gpu(1))
    taken = frozenset({"gpu-0-3g40gb-4"})
    offered_ = offer_pool(n, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset())
    held = offer_pool(n, EVERY_PROFILE, frozenset(), True, taken, frozenset())
    assert next(iter(by_name(offered_))) == "gpu-0-3g40gb-4"
    assert list(by_name(held))[-1] == "gpu-0-3g40gb-4"
    assert not scheduler_needs(offered_, held, taken)
    assert scheduler_needs(held, offered_, frozenset())


# ------------------------------------------------------------------ pool writes per allocation

GPUS = 8  # a full node: 8 H100s; the default offer is 19 devices, in 2 slices with the counters


def full_node(
    revision: int, *instances: tuple[str, int, str], spec: MigNodeSpec | None = None
) -> MigNode:
    """MigNode `a`: 8 H100s, `instances` on GPU 0 (profile, start, state)."""
    gpus = [gpu(0, *instances), *(gpu(i) for i in range(1, GPUS))]
    return MigNode(
        metadata={"name": "a", "resourceVersion": str(revision)},
        spec=spec,
        status=MigNodeStatus(gpus=gpus),
    )


class NodeSlices:
    """Node `a` offering under policy `pa` through the slice publisher on the in-memory slice
    store, with `needs` (`holding_back`) or without it (every change written at once, as
    before), and the devices claims hold there (`held`, what the relay tells)."""

    def __init__(self, body: MigNode, holding_back: bool, depth: int = DEFAULT_DEPTH) -> None:
        self.store = SliceStore()
        self.held: set[str] = set()
        self.offers = Offers(held=lambda node: frozenset(self.held), depth=depth)
        self.offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
        self.clock = ManualClock()
        self.publisher = SlicePublisher(
            cast(Any, self.store),
            slices=self.offers.slices,
            needs=self.offers.needs if holding_back else None,
            clock=self.clock,
        )
        self.node = body
        self.publisher.observe(body)

    async def start(self) -> int:
        """The node's first pool; returns how many slices it has."""
        assert (await self.publisher.publish("a")).written
        self.store.requests.clear()
        return len(self.store.pool("a"))

    def stored(self) -> list[dict[str, Any]]:
        """The devices of the stored pool, in the order kube-scheduler tries them."""
        return [
            d
            for _, body in sorted(self.store.slices.items())
            for d in body["spec"].get("devices", [])
        ]

    def first_fit(self, profile: str) -> str:
        """The device a claim for `profile` gets on a pool no claim holds anything of yet:
        the first of that profile in the stored order."""
        return next(
            str(d["name"]) for d in self.stored() if d["attributes"]["profile"]["string"] == profile
        )

    async def publish(self, body: MigNode | None = None, compute: bool = False) -> tuple[int, int]:
        """Publish as the operator does after an event: a MigNode event (`body`), the held
        devices changed (`compute`: the relay's `changed`), or neither (the publish the MigNode
        watch makes once a held-back change may wait no longer). Returns (pools written,
        slice requests: created, replaced and deleted). Every held device stays listed in the
        stored pool."""
        taken = len(self.store.requests)
        if body is not None:
            self.node = body
            self.publisher.observe(body)
        if compute:
            self.publisher.invalidate("a")
        result = await self.publisher.publish("a")
        writes = [m for m, _ in self.store.requests[taken:] if m != "GET"]
        assert self.held <= {str(d["name"]) for d in self.stored()}
        return int(result.written), len(writes)


async def new_placement_allocated(
    holding_back: bool, depth: int = DEFAULT_DEPTH
) -> tuple[int, list[tuple[int, int]], Any]:
    """One claim for a 3g.40gb on a node with 8 empty H100s, from allocation to instance
    created, then the steering delay, then the claim let go: the pool's slice count, (pools,
    slices) written at each step, and the stored pool at the end."""
    world = NodeSlices(full_node(1), holding_back, depth)
    size = await world.start()
    device = world.first_fit("3g.40gb")
    where = placements(world.node)[device]
    assert where.gpu == 0
    steps: list[tuple[int, int]] = []
    world.held.add(device)  # kube-scheduler allocated the placement: the relay tells
    steps.append(await world.publish(compute=True))
    decision = relay(world.node, [("ns/c1", device)])  # the relay writes it into the spec
    assert decision.spec is not None
    steps.append(await world.publish(full_node(2, spec=decision.spec)))
    created = (where.instance.profile, where.instance.start, "Free")  # the agent created it
    steps.append(await world.publish(full_node(3, created, spec=decision.spec)))
    # the relay writes instance-ready into the claim: the devices held do not change
    world.clock.advance(STEERING_DELAY_S)
    steps.append(await world.publish())
    world.held.clear()  # the claim let go of it
    steps.append(await world.publish(compute=True))
    return size, steps, world.stored()


async def free_instance_allocated(holding_back: bool) -> tuple[int, list[tuple[int, int]], Any]:
    """The same for a free 3g.40gb instance on GPU 0: allocation, prepared by kubelet (the
    agent's status says so), the steering delay."""
    world = NodeSlices(full_node(1, ("3g.40gb", 4, "Free")), holding_back)
    size = await world.start()
    device = world.first_fit("3g.40gb")
    assert device == "gpu-0-3g40gb-4"  # the free instance comes first
    steps: list[tuple[int, int]] = []
    world.held.add(device)
    steps.append(await world.publish(compute=True))
    steps.append(await world.publish(full_node(2, ("3g.40gb", 4, "Prepared"))))
    world.clock.advance(STEERING_DELAY_S)
    steps.append(await world.publish())
    return size, steps, world.stored()


async def test_an_allocation_of_a_new_placement_writes_the_pool_once_after_the_delay() -> None:
    """Every change written at once (before): the allocation and the instance created each
    rewrite the node's pool (both slices: the counter sets and the devices).
    Held back, with an offer deep enough that every profile keeps a placement beside the
    allocation: neither can be acted on while the claim holds the placement (the placements
    beside it are blocked by its counters, and a held device's other fields are not read),
    so the pool is written once, when the steering delay is over, and at once when the claim
    lets go (the instance, free, must come before the placements). Both end with the same
    pool. With the default depth (2) the allocation blocks both `1g.10gb` placements offered
    (they were beside it, on its GPU): the next ones must be offered at once."""
    for depth in (8, DEFAULT_DEPTH):
        size, before, pool_before = await new_placement_allocated(False, depth)
        assert size == 2
        assert before == [(1, 2), (0, 0), (1, 2), (0, 0), (1, 2)]
        _, after, pool_after = await new_placement_allocated(True, depth)
        first = (0, 0) if depth == 8 else (1, 2)
        assert after == [first, (0, 0), (0, 0), (1, 2), (1, 2)]
        assert pool_after == pool_before


async def test_an_allocation_of_a_free_instance_writes_the_pool_once_after_the_delay() -> None:
    """Before: the allocation moves the instance behind the offer, and the whole pool (both
    slices) is rewritten for it. Held back: written once, after the delay."""
    size, before, pool_before = await free_instance_allocated(holding_back=False)
    assert size == 2
    assert before == [(1, 2), (0, 0), (0, 0)]
    _, after, pool_after = await free_instance_allocated(holding_back=True)
    assert after == [(0, 0), (0, 0), (1, 2)]
    assert pool_after == pool_before


@st.composite
def moves(draw: st.DrawFn) -> tuple[MigNode, MigNode, frozenset[str]]:
    """A node of 2 H100s before and after one change (an instance made, a free one gone, or
    a claim's device taken or let go), and the devices claims hold after it."""
    layouts_ = [draw(layouts(H100)) for _ in range(2)]

    def body(per_gpu: list[list[tuple[str, int, str]]]) -> MigNode:
        return node(*(gpu(i, *instances) for i, instances in enumerate(per_gpu)))

    states = [
        [(i.profile, i.start, "Prepared" if i.used else "Free") for i in layout]
        for layout in layouts_
    ]
    before = body(states)
    after_states = [list(s) for s in states]
    index = draw(st.integers(0, 1))
    table = CATALOG[H100]
    kind = draw(st.sampled_from(["made", "gone", "none"]))
    if kind == "made":
        have = [Instance(p, s) for p, s, _ in after_states[index]]
        options = addable_placements(table, have)
        if options:
            made = draw(st.sampled_from(options))
            after_states[index].append((made.profile, made.start, "Free"))
    elif kind == "gone":
        free = [e for e in after_states[index] if e[2] == "Free"]
        if free:
            after_states[index].remove(draw(st.sampled_from(free)))
    after = body(after_states)
    names = sorted(
        by_name(offer_pool(after, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset()))
    )
    # What claims hold is what kube-scheduler could allocate together: placements that fit
    # beside the GPU's instances and each other (an instance itself may be held).
    where = placements(after)
    layout = {i: {Instance(p, s) for p, s, _ in after_states[i]} for i in range(2)}
    held: set[str] = set()
    for name in draw(st.lists(st.sampled_from(names), max_size=2)) if names else []:
        place = where[name]
        if place.instance in layout[place.gpu]:
            held.add(name)
        elif not layout_problems(table, [*layout[place.gpu], place.instance]):
            layout[place.gpu].add(place.instance)
            held.add(name)
    return before, after, frozenset(held)


@settings(max_examples=200, deadline=None)
@given(moves(), st.integers(1, 3))
def test_a_pool_left_standing_lists_every_instance_and_every_held_device(
    move: tuple[MigNode, MigNode, frozenset[str]], depth: int
) -> None:
    """Whatever `scheduler_needs` lets wait, the pool kube-scheduler keeps has the counter
    sets, every instance the node has (its counters must count) and every device claims hold
    with the counters and taints it has now: never two placements NVML cannot hold both."""
    before, after, held = move
    published = offer_pool(
        before, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset(), depth=depth
    )
    wanted = offer_pool(after, EVERY_PROFILE, frozenset(), True, held, frozenset(), depth=depth)
    if scheduler_needs(published, wanted, held):
        return
    old, new = by_name(published), by_name(wanted)
    assert [c.counter_sets for c in published if c.counter_sets] == [
        c.counter_sets for c in wanted if c.counter_sets
    ]
    for name, device in new.items():
        if device["attributes"]["created"]["bool"] or name in held:
            assert name in old, name
    for name in held:
        assert (old[name].get("consumesCounters"), old[name].get("taints")) == (
            new[name].get("consumesCounters"),
            new[name].get("taints"),
        )
