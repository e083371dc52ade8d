"""Which nodes offer and what their pools list (`OfferingNodes`), and the rounds of an offering
policy: they plan nothing, give each node the offering spec once, and hand a node back to
reactive mode with a spec of what it has, destroying nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

from migpart.api.models import MigNode, MigNodeSpec
from migpart.controller.core.decisions import offer_spec, refused_spec_repair
from migpart.controller.watching.indexes import Cluster, with_own_writes
from migpart.kube.features import DraFeatures
from migpart.offer.nodes import NodeOffer, OfferingNodes
from migpart.offer.pool import node_gpus
from migpart.planning.listing import planner_order
from migpart.planning.model import PolicyView
from migpart.slices.content import DeviceCache, node_slices
from migpart.testing.builders import ClaimBuilder, profile_is
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import claim, mignode, policy, world
from tests.unit.controller.harness import operator, run
from tests.unit.kube.factories import gpu

SERVED = DraFeatures(True, True, "served: partitionable devices, device taints")
OFFER = NodeOffer("pa", PolicyView())
SMALL = NodeOffer("pa", PolicyView(allowed=frozenset({"1g.10gb"})))


def node(name: str = "a", *instances: tuple[str, int, str], offers: bool = True) -> MigNode:
    """MigNode `name` (two H100s, `instances` on GPU 0), its spec saying Offer or not."""
    body = mignode(name, 1, *instances)
    if offers:
        body["spec"] = offer_spec("p0").model_dump(by_alias=True, exclude_none=True)
    return MigNode.model_validate(body)


def held(name: str, pool: str, device: str) -> dict[str, Any]:
    body = ClaimBuilder(name, "ns").uid(f"uid-{name}").request(profile_is("1g.10gb"))
    return body.allocated(pool, device).obj()


def listed(nodes: OfferingNodes, n: MigNode) -> list[str]:
    pool = nodes.slices(n, frozenset(), True, DeviceCache())
    return [str(d["name"]) for s in pool for d in s.devices]


def test_an_offering_node_lists_every_allowed_placement_in_the_planners_order() -> None:
    nodes = OfferingNodes()
    nodes.assign("pa", ["a"], SMALL)
    n = node()
    order = planner_order(node_gpus(n), SMALL.view)
    assert listed(nodes, n) == [f"gpu-{r.gpu}-1g10gb-{r.start}" for r in order]
    assert len(order) == 14  # 7 starts on each of the two H100s


def test_a_node_that_does_not_offer_gets_exactly_the_reactive_slice() -> None:
    nodes = OfferingNodes()
    nodes.assign("pa", ["b"], OFFER)
    n = node("a", ("3g.40gb", 0, "Free"), offers=False)
    mine = nodes.slices(n, frozenset(), True, DeviceCache())
    assert [(s.digest, s.devices) for s in mine] == [
        (s.digest, s.devices) for s in node_slices(n, frozenset(), True)
    ]


def test_the_pool_follows_the_nodes_spec_as_its_agent_does() -> None:
    """Assigned but its spec not yet Offer: reactive (its agent makes no room yet). Its
    policy gone but its spec still Offer (not handed back yet): the pool, under the view it
    last offered under."""
    nodes = OfferingNodes()
    nodes.assign("pa", ["a"], SMALL)
    assert listed(nodes, node(offers=False)) == []
    offered = listed(nodes, node())
    assert len(offered) == 14
    nodes.drop("pa")
    assert listed(nodes, node()) == offered
    assert len(listed(OfferingNodes(), node())) == 50  # never assigned: every profile


def test_which_nodes_offer_follows_the_rounds_and_each_change_is_told() -> None:
    told: list[str] = []
    nodes = OfferingNodes(on_change=told.append)
    assert nodes.assign("pa", ["a", "b"], OFFER) == ["a", "b"]
    assert nodes.assign("pa", ["a", "b"], OFFER) == []  # the same: nothing told
    assert nodes.assign("pa", ["a"], OFFER) == ["b"]  # b left the scope
    assert nodes.drop("pa") == ["a"]
    assert told == ["a", "b", "b", "a"]
    assert not nodes.offered("a")


def test_an_allocation_of_a_listed_placement_changes_nothing() -> None:
    """The design's point: the pool is not computed again, let alone written, per claim."""
    told: list[str] = []
    nodes = OfferingNodes(on_change=told.append)
    nodes.assign("pa", ["a"], SMALL)
    listed(nodes, node())
    told.clear()
    nodes.claim_changed("MODIFIED", held("c1", "a", "gpu-0-1g10gb-3"))
    nodes.claim_changed("DELETED", held("c1", "a", "gpu-0-1g10gb-3"))
    assert told == []
    assert nodes.held("a") == frozenset()


def test_a_device_held_outside_the_order_is_listed_while_held() -> None:
    """A claim allocated a 3g.40gb before the policy allowed only 1g.10gb: its device stays
    listed (its counters count) until the claim lets go."""
    told: list[str] = []
    nodes = OfferingNodes(on_change=told.append)
    nodes.assign("pa", ["a"], SMALL)
    n = node()
    listed(nodes, n)
    told.clear()
    nodes.claim_changed("ADDED", held("c1", "a", "gpu-1-3g40gb-4"))
    assert told == ["a"]
    assert listed(nodes, n)[-1] == "gpu-1-3g40gb-4"
    nodes.claims_listed([])  # a new list: the claim is gone
    assert told == ["a", "a"]
    assert "gpu-1-3g40gb-4" not in listed(nodes, n)


def test_held_devices_are_kept_per_node() -> None:
    nodes = OfferingNodes()
    nodes.claims_listed([held("c1", "a", "gpu-0-1g10gb-0"), held("c2", "b", "gpu-0-7g80gb-0")])
    assert nodes.held("a") == {"gpu-0-1g10gb-0"}
    assert nodes.held("b") == {"gpu-0-7g80gb-0"}


# ------------------------------------------------------------------ the rounds


def policy_world(nodes: dict[str, Any], claims: list[dict[str, Any]], **spec: Any) -> Cluster:
    """`world` with policy pa's spec given `spec` (e.g. allocation, mode)."""
    batch = {"batchWindowSeconds": 0}
    body = policy("pa", "a", reconfiguration=batch, **spec)
    return dataclasses.replace(world(nodes, claims), policies={"pa": body})


def offering_state(effects: InMemoryEffects) -> Any:
    state = operator(effects)
    state.offer.dra = SERVED
    state.offer.publishing = True
    return state


async def test_an_offering_policy_plans_nothing_and_writes_the_offering_spec_once() -> None:
    nodes = {"a": mignode("a", 1, ("7g.80gb", 0, "Free"))}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = offering_state(effects)
    cluster = policy_world(nodes, [claim("c1", "3g.40gb")], allocation="Offer")
    await run(state, cluster)
    [(name, spec)] = effects.specs
    assert name == "a"
    assert (spec.allocation, spec.gpus) == ("Offer", [])  # nothing made ahead, nothing dropped
    assert state.offer.nodes.offered("a")
    assert [e.reason for e in effects.events] == ["AllocationModeChanged"]
    await run(state, with_own_writes(cluster, state.watches.written))
    assert len(effects.specs) == 1  # the pending claim is the scheduler's: no plan, no spec
    assert effects.withdrawals == []


async def test_a_node_handed_back_to_reactive_keeps_every_instance_then_plans() -> None:
    spec = offer_spec("p0")
    body = mignode("a", 1, ("3g.40gb", 4, "Prepared"), ("1g.10gb", 0, "Free"))
    body["spec"] = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    nodes = {"a": body}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = offering_state(effects)
    cluster = world(nodes, [claim("c1", "7g.80gb")])  # the policy asks for Auto
    state.offer.publishing = False  # so its mode in effect is Reactive
    state.offer.nodes.assign("pa", ["a"], OFFER)  # it offered until now
    await run(state, cluster)
    [(_, handed)] = effects.specs
    assert handed.allocation is None
    assert {(g.index, i.profile, i.start) for g in handed.gpus for i in g.instances} == {
        (0, "3g.40gb", 4),
        (0, "1g.10gb", 0),
    }
    assert not state.offer.nodes.offered("a")
    carried_out = dict(state.watches.written["a"])
    carried_out["status"] = {**body["status"], "observedPlanId": handed.plan_id}
    await run(state, world({"a": carried_out}, [claim("c1", "7g.80gb")]))
    [_, (_, planned)] = effects.specs  # then a round plans from it, as any reactive node
    assert planned.allocation is None
    kept = {(g.index, i.profile, i.start) for g in planned.gpus for i in g.instances}
    assert (0, "3g.40gb", 4) in kept  # prepared: never dropped


async def test_a_dry_run_policy_writes_no_mode_spec() -> None:
    nodes = {"a": mignode("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = offering_state(effects)
    await run(state, policy_world(nodes, [], allocation="Offer", mode="DryRun"))
    assert not state.offer.nodes.offered("a")
    assert all(spec.allocation != "Offer" for _, spec in effects.specs)


def test_a_repaired_offering_spec_stays_offering() -> None:
    body = mignode("a", 1)
    body["spec"] = {
        **offer_spec("p1").model_dump(by_alias=True, exclude_none=True),
        "leaderTerm": 1,
    }
    body["status"]["leaderTerm"] = 2
    body["status"]["observedPlanId"] = "p0"
    repaired = refused_spec_repair(MigNode.model_validate(body), 2)
    assert repaired == MigNodeSpec(plan_id="p0", allocation="Offer")


async def test_a_node_is_handed_back_only_once_every_placement_a_claim_holds_is_made() -> None:
    """A claim allocated GPU 1's whole placement from the pool, not prepared yet: reactive
    mode's slice would not list it (nor count it), so the node keeps offering, and the round
    plans nothing, until the agent made it."""
    body = mignode("a", 1)
    body["spec"] = offer_spec("p0").model_dump(by_alias=True, exclude_none=True)
    effects = InMemoryEffects(mignodes={"a": body})
    state = offering_state(effects)
    state.offer.publishing = False  # the policy's mode in effect is Reactive now
    state.offer.nodes.claim_changed("ADDED", held("c1", "a", "gpu-1-7g80gb-0"))
    await run(state, world({"a": body}, [claim("c2", "3g.40gb")]))
    assert effects.specs == []
    made = mignode("a", 2, gpus=[gpu(0), gpu(1, ("7g.80gb", 0, "Prepared"))])
    made["spec"] = body["spec"]
    await run(state, world({"a": made}, [claim("c2", "3g.40gb")]))
    [(_, handed)] = effects.specs
    assert handed.allocation is None
    assert [(g.index, [(i.profile, i.start) for i in g.instances]) for g in handed.gpus] == [
        (0, []),
        (1, [("7g.80gb", 0)]),
    ]
