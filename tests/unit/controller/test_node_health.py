"""Which nodes the operator leaves alone (NodeHealth), and what a round does with them."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

from migpart.api.models import Condition, KubeletPluginStatus, MigNode
from migpart.api.selectors import DEFAULT_NODE_SELECTOR, MANAGED_LABEL, parse_node_selector
from migpart.clock import ManualClock
from migpart.controller.core.health import NodeHealth
from migpart.controller.rounds.reconcile import PolicyRound
from migpart.controller.watching.indexes import Cluster
from migpart.kube.leases import stale_conditions
from migpart.kube.placement import NodeFacts
from migpart.slices.dra import DRIVER
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import (
    DEVICE_CLASS,
    claim,
    mignode,
    offline_state,
    placement,
    policy,
)
from tests.unit.kube.factories import gpu


def health(clock: ManualClock, *nodes: str) -> NodeHealth:
    h = NodeHealth(clock, timeout_s=40.0)
    for node in nodes:
        h.mignode(node, None)
    return h


def assert_stale_at_the_timeout(clock: ManualClock, h: NodeHealth, node: str) -> None:
    """`node`, its Lease timed from now, is not stale a second before the 40 s timeout and is
    a second after it."""
    clock.advance(39)
    assert h.check() == []
    clock.advance(2)
    assert h.check() == [node]


def test_nothing_is_stale_before_the_leases_were_listed() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    clock.advance(1000)
    assert h.check() == []
    assert h.reason("a") is None
    assert not h.synced


def test_a_lease_not_renewed_for_the_timeout_makes_its_node_stale_until_renewed() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a", "b")
    h.leases_listed({"a": "t1", "b": "t1"})
    clock.advance(30)
    h.lease_renewed("a", "t2")
    h.lease_renewed("b", "t1")  # the same renewTime again (a relist): not a renewal
    clock.advance(15)  # b: 45 s silent, a: 15 s
    assert h.check() == ["b"]
    assert h.reason("b") == "LeaseExpired"
    assert h.unavailable() == {"b": "LeaseExpired"}
    assert "not renewed for 45 s" in h.describe("b")
    assert h.check() == []  # told once
    h.lease_renewed("b", "t3")
    assert h.check() == ["b"]
    assert h.reason("b") is None


def test_a_restarted_operator_gives_every_lease_the_timeout_from_its_first_list() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    clock.advance(1000)
    h.leases_listed({"a": "renewed long before the operator started"})
    assert_stale_at_the_timeout(clock, h, "a")


def test_a_node_without_a_lease_is_not_judged_by_one() -> None:
    """Its agent predates Leases (an upgrade in progress): it keeps its devices."""
    clock = ManualClock(at=100.0)
    h = health(clock, "a", "b")
    h.leases_listed({"b": "t1"})
    clock.advance(1000)
    assert h.check() == ["b"]
    assert h.reason("a") is None
    h.lease_deleted("b")  # its Node went (the Lease is owned by it)
    assert h.check() == ["b"]
    assert h.reason("b") is None


def test_a_deleted_node_is_forgotten() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    h.leases_listed({"a": "t1"})
    clock.advance(100)
    h.check()
    h.forget("a")
    assert h.unavailable() == {}
    assert h.check() == []


def test_plugin_registration_counts_at_once_and_only_where_reported() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    h.registration_grace_s = 0.0  # the grace after a registration: tested below
    h.leases_listed({"a": "t1"})
    waiting = KubeletPluginStatus(registered=False, message="waiting for kubelet")
    assert h.mignode("a", waiting)
    assert h.reason("a") == "PluginNotRegistered"
    assert "waiting for kubelet" in h.describe("a")
    assert not h.mignode("a", waiting)
    assert h.mignode("a", KubeletPluginStatus(registered=True))
    assert h.reason("a") is None
    h.mignode("a", waiting)
    assert h.mignode("a", None)  # an agent that does not report it: not gated
    # an expired lease wins over the registration
    h.mignode("a", waiting)
    clock.advance(50)
    assert h.check() == ["a"]
    assert h.reason("a") == "LeaseExpired"


def test_the_stale_condition_is_written_only_when_it_changes() -> None:
    ready = Condition(type="Ready", status="True", reason="Converged")
    marked = stale_conditions([ready], True, "silent")
    assert marked is not None
    assert [(c.type, c.status, c.reason) for c in marked] == [
        ("Ready", "True", "Converged"),
        ("Stale", "True", "LeaseExpired"),
    ]
    assert stale_conditions(marked, True, "silent") is None
    assert stale_conditions([ready], False, "back") is None  # absent means fresh
    cleared = stale_conditions(marked, False, "back")
    assert cleared is not None
    assert [(c.type, c.status, c.reason) for c in cleared][-1] == ("Stale", "False", "LeaseRenewed")


def _world(unavailable: dict[str, str]) -> Cluster:
    busy = {
        **mignode("a", 1, gpus=[gpu(0)]),
        "spec": {"planId": "p-old", "gpus": [{"index": 0, "instances": []}]},
    }
    nodes = {"a": busy, "b": mignode("b", 2, gpus=[gpu(0)])}
    labels = {name: {"pool": "a"} for name in nodes}
    return Cluster(
        mignodes=nodes,
        node_labels=labels,
        policies={"pa": policy("pa", "a", reconfiguration={"batchWindowSeconds": 0})},
        claims={"ns/c1": claim("c1", "3g.40gb")},
        waiting={"ns/c1": (placement(),)},
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={name: NodeFacts(v, ()) for name, v in labels.items()},
        unavailable=unavailable,
    )


async def _round(cluster: Cluster) -> InMemoryEffects:
    effects = InMemoryEffects(mignodes=dict(cluster.mignodes))
    state = offline_state(effects)
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    return effects


async def test_a_stale_node_frees_its_slot_and_is_reported() -> None:
    # a holds the only slot (spec not observed): nothing else may change ...
    held = await _round(_world({}))
    assert held.specs == []
    # ... until a's lease is stale: b gets the plan, a nothing, and the status says why
    effects = await _round(_world({"a": "LeaseExpired"}))
    assert [node for node, _ in effects.specs] == ["b"]
    [(_, status)] = effects.statuses
    assert status.nodes == 2
    assert [(n.name, n.reason) for n in status.unavailable_nodes] == [("a", "LeaseExpired")]
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert ready.status == "True"


async def test_a_policy_whose_nodes_are_all_unavailable_is_not_ready() -> None:
    cluster = _world({"a": "LeaseExpired", "b": "PluginNotRegistered"})
    effects = await _round(replace(cluster))
    assert effects.specs == []
    [(_, status)] = effects.statuses
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "NodesUnavailable")
    assert status.pending_requests == 0  # no node of the policy can take the claim now


def test_while_the_lease_watch_is_broken_no_node_goes_stale() -> None:
    """An operator that cannot see renewals must not take them for dead agents."""
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    h.leases_listed({"a": "t1"})
    h.lease_watch_broken()
    clock.advance(1000)
    assert h.check() == []
    assert h.reason("a") is None
    h.leases_listed({"a": "t1"})  # back: every Lease gets a full timeout from now
    assert_stale_at_the_timeout(clock, h, "a")


def test_only_a_renewal_after_the_first_list_proves_an_agent_alive() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a", "b")
    assert not h.heard_since_listed("a")
    h.leases_listed({"a": "t1", "b": "t1"})
    clock.advance(5)
    assert not h.heard_since_listed("a")  # a Lease exists: that says nothing about now
    h.lease_renewed("a", "t2")
    assert h.heard_since_listed("a")
    assert not h.heard_since_listed("b")


def test_every_change_is_reported_by_the_next_check_whoever_noticed_it() -> None:
    """A MigNode event (e.g. the operator's own spec write) landing between a Lease's expiry
    and the check must not swallow the transition: its side effects (Stale condition, slice,
    metrics) happen in the check."""
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    h.leases_listed({"a": "t1"})
    clock.advance(50)
    assert h.mignode("a", None)  # the event already sees the expiry ...
    assert h.check() == ["a"]  # ... and the check still reports it
    assert h.check() == []
    h.lease_renewed("a", "t2")
    assert h.mignode("a", KubeletPluginStatus(registered=False))  # renewed, now unregistered
    assert h.reason("a") == "PluginNotRegistered"
    assert h.check() == ["a"]


def test_a_node_that_was_registered_keeps_its_devices_for_the_registration_grace() -> None:
    """A restarted agent reports "waiting for kubelet" until kubelet registers its plugin
    again: a node seen registered stays available for the grace, from the first report that
    said otherwise (later ones do not extend it); past it, or with an expired Lease, it is
    unavailable. A node never seen registered gets no grace."""
    clock = ManualClock(at=100.0)
    h = NodeHealth(clock, timeout_s=40.0, registration_grace_s=10.0)
    h.leases_listed({"a": "t1", "b": "t1"})
    waiting = KubeletPluginStatus(registered=False, message="waiting for kubelet")
    registered = KubeletPluginStatus(registered=True)
    assert not h.mignode("a", registered)
    assert h.mignode("b", waiting)  # never registered: at once
    assert h.reason("b") == "PluginNotRegistered"

    assert not h.mignode("a", waiting)  # the agent restarted
    assert h.check() == ["b"]
    assert h.reason("a") is None
    clock.advance(6)
    assert not h.mignode("a", waiting)  # a second report does not extend the grace
    assert h.check() == []
    assert not h.mignode("a", registered)  # kubelet registered it again: never withdrawn
    assert h.reason("a") is None

    assert not h.mignode("a", waiting)  # restarted again, and kubelet does not register it
    clock.advance(9)
    assert h.check() == []
    clock.advance(2)
    assert h.check() == ["a"]
    assert h.reason("a") == "PluginNotRegistered"
    assert h.mignode("a", registered)
    assert h.reason("a") is None

    h.lease_renewed("a", "t2")
    h.mignode("a", waiting)  # within the grace, but the Lease expires: the Lease wins
    clock.advance(41)
    h.check()
    assert h.reason("a") == "LeaseExpired"


def test_no_registration_grace_when_it_is_zero() -> None:
    clock = ManualClock(at=100.0)
    h = NodeHealth(clock, timeout_s=40.0, registration_grace_s=0.0)
    h.leases_listed({"a": "t1"})
    h.mignode("a", KubeletPluginStatus(registered=True))
    assert h.mignode("a", KubeletPluginStatus(registered=False, message="waiting"))
    assert h.reason("a") == "PluginNotRegistered"


def test_a_check_looks_only_at_what_can_have_changed_and_agrees_with_a_full_pass() -> None:
    """`check` visits the nodes whose verdict can have changed (the oldest renewals, the
    unavailable, those in a grace), not every node every tick. Random renewals, deletions,
    registrations and lists, with time passing: after each check, every node's verdict is
    what a pass over all of them gives."""
    rng = random.Random(10)
    clock = ManualClock(at=100.0)
    nodes = [f"n{i}" for i in range(40)]
    h = health(clock, *nodes)
    h.leases_listed({n: "t0" for n in nodes[:30]})  # n30..n39 have no Lease
    stamp = 0
    reasons: set[str] = set()
    for _ in range(3000):
        node = rng.choice(nodes)
        action = rng.random()
        if action < 0.5:
            stamp += 1
            h.lease_renewed(node, f"t{stamp}")
        elif action < 0.55:
            h.lease_deleted(node)
        elif action < 0.6:
            registered = rng.random() < 0.6
            h.mignode(node, KubeletPluginStatus(registered=registered, message="waiting"))
        elif action < 0.61:
            h.leases_listed({n: f"t{stamp}" for n in nodes if rng.random() < 0.8})
        clock.advance(rng.choice([0.0, 0.5, 1.0, 3.0, 15.0]))
        if rng.random() < 0.3:
            h.check()
            assert {n: h._reason(n) for n in nodes if h._reason(n)} == dict(h.unavailable())
            reasons.update(h.unavailable().values())
    assert reasons == {"LeaseExpired", "PluginNotRegistered"}
    # a quiet cluster: nothing is visited but the few that can change
    h.leases_listed({n: f"t{stamp}" for n in nodes})
    for n in nodes:
        h.mignode(n, KubeletPluginStatus(registered=True, message=""))
    h.check()
    assert h._candidates() == set()
    clock.advance(41)  # every Lease silent for longer than the timeout: every node, once
    assert h._candidates() == set(nodes)
    assert h.check() == sorted(nodes)


async def test_a_stale_mark_is_not_dropped_on_a_body_that_does_not_show_our_last_write() -> None:
    """Stale=True written, then cleared (Stale=False written over revision 5); the node goes
    stale again before the watch shows the clear. The body seen (revision 5) still says
    Stale=True, which would make the new mark look done: it must wait for a newer body, and
    then be written."""
    from migpart.controller.runtime import handlers
    from migpart.kube.slice_publisher import SlicePublisher

    effects = InMemoryEffects()
    publisher = SlicePublisher(cast(Any, None))
    state = offline_state(effects, publisher=publisher)

    def writes() -> list[tuple[str, str, str]]:
        return [
            (node, version, next(c.status for c in conditions if c.type == "Stale"))
            for node, version, conditions in effects.conditions
        ]

    def seen(revision: int, stale: str | None) -> None:
        body = mignode("a", revision, gpus=[])
        if stale is not None:
            body["status"]["conditions"] = [
                {"type": "Stale", "status": stale, "reason": "r", "message": "m"}
            ]
        publisher.observe(MigNode.model_validate(body))

    seen(5, "True")
    state.stale.pending["a"] = False  # the agent renews again: clear it
    await handlers.mark_stale(state)
    assert writes() == [("a", "5", "False")]
    state.stale.pending["a"] = True  # stale again before the watch showed the clear
    await handlers.mark_stale(state)
    assert writes() == [("a", "5", "False")]
    assert state.stale.pending == {"a": True}  # kept: revision 5 cannot tell
    seen(6, "False")  # the watch shows the clear
    await handlers.mark_stale(state)
    assert writes() == [("a", "5", "False"), ("a", "6", "True")]
    assert state.stale.pending == {}


def opted_in(labels: Mapping[str, str]) -> bool:
    return parse_node_selector(DEFAULT_NODE_SELECTOR).matches(labels)


def test_a_node_that_did_not_opt_in_is_unavailable_once_the_nodes_are_listed() -> None:
    clock = ManualClock(at=100.0)
    h = NodeHealth(clock, timeout_s=40.0, selects=opted_in)
    h.mignode("in", None)
    h.mignode("out", None)
    h.node_changed("out", {"nvidia.com/gpu.present": "true"})
    # the MigNodes were seen before the Nodes (a restarted operator): nobody is judged yet
    assert h.check() == []
    h.nodes_listed({"in": {MANAGED_LABEL: "true"}, "out": {"nvidia.com/gpu.present": "true"}})
    assert h.check() == ["out"]
    assert h.reason("out") == "NotOptedIn"
    assert "--node-selector" in h.describe("out")
    assert h.reason("in") is None
    h.node_changed("out", {MANAGED_LABEL: "true"})  # kubectl label node out migpart.io/managed=true
    assert h.check() == ["out"]
    assert h.reason("out") is None
    h.node_changed("in", {MANAGED_LABEL: "false"})
    assert h.check() == ["in"]
    assert h.reason("in") == "NotOptedIn"
    h.node_changed("out", None)  # the Node was deleted
    assert h.reason("out") == "NotOptedIn"


def test_without_a_selector_every_node_is_managed() -> None:
    h = NodeHealth(ManualClock(at=1.0), selects=None)
    h.mignode("a", None)
    h.nodes_listed({"a": {}})
    assert h.check() == []


def test_another_publisher_makes_the_node_unavailable_while_the_agent_says_so() -> None:
    clock = ManualClock(at=100.0)
    h = health(clock, "a")
    message = "NVIDIA's device plugin (node allocatable: nvidia.com/mig-1g.10gb: 7) ..."
    assert h.mignode("a", None, message)
    assert h.reason("a") == "PublisherOverlap"
    assert h.describe("a") == message
    assert h.check() == ["a"]
    # it outranks an expired Lease: the reason that needs the user's hand is the one told
    h.leases_listed({"a": "t1"})
    clock.advance(100)
    assert h.check() == []
    assert h.reason("a") == "PublisherOverlap"
    assert h.mignode("a", None, None)
    assert h.reason("a") == "LeaseExpired"
    h.forget("a")
    assert h.reason("a") is None
