"""The kopf handlers' own writes go through the Effects port (controller/core/effects.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import kopf
import pytest

from migpart.controller.core.workers import Signals
from migpart.controller.runtime import handlers
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import policy
from tests.unit.controller.harness import clock_of, operator


async def test_an_invalid_policy_is_reported_through_the_write_port() -> None:
    """policy_changed reports an invalid spec as Ready=False in the policy status: written
    through the port (the twin records it, with the operator's clock as the transition time),
    and kopf is told the error is permanent."""
    effects = InMemoryEffects()
    state = operator(effects)
    clock_of(state).advance(90)

    async def idle(signals: Signals) -> None:
        await signals.stopped.wait()

    state.workers.ensure("pa", idle)  # the policy's planning loop runs already
    body = {**policy("pa", "a", generation=2), "spec": {"nodeSelector": 1}}
    try:
        with pytest.raises(kopf.PermanentError, match=r"spec invalid at spec\.nodeSelector"):
            await handlers.policy_changed(
                "MODIFIED",
                "pa",
                kopf.Body(cast("kopf.RawBody", body)),
                SimpleNamespace(state=state),
            )
    finally:
        await state.workers.close()
    [(name, status)] = effects.statuses
    assert name == "pa"
    assert status.observed_generation == 2
    [ready] = [c for c in status.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert ready.last_transition_time == "2026-01-01T00:01:30Z"
    assert state.rounds.memory("pa").status[0] == "uid-pa"
