"""The planning loop: when a policy's rounds run."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from migpart.controller import loop
from migpart.controller.effects import InMemoryEffects
from migpart.controller.reconcile import PolicyRound
from migpart.controller.scope import Cluster
from migpart.controller.state import OperatorState
from migpart.controller.workers import Signals
from tests.unit.controller.factories import claim
from tests.unit.controller.test_round import one_gpu, operator, world


def indexed(state: OperatorState, cluster: Cluster) -> OperatorState:
    """`state` with kopf-like index views of `cluster` (index id -> key -> stored values)."""
    one_each: dict[str, Mapping[str, Any]] = {
        "mignodes_index": cluster.mignodes,
        "nodes_index": cluster.node_facts,
        "policies_index": cluster.policies,
        "claims_index": cluster.claims,
        "classes_index": cluster.device_classes,
    }
    indexes = {index: {k: [v] for k, v in values.items()} for index, values in one_each.items()}
    indexes["waiting_index"] = {k: list(v) for k, v in cluster.waiting.items()}
    state.indexes = indexes
    return state


async def until(event: asyncio.Event, loop_task: asyncio.Task[None]) -> None:
    """Wait for `event`, or for the loop to end early (its error is raised at the end)."""
    waiter = asyncio.create_task(event.wait())
    await asyncio.wait({waiter, loop_task}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()


async def test_changes_do_not_bring_a_held_back_plan_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch window is open: a burst of changes must not each run a round (each would scope
    the whole cluster only to find the plan still held back); the next round runs when the
    window ends, and plans."""
    nodes = {"a": one_gpu("a", 1)}
    cluster = world(nodes, [claim("c1", "3g.40gb")], batchWindowSeconds=1)
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = indexed(operator(effects), cluster)
    rounds: list[bool] = []
    held, planned = asyncio.Event(), asyncio.Event()
    real_run = PolicyRound.run

    async def counted(self: PolicyRound) -> Any:
        result = await real_run(self)
        rounds.append(self.deferred)
        (held if self.deferred else planned).set()
        return result

    monkeypatch.setattr(PolicyRound, "run", counted)
    signals = Signals()
    task = asyncio.create_task(loop.plan_policy(state, "pa", signals))
    try:
        await until(held, task)
        for _ in range(20):  # a burst of pod events inside the window
            state.wake_all()
            signals.wake.set()
            await asyncio.sleep(0.01)
        assert rounds == [True]  # one round, held back by the window; no round per change
        await until(planned, task)
        assert rounds[-1] is False  # the window ended: planned
        assert effects.specs
    finally:
        signals.stopped.set()
        await task  # raises what ended the loop early, if anything did


async def test_after_a_plan_changes_wait_for_the_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a plan, the next one is paced: a burst of changes runs no round before
    that (each would scope the whole cluster only to be paced)."""
    from migpart.controller import reconcile

    monkeypatch.setattr(reconcile, "PACE_FACTOR", 1e6)  # the next plan is hours away
    nodes = {"a": one_gpu("a", 1)}
    cluster = world(nodes, [claim("c1", "3g.40gb")])
    state = indexed(operator(InMemoryEffects(mignodes=dict(nodes))), cluster)
    rounds: list[bool] = []
    planned = asyncio.Event()
    real_run = PolicyRound.run

    async def counted(self: PolicyRound) -> Any:
        result = await real_run(self)
        rounds.append(self.deferred)
        planned.set()
        return result

    monkeypatch.setattr(PolicyRound, "run", counted)
    signals = Signals()
    task = asyncio.create_task(loop.plan_policy(state, "pa", signals))
    try:
        await until(planned, task)
        assert rounds == [False]
        for _ in range(20):
            state.wake_all()
            signals.wake.set()
            await asyncio.sleep(0.01)
        assert rounds == [False]
    finally:
        signals.stopped.set()
        await task
