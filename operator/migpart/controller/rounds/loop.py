"""The planning loop of one policy: when to run a round, and what to do when one fails."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog

from migpart.controller.core.errors import Outcome, survive
from migpart.controller.core.state import OperatorState
from migpart.controller.core.workers import Signals
from migpart.controller.rounds.reconcile import PACE_FACTOR, STATUS_INTERVAL_S, PolicyRound
from migpart.controller.watching.indexes import cluster_now

log = structlog.get_logger(__name__)

# How long a woken planning loop waits before its round (see plan_policy).
SETTLE_S = 0.02
# An offering policy's next round comes at the earliest this long after its last (a policy
# change or a new node waits at most this long to be offered): its rounds plan nothing, and a
# claim's pending count is not written more often anyway (STATUS_INTERVAL_S). At 1,000 nodes
# two offering policies paced by their cost alone (about 30 ms a round) took 240 s of the
# operator's CPU in a 2,000-pod burst, beside a saturated kube-scheduler.
OFFER_ROUND_S = STATUS_INTERVAL_S
# A loop runs a round at least this often even when nothing it watches changed (a safety net,
# and what ends a quorum-read sighting that the claim watch never confirmed).
FULL_ROUND_S = 30.0


async def plan_policy(state: OperatorState, name: str, signals: Signals) -> None:
    """The planning loop of one policy (run by `state.workers`): a round whenever something it
    watches changed, when a held-back plan is due (batch window, pacing), after a failure's
    retry delay, and every FULL_ROUND_S regardless; every round recomputes from the indexes
    (through the shared scope cache). While a plan is held back, changes do not bring the
    next round forward: it could not plan sooner, and it sees every change when it runs (under
    a burst of pod events this is what keeps the rounds as few as the plans); an offering
    policy's round (which plans nothing) is paced the same way, by its own cost. Ends when
    stopped (the policy's DELETED event, or the operator's exit)."""
    wake, stopped = signals.wake, signals.stopped
    clock = state.clock
    reported: str | None = None  # the failure last told in an Event, while it lasts
    seen = -1  # state.changes when the last round began
    again = True  # the last round wants another one even if nothing changes
    last_round = 0.0
    state.metrics.start_policy(name)
    try:
        await state.watches.synced()
        while not stopped.is_set():
            wake.clear()
            wait = state.tick_s
            held_back = False
            if not state.leading():
                # a standby keeps its indexes warm and plans nothing; taking over wakes it
                again = True
            elif again or seen != state.changes or clock.monotonic() - last_round > FULL_ROUND_S:
                seen, last_round = state.changes, clock.monotonic()
                cluster = cluster_now(state)
                body = cluster.policies.get(name)
                again = False
                # an invalid policy is reported by policy_changed: wait for the next change
                if body is not None and state.scopes.policy(name, body) is not None:
                    round_ = PolicyRound(state, name, body, cluster)
                    began = time.perf_counter()
                    outcome = await survive(round_.run, state.tick_s)
                    cost_s = time.perf_counter() - began
                    wait = outcome.wait
                    again = round_.deferred or outcome.failure is not None
                    if round_.deferred and outcome.failure is None:
                        wait = min(wait, max(round_.retry_in_s, SETTLE_S))
                        held_back = True
                    elif outcome.failure is None and (paced_s := round_.paced_s()) > 0:
                        # it just planned: the next plan is paced, so is the next round
                        wait, held_back, again = paced_s, True, False
                    elif outcome.failure is None and round_.offering:
                        # an offering policy plans nothing, so no plan paces its rounds:
                        # under a burst of claims each round would follow the last at once.
                        # What its round writes (the nodes' mode, the status, warnings) can
                        # wait OFFER_ROUND_S; kube-scheduler serves the claims meanwhile
                        wait, held_back = max(PACE_FACTOR * cost_s, OFFER_ROUND_S), True
                    if outcome.failure is None and round_.status_due_in_s > 0:
                        # a status change held back (STATUS_INTERVAL_S): a round writes it then
                        wait, again = min(wait, round_.status_due_in_s), True
                    if outcome.failure is not None and round_.effects.leading():
                        report_failure(state, name, body, outcome, tell=outcome.failure != reported)
                    reported = outcome.failure
            if stopped.is_set():
                return
            if held_back:
                await clock.wait(stopped, wait)
                continue
            if await clock.wait(wake, wait):
                # Woken by a watch event: let a burst of events coalesce first.
                await clock.sleep(SETTLE_S)
    finally:
        state.metrics.forget_policy(name)
        state.rounds.memory(name).loop_stopped()


def report_failure(
    state: OperatorState, name: str, body: Mapping[str, Any], outcome: Outcome, *, tell: bool
) -> None:
    """Count and log a failed round; `tell`: also post a RoundFailed Event (once per distinct
    failure, not once per retry)."""
    assert outcome.failure is not None
    kind = "permanent" if outcome.permanent else "temporary"
    state.metrics.round_failures.labels(name, kind).inc()
    log.warning(
        "policy_round_failed",
        policy=name,
        kind=kind,
        error=outcome.failure,
        retry_in_s=outcome.wait,
    )
    if tell:
        state.effects.event(body, "Warning", "RoundFailed", outcome.failure[:1000])
