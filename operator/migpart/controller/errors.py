"""The one place where migpart's errors become kopf's retry decisions.

Permanent: input that will never work as given (retrying cannot help; the object must change).
Temporary: the world moved or a call failed; kopf retries the handler after `delay` seconds.

A policy's planning loop must not end on an expected error (the policy would silently stop
being served until it changes or the loop restarts): `survive` runs one round, reports
a failure and says how long to wait before the next one. A permanent failure is retried too,
only later (`PERMANENT_RETRY_S`) or as soon as something the policy watches changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.errors import (
    GpuBusy,
    InvalidInput,
    MigpartError,
    NvmlFailure,
    PlanInfeasible,
    StaleSnapshot,
)

STALE_DELAY_S = 1.0
BUSY_DELAY_S = 10.0
INFEASIBLE_DELAY_S = 30.0
API_DELAY_S = 5.0
PERMANENT_RETRY_S = 60.0


def to_kopf(error: MigpartError | ApiException) -> kopf.PermanentError | kopf.TemporaryError:
    """Map one error to kopf's vocabulary (see the module docstring)."""
    if isinstance(error, ApiException):
        if error.status in (400, 403, 422):
            return kopf.PermanentError(f"API server refused: {error.status} {error.reason}")
        return kopf.TemporaryError(
            f"API call failed: {error.status} {error.reason}", delay=API_DELAY_S
        )
    if isinstance(error, InvalidInput):
        return kopf.PermanentError(str(error))
    if isinstance(error, StaleSnapshot):
        return kopf.TemporaryError(str(error), delay=STALE_DELAY_S)
    if isinstance(error, GpuBusy):
        return kopf.TemporaryError(str(error), delay=BUSY_DELAY_S)
    if isinstance(error, PlanInfeasible):
        return kopf.TemporaryError(str(error), delay=INFEASIBLE_DELAY_S)
    if isinstance(error, NvmlFailure):
        return kopf.TemporaryError(str(error), delay=API_DELAY_S)
    return kopf.TemporaryError(str(error), delay=API_DELAY_S)


@contextmanager
def kopf_errors() -> Iterator[None]:
    """Run a handler body so that migpart and API errors leave it as kopf errors."""
    try:
        yield
    except (MigpartError, ApiException) as error:
        raise to_kopf(error) from error


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one round ended: the seconds to wait at most before the next round, and the
    failure if it failed (`permanent`: retrying as is cannot help)."""

    wait: float
    failure: str | None = None
    permanent: bool = False


async def survive(round_: Callable[[], Awaitable[object]], tick_s: float) -> Outcome:
    """Run one round; a migpart or API error becomes an Outcome instead of ending the caller.
    The wait is the tick, or the failure's retry delay when that is longer."""
    try:
        with kopf_errors():
            await round_()
    except kopf.TemporaryError as error:
        return Outcome(max(tick_s, error.delay or API_DELAY_S), str(error))
    except kopf.PermanentError as error:
        return Outcome(max(tick_s, PERMANENT_RETRY_S), str(error), permanent=True)
    return Outcome(tick_s)
