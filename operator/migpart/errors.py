"""The small error vocabulary of migpart.

Every layer raises one of these. On the operator side `migpart.controller.core.errors` decides in
one place what each means for a retry; the agent handles `GpuBusy` and `NvmlFailure` itself
(they never reach the operator); the CLI maps them to exit codes.
"""

from __future__ import annotations


class MigpartError(Exception):
    """Base of every error migpart raises on purpose."""


class InvalidInput(MigpartError):
    """Input that can never be processed as given; `path` names the offending field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class SelectorError(InvalidInput):
    """A CEL selector that does not compile, fails at run time, or yields no bool.

    DRA treats a runtime error as "this device does not match" and aborts the allocation; the
    operator reports it (an Event on the claim) instead of retrying. Raised by `kube.cel`,
    carried in `planning.demand.Unsatisfiable`.
    """

    def __init__(self, expression: str, message: str, *, runtime: bool = False) -> None:
        super().__init__("cel", f"{expression!r}: {message}")
        self.expression = expression
        self.reason = message
        self.runtime = runtime


class UnknownModel(InvalidInput):
    """A GPU model with no profile table (neither built in nor supplied)."""


class UnknownProfile(InvalidInput):
    """A MIG profile name that the GPU model does not offer."""


class GpuBusy(MigpartError):
    """NVML refused to destroy an instance because it is in use (agent only)."""


class NvmlFailure(MigpartError):
    """An NVML call failed; `code` is the NVML return code when known (agent only)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class StaleSnapshot(MigpartError):
    """The state a decision was based on changed underneath it; recompute and retry."""


class ResourceNotServed(MigpartError):
    """The API server does not serve a resource migpart needs yet (its CRD is not installed
    or not Established): wait and retry, it may come."""

    def __init__(self, resource: str) -> None:
        super().__init__(f"the API server does not serve {resource} (is its CRD installed?)")
        self.resource = resource


class NotLeader(MigpartError):
    """A write refused by the fence: this operator no longer holds the leadership term the
    write was decided under (or never held one). Nothing was sent."""
