"""Offer mode's wiring (controller/offers.py): which nodes publish offers, what their pools list,
and that without `--offer-publishing` everything is as before; a new leader publishes an
offering node as offering from its first write."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

from migpart.api.models import (
    FailedInstance,
    MigNode,
)
from migpart.controller import handlers
from migpart.controller.handlers import _wire_offers
from migpart.controller.mignodes import MigNodeWatch
from migpart.controller.offers import NodeOffer, Offers, offer_pool
from migpart.dra import INSTANCE_FAILED, INSTANCE_READY
from migpart.kube.election import LeaderElector
from migpart.kube.features import DraFeatures
from migpart.kube.placement import NodeFacts
from migpart.kube.slice_publisher import Published, SlicePublisher
from migpart.offer_content import FAILED_TAINT
from migpart.planning.model import PolicyView
from migpart.slice_content import DeviceCache, node_slices
from migpart.testing.effects import InMemoryEffects
from migpart.testing.leases import InMemoryLeaseStore
from tests.unit.controller.factories import (
    mignode,
    offline_state,
)
from tests.unit.controller.harness import indexed
from tests.unit.controller.offer_world import (
    EVERY_PROFILE,
    NONE,
    SERVED,
    by_name,
    memory,
    node,
    offering_state,
    run,
    world,
)
from tests.unit.kube.factories import gpu

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
