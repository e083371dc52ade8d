"""The planning loop: when a policy's rounds run."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from migpart.clock import ManualClock
from migpart.controller.core.state import OperatorState
from migpart.controller.core.workers import Signals
from migpart.controller.rounds import loop
from migpart.controller.rounds.reconcile import PACE_FACTOR, PolicyRound
from migpart.kube.features import DraFeatures
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import claim, one_gpu, policy, world
from tests.unit.controller.harness import clock_of, indexed, operator


async def until(event: asyncio.Event, loop_task: asyncio.Task[None]) -> None:
    """Wait for `event`, or for the loop to end early (its error is raised at the end)."""
    waiter = asyncio.create_task(event.wait())
    await asyncio.wait({waiter, loop_task}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()


async def waiting(clock: ManualClock, loop_task: asyncio.Task[None]) -> list[float]:
    """Until the loop waits on the clock (or ends early); the deadlines it waits for."""
    waiter = asyncio.create_task(clock.waiting())
    await asyncio.wait({waiter, loop_task}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    return clock.deadlines()


async def burst(state: OperatorState, signals: Signals) -> None:
    """A burst of pod events: every loop woken, 20 times."""
    for _ in range(20):
        state.wake_all()
        signals.wake.set()
        await asyncio.sleep(0.01)


class Rounds:
    """The policy's rounds as they run: whether each was held back (`deferred`), and an event
    for a round that ran, one for a held-back round and one for a round that planned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.deferred: list[bool] = []
        self.ran, self.held, self.planned = asyncio.Event(), asyncio.Event(), asyncio.Event()
        real_run = PolicyRound.run

        async def counted(round_: PolicyRound) -> Any:
            result = await real_run(round_)
            self.deferred.append(round_.deferred)
            self.ran.set()
            (self.held if round_.deferred else self.planned).set()
            return result

        monkeypatch.setattr(PolicyRound, "run", counted)


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> Rounds:
    return Rounds(monkeypatch)


@contextlib.asynccontextmanager
async def planning(
    state: OperatorState, policy: str, signals: Signals
) -> AsyncIterator[asyncio.Task[None]]:
    """The policy's planning loop runs for the block; stopped after it, and what ended it
    early, if anything did, raised."""
    task = asyncio.create_task(loop.plan_policy(state, policy, signals))
    try:
        yield task
    finally:
        signals.stopped.set()
        await task


async def test_changes_do_not_bring_a_held_back_plan_forward(rounds: Rounds) -> None:
    """A batch window is open: a burst of changes must not each run a round (each would scope
    the whole cluster only to find the plan still held back); the next round runs when the
    window ends on the operator's clock, and plans."""
    nodes = {"a": one_gpu("a", 1)}
    cluster = world(nodes, [claim("c1", "3g.40gb")], batchWindowSeconds=1)
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = indexed(operator(effects), cluster)
    clock = clock_of(state)
    signals = Signals()
    async with planning(state, "pa", signals) as task:
        await until(rounds.held, task)
        assert await waiting(clock, task) == [1.0]  # until the window ends
        await burst(state, signals)
        clock.advance(0.5)
        await burst(state, signals)
        assert rounds.deferred == [True]  # one round, held back by the window; none per change
        assert effects.specs == []
        clock.advance(0.5)
        await until(rounds.planned, task)
        assert rounds.deferred == [True, False]  # the window ended: planned
        assert effects.specs


async def test_after_a_plan_changes_wait_for_the_pace(rounds: Rounds) -> None:
    """Right after a plan, the next one is paced: a burst of changes runs no round before
    that (each would scope the whole cluster only to be paced); once the pace has passed on
    the operator's clock, the next round runs."""
    nodes = {"a": one_gpu("a", 1)}
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    state = indexed(operator(InMemoryEffects(mignodes=dict(nodes))), cluster)
    clock = clock_of(state)
    signals = Signals()
    async with planning(state, "pa", signals) as task:
        await until(rounds.ran, task)
        assert rounds.deferred == [False]
        [paced_until] = await waiting(clock, task)
        last = state.rounds.memory("pa").last_plan
        assert paced_until == pytest.approx(last.at + PACE_FACTOR * last.cost_s)
        await burst(state, signals)
        assert rounds.deferred == [False]
        rounds.ran.clear()
        clock.advance(paced_until - clock.monotonic())
        await until(rounds.ran, task)
        assert len(rounds.deferred) == 2


@pytest.mark.parametrize(
    ("cost_s", "pace_s"), [(1.0, PACE_FACTOR * 1.0), (0.01, loop.OFFER_ROUND_S)]
)
async def test_an_offering_policys_rounds_are_paced_by_their_cost(
    rounds: Rounds, monkeypatch: pytest.MonkeyPatch, cost_s: float, pace_s: float
) -> None:
    """An offering policy plans nothing, so no plan paces it: under a burst of claim events
    each round would follow the last at once (at 1,000 nodes and hundreds of pending claims,
    the operator's CPU beside kube-scheduler's). Its next round waits PACE_FACTOR x the last
    round's cost on the operator's clock, and at least OFFER_ROUND_S; a burst meanwhile runs
    none."""
    nodes = {"a": one_gpu("a", 1)}
    base = world(nodes, [claim("c1", "3g.40gb")])
    body = policy("pa", "a", reconfiguration={"batchWindowSeconds": 0}, allocation="Offer")
    cluster = dataclasses.replace(base, policies={"pa": body})
    state = indexed(operator(InMemoryEffects(mignodes=dict(nodes))), cluster)
    state.offer.dra = DraFeatures(True, True, "served: partitionable devices, device taints")
    state.offer.publishing = True
    clock = clock_of(state)
    # every round costs cost_s of the process's time
    ticks = iter(float(k) * cost_s for k in range(1000))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(ticks))
    signals = Signals()
    async with planning(state, "pa", signals) as task:
        await until(rounds.ran, task)
        assert state.offer.nodes.offered("a")
        assert await waiting(clock, task) == [pytest.approx(pace_s)]
        await burst(state, signals)
        assert len(rounds.deferred) == 1  # none per change
        rounds.ran.clear()
        clock.advance(pace_s)
        await until(rounds.ran, task)
        assert len(rounds.deferred) == 2


async def test_a_held_back_status_is_written_by_a_round_when_it_is_due(
    rounds: Rounds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round that held back a status change (a new pending count within STATUS_INTERVAL_S
    of the last write) says when it is due; the loop runs a round by then with no event, so
    the latest count is written even when the burst that moved it has ended."""
    nodes = {"a": one_gpu("a", 1)}
    body = policy("pa", "a", allocation="Offer")
    cluster = dataclasses.replace(world(nodes, [claim("c1", "3g.40gb")]), policies={"pa": body})
    state = indexed(operator(InMemoryEffects(mignodes=dict(nodes))), cluster)
    state.offer.dra = DraFeatures(True, True, "served: partitionable devices, device taints")
    state.offer.publishing = True
    clock = clock_of(state)
    # every round costs 1 s of the process's time: the next is paced PACE_FACTOR x that
    ticks = iter(float(k) * 1.0 for k in range(1000))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(ticks))
    real_write = PolicyRound.write_status

    async def holding_back(round_: PolicyRound, *args: Any) -> None:
        await real_write(round_, *args)
        if len(rounds.deferred) == 0:
            round_.status_due_in_s = 0.7

    monkeypatch.setattr(PolicyRound, "write_status", holding_back)
    signals = Signals()
    async with planning(state, "pa", signals) as task:
        await until(rounds.ran, task)
        assert await waiting(clock, task) == [pytest.approx(0.7)]
        rounds.ran.clear()
        clock.advance(0.7)
        await until(rounds.ran, task)
        assert len(rounds.deferred) == 2
        assert await waiting(clock, task) == [pytest.approx(0.7 + PACE_FACTOR * 1.0)]
