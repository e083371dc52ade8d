"""A policy round's failure becomes an Outcome: the planning loop survives every error."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.controller.core.errors import (
    API_DELAY_S,
    PERMANENT_RETRY_S,
    STALE_DELAY_S,
    Outcome,
    survive,
)
from migpart.errors import InvalidInput, MigpartError, StaleSnapshot


def failing(error: Exception) -> Callable[[], Awaitable[None]]:
    async def round_() -> None:
        raise error

    return round_


async def test_a_round_that_works_waits_one_tick() -> None:
    async def round_() -> None:
        return None

    assert await survive(round_, 0.5) == Outcome(0.5)


@pytest.mark.parametrize(
    ("error", "wait", "permanent"),
    [
        (ApiException(status=500, reason="Internal Server Error"), API_DELAY_S, False),
        (ApiException(status=422, reason="Unprocessable Entity"), PERMANENT_RETRY_S, True),
        (
            InvalidInput("status.gpus[0].instances[1]", "overlaps instance 0"),
            PERMANENT_RETRY_S,
            True,
        ),
        (StaleSnapshot("slice kept changing"), STALE_DELAY_S, False),
        (MigpartError("anything else"), API_DELAY_S, False),
    ],
)
async def test_a_failed_round_is_reported_and_retried_later(
    error: Exception, wait: float, permanent: bool
) -> None:
    outcome = await survive(failing(error), 0.5)
    assert outcome.wait == wait
    assert outcome.permanent is permanent
    assert outcome.failure


async def test_the_message_names_the_cause() -> None:
    outcome = await survive(failing(InvalidInput("spec.gpus[2]", "unknown profile 9g")), 1.0)
    assert outcome.failure == "spec.gpus[2]: unknown profile 9g"
    api = await survive(failing(ApiException(status=403, reason="Forbidden")), 1.0)
    assert api.failure == "API server refused: 403 Forbidden"


async def test_a_long_tick_is_never_shortened_by_a_quick_retry() -> None:
    outcome = await survive(failing(StaleSnapshot("moved")), 30.0)
    assert outcome == Outcome(30.0, "moved")


async def test_other_exceptions_are_bugs_and_propagate() -> None:
    with pytest.raises(ZeroDivisionError):
        await survive(failing(ZeroDivisionError("bug")), 1.0)
