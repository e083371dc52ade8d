"""The one place where the operator decides what an error means for a retry.

Permanent: input that will never work as given (retrying cannot help; the object must change).
Temporary: the world moved or a call failed; retry after a delay.

Only errors that can reach the operator are classified here: `InvalidInput` (from parsing a
MigNode or a claim), `StaleSnapshot` (the slice publisher) and API errors. `GpuBusy` and
`NvmlFailure` are the agent's: they never cross the API server, and the agent handles them
itself. Any other `MigpartError` is temporary with the API delay.

The consumer is a policy's planning loop, through `survive`. No kopf handler goes through
this module: the policy handler turns a `ValidationError` into `kopf.PermanentError` itself,
and the slice and node-health handlers log a failed write and try again on their next event
or tick. The loop must not end on an expected error (the policy would silently stop being
served until it changes or the loop restarts): `survive` runs one round, reports a failure
and says how long to wait before the next one. A permanent failure is retried too, only
later (`PERMANENT_RETRY_S`) or as soon as something the policy watches changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubernetes_asyncio.client.exceptions import ApiException

from migpart.errors import InvalidInput, MigpartError, StaleSnapshot

STALE_DELAY_S = 1.0
API_DELAY_S = 5.0
PERMANENT_RETRY_S = 60.0


@dataclass(frozen=True, slots=True)
class Failure:
    """What an error means: its message, whether retrying as is can help, and when to retry
    (a permanent failure only in case the object was fixed meanwhile)."""

    message: str
    permanent: bool
    retry_s: float


def classify(error: MigpartError | ApiException) -> Failure:
    """Map one error to a retry decision (see the module docstring)."""
    if isinstance(error, ApiException):
        if error.status in (400, 403, 422):
            message = f"API server refused: {error.status} {error.reason}"
            return Failure(message, True, PERMANENT_RETRY_S)
        return Failure(f"API call failed: {error.status} {error.reason}", False, API_DELAY_S)
    if isinstance(error, InvalidInput):
        return Failure(str(error), True, PERMANENT_RETRY_S)
    if isinstance(error, StaleSnapshot):
        return Failure(str(error), False, STALE_DELAY_S)
    return Failure(str(error), False, API_DELAY_S)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one round ended: the seconds to wait at most before the next round, and the
    failure if it failed (`permanent`: retrying as is cannot help)."""

    wait: float
    failure: str | None = None
    permanent: bool = False


async def survive(round_: Callable[[], Awaitable[object]], tick_s: float) -> Outcome:
    """Run one round; a migpart or API error becomes an Outcome instead of ending the caller.
    The wait is the tick, or the failure's retry delay when that is longer. Anything else is a
    bug and propagates."""
    try:
        await round_()
    except (MigpartError, ApiException) as error:
        failure = classify(error)
        return Outcome(max(tick_s, failure.retry_s), failure.message, failure.permanent)
    return Outcome(tick_s)
