"""The operator's decisions, one round at a time, through the in-memory Effects port."""

from __future__ import annotations

from typing import Any

import pytest

from migpart.api.models import MigNode
from migpart.controller.rounds.reconcile import PolicyRound
from migpart.controller.watching.indexes import Cluster, with_own_writes
from migpart.kube.placement import NodeFacts
from migpart.kube.snapshot import reconfiguring
from migpart.planning.model import Plan
from migpart.slices.dra import DRIVER
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import (
    DEVICE_CLASS,
    allocation,
    claim,
    one_gpu,
    placement,
    policy,
    world,
)
from tests.unit.controller.harness import clock_of, operator, run


async def test_a_pending_claim_gets_a_spec_an_event_and_a_status() -> None:
    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    await run(state, world(nodes, [claim("c1", "3g.40gb")]))
    [(node, spec)] = effects.specs
    assert node == "a"
    assert [(i.profile) for i in spec.gpus[0].instances] == ["3g.40gb"]
    assert [e.reason for e in effects.events] == ["Repartitioning"]
    [(_, status)] = effects.statuses
    assert status.pending_requests == 1
    assert status.last_plan is not None
    assert status.last_plan.plan_id == spec.plan_id


async def test_a_second_round_on_the_same_world_writes_nothing() -> None:
    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    await run(state, cluster)
    await run(state, cluster)  # the watch has not shown our spec yet: our own write stands in
    assert len(effects.specs) == 1
    assert len(effects.statuses) == 1


async def test_a_destroyed_instance_is_withdrawn_and_confirmed_before_the_spec_drops_it() -> None:
    nodes = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Free"))}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    await run(state, world(nodes, [claim("c1", "3g.40gb")]))
    assert effects.withdrawals == [("a", frozenset({"gpu-0-7g80gb-0"}))]
    assert clock_of(state).slept_s == state.destroy.grace_s  # the grace before the read
    [(_, spec)] = effects.specs
    assert "7g.80gb" not in [i.profile for i in spec.gpus[0].instances]
    steps = [e.step for e in state.hooks.journal]
    assert steps.index("withdrawn") < steps.index("confirmed") < steps.index("spec_written")


async def test_a_device_allocated_inside_the_window_is_kept_and_never_leaves_the_spec() -> None:
    nodes = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Free"))}
    effects = InMemoryEffects(mignodes=dict(nodes))

    async def scheduler_wins(node: str, devices: frozenset[str]) -> None:
        effects.claims.append(allocation("racer", node, "gpu-0-7g80gb-0"))

    effects.on_withdraw = scheduler_wins
    state = operator(effects)
    await run(state, world(nodes, [claim("c1", "3g.40gb")]))
    assert effects.restores == [("a", frozenset({"gpu-0-7g80gb-0"}))]
    assert "DestroyAborted" in [e.reason for e in effects.events]
    for _, spec in effects.specs:  # whatever was planned again keeps the device
        assert "7g.80gb" in [i.profile for i in spec.gpus[0].instances]
    assert "uid-racer" in state.destroy.fresh_allocations


async def test_a_redo_does_not_give_a_node_of_this_round_a_second_spec() -> None:
    """maxConcurrentNodes 2: node a gets its spec, then node b's destroy protocol finds its
    device allocated and the round plans again. That plan must see a's new spec (a is
    reconfiguring now), not the layout the round started with."""
    nodes = {"a": one_gpu("a", 1), "b": one_gpu("b", 2, ("7g.80gb", 0, "Free"))}
    effects = InMemoryEffects(mignodes=dict(nodes))

    async def scheduler_wins(node: str, devices: frozenset[str]) -> None:
        effects.claims.append(allocation("racer", node, "gpu-0-7g80gb-0"))

    effects.on_withdraw = scheduler_wins
    state = operator(effects)
    claims = [claim("c1", "4g.40gb"), claim("c2", "4g.40gb")]
    await run(state, world(nodes, claims, maxConcurrentNodes=2))
    assert [node for node, _ in effects.specs].count("a") == 1
    assert [node for node, _ in effects.specs].count("b") == 0


def test_a_node_whose_agent_has_not_carried_out_its_plan_is_reconfiguring() -> None:
    """Such a node is busy: `choose_nodes` gives it no new spec (see test_changes.py)."""
    busy = MigNode.model_validate({**one_gpu("busy", 1), "spec": {"planId": "p1", "gpus": []}})
    assert reconfiguring(busy)
    assert not reconfiguring(MigNode.model_validate(one_gpu("x", 2)))


def test_our_own_write_stands_in_until_the_watch_shows_it() -> None:
    old = one_gpu("a", 5)
    cluster = world({"a": old}, [])
    mine = {**old, "metadata": {**old["metadata"], "resourceVersion": "9"}, "spec": {"x": 1}}
    written = {"a": mine}
    assert with_own_writes(cluster, written).mignodes["a"] is mine
    caught_up = {**mine, "metadata": {**mine["metadata"], "resourceVersion": "9"}}
    assert with_own_writes(world({"a": caught_up}, []), written).mignodes["a"] is caught_up
    assert written == {}  # forgotten once the index has it


async def test_the_same_inputs_are_not_planned_twice(monkeypatch: Any) -> None:
    """The planner is pure: a round whose nodes, allocations, requests and policy are those of
    the last plan carried out reuses it; any change plans again."""
    from migpart.controller.rounds import reconcile

    calls: list[int] = []
    real_plan = reconcile.make_plan

    def counted(*args: Any, **kwargs: Any) -> Plan:
        calls.append(1)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(reconcile, "make_plan", counted)
    busy = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Busy"))}  # nothing can be created
    effects = InMemoryEffects(mignodes=dict(busy))
    state = operator(effects)
    cluster = world(busy, [claim("c1", "3g.40gb")])
    await run(state, cluster)
    clock_of(state).advance(3600)  # past any pace: this test is about the inputs
    round_ = await run(state, cluster)
    assert len(calls) == 1
    assert not round_.deferred
    assert effects.specs == []
    freed = {"a": one_gpu("a", 2)}  # the instance went away: plan again, and write
    clock_of(state).advance(3600)
    await run(state, world(freed, [claim("c1", "3g.40gb")]))
    assert len(calls) == 2
    assert [node for node, _ in effects.specs] == ["a"]


async def test_busy_policies_share_one_planning_budget() -> None:
    """Pacing: a policy plans again PACE_FACTOR x its last plan's cost later, times the number
    of policies with pending requests, so that planning CPU does not grow with policies."""
    from migpart.controller.core.state import PlanTiming
    from migpart.controller.rounds.reconcile import PACE_FACTOR

    nodes = {"a": one_gpu("a", 1)}
    state = operator(InMemoryEffects(mignodes=dict(nodes)))
    clock = clock_of(state)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    round_ = PolicyRound(state, "pa", cluster.policies["pa"], cluster)
    scope = round_.scope()
    assert scope is not None
    policy = state.scopes.policy("pa", cluster.policies["pa"])
    assert policy is not None
    state.rounds.memory("pa").first_pending = clock.monotonic()
    clock.advance(3600)
    state.rounds.memory("pa").last_plan = PlanTiming(clock.monotonic(), 10.0)
    assert not round_.may_plan(policy, scope.demand)
    assert round_.retry_in_s == PACE_FACTOR * 10.0
    state.rounds.memory("pb").first_pending = 0.0  # another policy has pending requests too
    assert not round_.may_plan(policy, scope.demand)
    assert round_.retry_in_s == PACE_FACTOR * 10.0 * 2
    clock.advance(PACE_FACTOR * 10.0 * 2)
    assert round_.may_plan(policy, scope.demand)


async def test_the_batch_window_then_the_pace_hold_a_plan_back_until_the_clock_moves() -> None:
    """batchWindowSeconds 5: the rounds that see the claim hold its plan back until 5 s (on the
    operator's clock) after it was first seen, then one plans; the plan after it is paced,
    PACE_FACTOR x that plan's cost later."""
    from migpart.controller.rounds.reconcile import PACE_FACTOR

    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    clock = clock_of(state)
    cluster = world(nodes, [claim("c1", "3g.40gb")], batchWindowSeconds=5)
    round_ = await run(state, cluster)
    assert (round_.deferred, round_.retry_in_s) == (True, 5.0)
    clock.advance(4)
    round_ = await run(state, cluster)
    assert (round_.deferred, round_.retry_in_s) == (True, 1.0)
    assert effects.specs == []
    clock.advance(1)
    round_ = await run(state, cluster)
    assert not round_.deferred
    assert [node for node, _ in effects.specs] == ["a"]
    assert state.rounds.memory("pa").last_plan.at == clock.monotonic()
    pace_s = PACE_FACTOR * state.rounds.memory("pa").last_plan.cost_s
    round_ = await run(state, cluster)  # the claim is still pending: the next plan is paced
    assert round_.deferred
    assert round_.retry_in_s == pytest.approx(pace_s)
    clock.advance(pace_s * 1.01)
    assert not (await run(state, cluster)).deferred


async def test_one_plans_nodes_share_one_window_and_a_kept_one_holds_back_only_itself() -> None:
    """Two nodes each drop a free 7g: both are withdrawn, then one grace and one quorum read
    for both. The scheduler wins the race on a: a keeps its device (and gets no spec that
    drops it), b's spec is written all the same."""
    nodes = {
        "a": one_gpu("a", 1, ("7g.80gb", 0, "Free")),
        "b": one_gpu("b", 2, ("7g.80gb", 0, "Free")),
    }
    effects = InMemoryEffects(mignodes=dict(nodes))

    async def scheduler_wins(node: str, devices: frozenset[str]) -> None:
        if node == "a":
            effects.claims.append(allocation("racer", node, "gpu-0-7g80gb-0"))

    effects.on_withdraw = scheduler_wins
    state = operator(effects)
    claims = [claim(f"c{i}", "3g.40gb") for i in range(4)]
    await run(state, world(nodes, claims, maxConcurrentNodes=2))
    journal = [(e.step, e.node) for e in state.hooks.journal]
    first_check = min(i for i, (step, _) in enumerate(journal) if step in ("confirmed", "kept"))
    assert {n for step, n in journal[:first_check] if step == "withdrawn"} == {"a", "b"}
    assert ("kept", "a") in journal
    assert ("confirmed", "b") in journal
    assert "b" in [node for node, _ in effects.specs]
    for node, spec in effects.specs:
        if node == "a":
            assert "7g.80gb" in [i.profile for i in spec.gpus[0].instances]
    assert effects.claim_reads >= 1
    assert clock_of(state).slept_s == state.destroy.grace_s * effects.claim_reads


def two_policies(nodes: dict[str, dict[str, Any]], claims: list[dict[str, Any]]) -> Cluster:
    """Node `a` follows policy pa (pool a), every other node policy pb (pool b)."""
    labels = {name: {"pool": "a" if name == "a" else "b"} for name in nodes}
    windowless = {"batchWindowSeconds": 0}
    return Cluster(
        mignodes=nodes,
        node_labels=labels,
        policies={
            "pa": policy("pa", "a", reconfiguration=windowless),
            "pb": policy("pb", "b", reconfiguration=windowless),
        },
        claims={f"ns/{c['metadata']['name']}": c for c in claims},
        waiting={f"ns/{c['metadata']['name']}": (placement(),) for c in claims},
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={name: NodeFacts(v, ()) for name, v in labels.items()},
    )


async def test_another_policys_round_leaves_a_withdrawal_in_progress_alone() -> None:
    """Policy pa withdraws node a's 7g.80gb; while its grace runs, policy pb's loop runs a
    round. That round must not publish the device again as a leftover: the scheduler could
    then allocate it after pa's quorum read, and pa's spec would drop it while in use."""
    nodes = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Free")), "b": one_gpu("b", 2)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    cluster = two_policies(nodes, [claim("c1", "3g.40gb")])
    during: list[frozenset[str]] = []

    async def other_policy_runs(node: str, devices: frozenset[str]) -> None:
        await PolicyRound(state, "pb", cluster.policies["pb"], cluster).run()
        during.append(effects.withdrawn(node))

    effects.on_withdraw = other_policy_runs
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    assert during == [frozenset({"gpu-0-7g80gb-0"})]  # still withdrawn after pb's round
    assert effects.restores == []
    assert "restored" not in [e.step for e in state.hooks.journal]
    [spec] = [s for n, s in effects.specs if n == "a"]
    assert "7g.80gb" not in [i.profile for i in spec.gpus[0].instances]
    assert state.destroy.withdrawing == set()  # pa's round ended: nothing of it is in flight


async def test_a_withdrawal_left_by_a_failed_round_is_published_again_by_the_next() -> None:
    """pa's round fails between its withdrawal and its spec write (the quorum read breaks):
    the device stays withdrawn, and the next round, of any policy, publishes it again."""
    nodes = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Free")), "b": one_gpu("b", 2)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    cluster = two_policies(nodes, [claim("c1", "3g.40gb")])

    async def broken_read() -> list[dict[str, Any]]:
        raise ConnectionError("API server went away")

    effects.read_claims = broken_read  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    assert effects.withdrawn("a") == {"gpu-0-7g80gb-0"}
    assert effects.specs == []
    assert state.destroy.withdrawing == set()
    await PolicyRound(state, "pb", cluster.policies["pb"], cluster).run()
    assert effects.restores == [("a", frozenset({"gpu-0-7g80gb-0"}))]
    assert effects.withdrawn("a") == frozenset()
    assert "restored" in [e.step for e in state.hooks.journal]


async def test_a_round_on_the_old_spec_does_not_hide_the_report_of_an_invalid_new_one() -> None:
    """The policy is edited into an invalid spec while a round on the old spec runs:
    policy_changed writes Ready=False for generation 2 first, then the round ends. Its status
    (generation 1, Ready) must not be written over that: no round runs for an invalid policy,
    so nothing would correct it until the next edit."""
    from pydantic import ValidationError

    from migpart.controller.core.bodies import parse_policy
    from migpart.controller.rounds.reconcile import report_invalid

    nodes = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Free"))}  # the round destroys it
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    old = cluster.policies["pa"]
    new = {**old, "metadata": {**old["metadata"], "generation": 2}, "spec": {"nodeSelector": 1}}
    with pytest.raises(ValidationError) as error:
        parse_policy(new)

    async def edited_meanwhile(node: str, devices: frozenset[str]) -> None:
        await report_invalid(state, "pa", new, error.value)  # the edit's event, mid-round

    effects.on_withdraw = edited_meanwhile
    round_ = PolicyRound(state, "pa", old, cluster)
    await round_.run()
    assert [node for node, _ in effects.specs] == ["a"]  # the round went on to its spec
    assert [s.observed_generation for _, s in effects.statuses] == [2]
    (_, status) = effects.statuses[0]
    ready = {c.type: c.status for c in status.conditions}
    assert ready["Ready"] == "False"


async def test_a_pending_count_alone_is_written_at_most_every_status_interval() -> None:
    """A burst of claims moves `pendingRequests` with every event: a change of the count alone
    waits STATUS_INTERVAL_S after the last write (the round says when, and a round then writes
    the latest count); any other change, here the Ready condition, is written at once."""
    from migpart.controller.rounds.reconcile import STATUS_INTERVAL_S

    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    clock = clock_of(state)
    claims = [claim("c1", "3g.40gb")]
    await run(state, world(nodes, claims, batchWindowSeconds=60))
    assert [s.pending_requests for _, s in effects.statuses] == [1]
    clock.advance(0.5)
    claims.append(claim("c2", "3g.40gb"))
    round_ = await run(state, world(nodes, claims, batchWindowSeconds=60))
    assert [s.pending_requests for _, s in effects.statuses] == [1]
    assert round_.status_due_in_s == pytest.approx(STATUS_INTERVAL_S - 0.5)
    claims.append(claim("c3", "3g.40gb"))
    round_ = await run(state, world(nodes, claims, batchWindowSeconds=60))
    assert len(effects.statuses) == 1
    clock.advance(round_.status_due_in_s)
    round_ = await run(state, world(nodes, claims, batchWindowSeconds=60))
    assert [s.pending_requests for _, s in effects.statuses] == [1, 3]
    assert round_.status_due_in_s == 0.0
    # a claim no permitted profile can satisfy: the Ready condition changes, written at once
    claims.append(claim("c4", "9g.999gb"))
    await run(state, world(nodes, claims, batchWindowSeconds=60))
    [*_, (_, last)] = effects.statuses
    assert len(effects.statuses) == 3
    ready = next(c for c in last.conditions if c.type == "Ready")
    assert ready.reason == "Unsatisfiable"
