"""The fence: a round writes only while the leadership term it started under holds, and every
write outside rounds (slice publishes, the Stale condition) only while this operator leads.
The leadership is a real `LeaderElector` on the in-memory Lease store, its clock injected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from migpart.api.models import MigNode
from migpart.controller.core.decisions import refused_spec_repair
from migpart.controller.core.state import OperatorState
from migpart.controller.rounds.reconcile import PolicyRound
from migpart.controller.runtime import handlers
from migpart.errors import NotLeader
from migpart.kube.election import LeaderElector, Unelected
from migpart.kube.slice_publisher import SlicePublisher
from migpart.mig import Instance
from migpart.testing.effects import InMemoryEffects, Refused
from migpart.testing.leases import InMemoryLeaseStore
from tests.unit.controller.factories import claim, offline_state, one_gpu, world


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


async def leader() -> tuple[LeaderElector, Clock]:
    clock = Clock()
    elector = LeaderElector(InMemoryLeaseStore(), "me", clock=clock)
    assert await elector.try_acquire_or_renew()
    return elector, clock


def operator(effects: InMemoryEffects, publisher: Any = None) -> OperatorState:
    return offline_state(effects, publisher=publisher)


async def test_a_spec_carries_the_terms_fencing_token() -> None:
    elector, _ = await leader()
    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes), leadership=elector, term=elector.current())
    state = operator(effects)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    [(_, spec)] = effects.specs
    assert spec.leader_term == 0
    assert effects.refused == []


async def test_without_election_a_spec_carries_no_token() -> None:
    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes), leadership=Unelected())
    state = operator(effects)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    [(_, spec)] = effects.specs
    assert spec.leader_term is None


async def test_a_round_whose_term_ends_in_the_destroy_window_writes_no_spec() -> None:
    """The leader withdraws a device, then is frozen past its renew deadline (the clock jumps
    while the round waits): the quorum read may still run (a read), but the spec that drops the
    device, the status and the Event are refused and recorded, not sent."""
    elector, clock = await leader()
    nodes = {"a": one_gpu("a", 1, ("7g.80gb", 0, "Free"))}
    effects = InMemoryEffects(mignodes=dict(nodes), leadership=elector, term=elector.current())

    async def frozen(node: str, devices: frozenset[str]) -> None:
        clock.now += 30  # SIGSTOP, SIGCONT: no renewal for longer than the deadline

    effects.on_withdraw = frozen
    state = operator(effects)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    with pytest.raises(NotLeader):
        await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    assert effects.withdrawals == [("a", frozenset({"gpu-0-7g80gb-0"}))]
    assert effects.specs == []
    assert effects.statuses == []
    assert effects.refused == [Refused("spec", "a")]
    assert [j.step for j in state.hooks.journal] == ["withdrawn", "confirmed"]


async def test_a_round_of_an_earlier_term_writes_nothing_when_the_process_leads_again() -> None:
    elector, clock = await leader()
    old = elector.current()
    clock.now += 30  # the term ends; nobody else took the Lease, so this process takes it again
    assert await elector.try_acquire_or_renew()
    new = elector.current()
    assert new is not None
    assert new is not old
    nodes = {"a": one_gpu("a", 1)}
    effects = InMemoryEffects(mignodes=dict(nodes), leadership=elector, term=old)
    state = operator(effects)
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    with pytest.raises(NotLeader):
        await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    assert effects.specs == []
    assert effects.events == []
    assert effects.refused == [Refused("event", "pa")]  # the first write it tried
    # the port of the new term writes, stamped with the new token (a later round: this one
    # would be paced after the plan it just made)
    state = operator(effects.under(new))
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    [(_, spec)] = effects.specs
    assert spec.leader_term == new.token == 1


async def test_a_standby_publishes_no_slice_and_writes_no_condition() -> None:
    """Node health runs on the standby too (its verdicts stay warm), but nothing is written;
    the marks wait for the term (take_over writes them)."""
    elector = LeaderElector(InMemoryLeaseStore(), "standby", clock=Clock())
    effects = InMemoryEffects(leadership=elector, term=None)
    publisher = SlicePublisher(cast(Any, None))
    state = operator(effects, publisher)
    body = one_gpu("a", 5)
    publisher.observe(MigNode.model_validate(body))
    state.health.mignode("a", None)
    state.stale.pending["a"] = True
    await handlers._node_health_tick(state)
    await handlers.mark_stale(state)
    assert effects.published == []
    assert effects.conditions == []
    assert effects.refused == []  # not even tried
    assert state.stale.pending == {"a": True}
    # leading now: the port bound to the term writes the mark and the slice
    assert await elector.try_acquire_or_renew()
    handlers.lead(state, elector.current())
    await handlers.take_over(state)
    assert effects.published == ["a"]
    assert [(node, version) for node, version, _ in effects.conditions] == [("a", "5")]
    assert state.metrics.leader._value.get() == 1


def refused(spec_term: int | None, status_term: int | None) -> MigNode:
    body = one_gpu("a", 7, ("3g.40gb", 0, "Free"))
    body["spec"] = {
        "planId": "stale",
        "gpus": [{"index": 0, "instances": [{"profile": "1g.10gb", "start": 0}]}],
        **({"leaderTerm": spec_term} if spec_term is not None else {}),
    }
    body["status"]["observedPlanId"] = "applied"
    if status_term is not None:
        body["status"]["leaderTerm"] = status_term
    return MigNode.model_validate(body)


def test_a_refused_spec_is_replaced_by_what_the_agent_has() -> None:
    """A stale leader's spec landed after the new leader's (token 4 < 5 applied): the agent
    refused it, so the leader writes the node's actual layout under its applied planId."""
    repaired = refused_spec_repair(refused(4, 5), token=5)
    assert repaired is not None
    assert repaired.plan_id == "applied"
    assert repaired.desired() == {0: frozenset({Instance("3g.40gb", 0)})}


@pytest.mark.parametrize(
    ("spec_term", "status_term", "token"),
    [
        (5, 5, 5),  # applied (or about to be): nothing refused
        (None, 5, 5),  # without a token: applied as before
        (4, None, 5),  # the agent never applied a token
        (4, 5, None),  # no election: nothing to fence
        (4, 6, 5),  # the agent applied a newer leadership than ours: ours would be refused too
    ],
)
def test_no_repair_without_a_refusal_this_leader_can_fix(
    spec_term: int | None, status_term: int | None, token: int | None
) -> None:
    assert refused_spec_repair(refused(spec_term, status_term), token) is None
