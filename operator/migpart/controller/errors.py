"""The one place where migpart's errors become kopf's retry decisions.

Permanent: input that will never work as given (retrying cannot help; the object must change).
Temporary: the world moved or a call failed; kopf retries the handler (or restarts the daemon)
after `delay` seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
