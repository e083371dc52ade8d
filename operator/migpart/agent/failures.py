"""Placements an offering node keeps failing to make at prepare, reported so that their devices
can be tainted, and retried until they work again.

On an offering node (`MigNodeSpec.allocation: Offer`) kube-scheduler allocates any placement of
the node's stable pool, and the kubelet plugin makes its instance at NodePrepareResources. A
prepare whose create fails (NVML refuses it: `NvmlError`) or is refused (an instance prepared
for another claim or running processes is in the way: `Overlap`) is an error kubelet retries for
ever, and the pod never starts. So the plugin counts failed prepares per placement; at
`FAILURES_BEFORE_UNUSABLE` in a row the placement is reported in `MigNode.status.failedInstances`,
and the operator taints its device NoExecute: kube-scheduler allocates it no more, and the pod
holding it is evicted and made again elsewhere by its controller.

The report goes when the placement works again: at a successful prepare of it, or when a retry
makes it. The agent's reconcile pass retries each reported placement once its back-off is over
(`RETRY_FIRST_S`, doubling up to `RETRY_MAX_S`, on the agent's clock): under the checkpoint lock,
the free instances in its way destroyed, then it created, exactly as a prepare would; the
instance made stays, free, for the next claim of the placement. Nothing prepared or running is
destroyed, and no placement is retried over an instance the spec lists (the spec wins). A retry
that fails leaves the report as it was.

The reports are kept in the checkpoint, so that an agent started again goes on reporting them
(retried at its first pass) instead of having the operator take the taints off until the
placements failed three more times. Counts below the threshold live in memory only: a restarted
agent counts them again. A GPU lost (`GPU_IS_LOST`) is no placement failure: it is reported in
`status.lostGpus`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from migpart.agent.checkpoint import UnusablePlacement
from migpart.agent.reconciler import make_placement_locked, overlapping, read_gpus
from migpart.api.models import FailedInstance
from migpart.clock import Clock, RealClock
from migpart.errors import GpuBusy, NvmlFailure
from migpart.mig import Instance, device_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from migpart.agent.backend import NvmlBackend
    from migpart.agent.checkpoint import Checkpoint, UnusableReason
    from migpart.agent.reconciler import OpKind

log = structlog.get_logger("migpart.agent.failures")

# failed prepares of a placement in a row after which it is reported unusable
FAILURES_BEFORE_UNUSABLE = 3
# back-off of a reported placement's retries: the first this long after the report, each one
# after that twice as long after the last, at most RETRY_MAX_S
RETRY_FIRST_S = 30.0
RETRY_MAX_S = 300.0

Placement = tuple[int, str, int]
"""(gpu, profile, start), as `Checkpoint.prepared` keys instances."""


class PlacementFailures:
    """The failed prepares of each placement of one node, its reports and their retries.

    Shared by the kubelet plugin (`failed`, `worked`) and the agent loop (`reports`, `due`,
    `retry_failed`, `forget`, through `retry_due`); its methods never await, so neither sees it
    half changed.
    """

    def __init__(self, node: str, checkpoint: Checkpoint, clock: Clock | None = None) -> None:
        self.node = node
        self.checkpoint = checkpoint
        self.clock = clock if clock is not None else RealClock()
        self._counts: dict[Placement, int] = {}
        self._reported = {u.placement: u for u in checkpoint.unusable()}
        # placement -> (when its next retry is due, on clock.monotonic; the back-off that led
        # to it); reports read back from the checkpoint are retried at the first pass, and
        # RETRY_FIRST_S after it if that one fails
        now = self.clock.monotonic()
        self._retries = {p: (now, RETRY_FIRST_S / 2) for p in self._reported}
        for placement, report in self._reported.items():
            self._counts[placement] = report.failures

    def failed(self, placement: Placement, reason: UnusableReason, error: str) -> bool:
        """Count one failed prepare of `placement`; True when its report is new or changed
        (the status should be written again)."""
        failures = self._counts.get(placement, 0) + 1
        self._counts[placement] = failures
        if failures < FAILURES_BEFORE_UNUSABLE:
            return False
        gpu, profile, start = placement
        first = placement not in self._reported
        self._reported[placement] = UnusablePlacement(gpu, profile, start, reason, error, failures)
        if first:
            self._retries[placement] = (self.clock.monotonic() + RETRY_FIRST_S, RETRY_FIRST_S)
            log.warning(
                "placement_unusable",
                node=self.node,
                device=device_name(gpu, profile, start),
                reason=reason,
                failures=failures,
                error=error,
            )
        self._save()
        return True

    def worked(self, placement: Placement) -> bool:
        """`placement`'s instance exists now (prepared, or made by a retry): its count and its
        report go. True when it was reported."""
        self._counts.pop(placement, None)
        self._retries.pop(placement, None)
        if self._reported.pop(placement, None) is None:
            return False
        log.info("placement_usable_again", node=self.node, device=device_name(*placement))
        self._save()
        return True

    def reports(self) -> list[FailedInstance]:
        """What `status.failedInstances` says of the unusable placements, in placement order."""
        return [
            FailedInstance(
                gpu=u.gpu,
                profile=u.profile,
                start=u.start,
                reason=u.reason,
                message=_message(u)[:1024],
            )
            for _, u in sorted(self._reported.items())
        ]

    def exist(self, placements: Iterable[Placement]) -> None:
        """The instances of `placements` exist (a pass read them): those reported work, as the
        pass made them (the spec lists them) or a prepare did."""
        for placement in set(placements) & set(self._reported):
            self.worked(placement)

    def due(self) -> list[Placement]:
        """The reported placements whose retry is due."""
        now = self.clock.monotonic()
        return sorted(p for p, (at, _) in self._retries.items() if at <= now)

    def next_retry_s(self) -> float | None:
        """Seconds until the next retry is due (0 when one is; None without reports)."""
        if not self._retries:
            return None
        return max(0.0, min(at for at, _ in self._retries.values()) - self.clock.monotonic())

    def retry_failed(self, placement: Placement, error: str) -> None:
        """A retry of `placement` did not make it: the next comes after twice the back-off.
        The report stays as it was (a new Event or status write per retry would say nothing
        new)."""
        retry = self._retries.get(placement)
        if retry is None:  # a prepare made it meanwhile
            return
        backoff_s = min(retry[1] * 2, RETRY_MAX_S)
        self._retries[placement] = (self.clock.monotonic() + backoff_s, backoff_s)
        log.info(
            "placement_retry_failed",
            node=self.node,
            device=device_name(*placement),
            error=error,
            retry_s=backoff_s,
        )

    def drop(self, placement: Placement, why: str) -> None:
        """Forget `placement`: it is no placement of the node any more (its GPU is gone, or
        its table lacks it), so there is no device to taint."""
        self._counts.pop(placement, None)
        self._retries.pop(placement, None)
        if self._reported.pop(placement, None) is not None:
            log.info(
                "placement_report_dropped", node=self.node, device=device_name(*placement), why=why
            )
            self._save()

    def forget(self) -> None:
        """Forget every count and report: the node no longer offers (its pool has no
        partitionable devices to taint, and its prepares make no room)."""
        self._counts.clear()
        self._retries.clear()
        if self._reported:
            self._reported.clear()
            self._save()

    def _save(self) -> None:
        self.checkpoint.set_unusable(self._reported.values())


def _message(u: UnusablePlacement) -> str:
    what = "refused" if u.reason == "Overlap" else "failed"
    return f"{u.failures} prepares in a row {what}; the last: {u.error}"


async def retry_due(
    failures: PlacementFailures,
    backend: NvmlBackend,
    checkpoint: Checkpoint,
    desired: Mapping[int, frozenset[Instance]],
    counted: Callable[[OpKind], None] = lambda kind: None,
) -> None:
    """Retry the reported placements whose back-off is over, on an offering node: each, under
    the checkpoint lock, made as a prepare makes it (`make_placement_locked`), unless it would
    overlap an instance the spec lists (`desired`, by GPU): the spec wins, and that instance is
    never destroyed for a retry. A retry never raises for one placement: what failed is logged
    and retried later (an NVML error reading the GPUs raises, as in a pass)."""
    due = failures.due()
    if not due:
        return
    gpus, lost = await read_gpus(backend)
    by_index = {g.info.index: g for g in gpus}
    for placement in due:
        gpu, profile, start = placement
        g = by_index.get(gpu)
        if g is None and gpu not in lost:
            failures.drop(placement, f"GPU {gpu} is no GPU of the node")
            continue
        if g is None or not g.info.mig_enabled:
            failures.retry_failed(placement, f"GPU {gpu} is lost or has MIG mode disabled")
            continue
        if not g.table.has(profile) or start not in g.table.profile(profile).placements:
            failures.drop(placement, f"{profile}@{start} is no placement of GPU {gpu}")
            continue
        inst = Instance(profile, start)
        wanted = overlapping(g.table, desired.get(gpu, frozenset()) - {inst}, inst)
        if wanted is not None:
            failures.retry_failed(
                placement, f"would overlap {wanted.profile}@{wanted.start}, which the spec lists"
            )
            continue
        try:
            async with checkpoint.lock:
                made = any(
                    (i.profile, i.start) == (profile, start) and i.ci_id is not None
                    for i in await backend.instances(gpu)
                )
                failure = None
                if not made:
                    failure = await make_placement_locked(
                        backend,
                        checkpoint,
                        g.table,
                        gpu,
                        inst,
                        destroyed=lambda: counted("destroy"),
                    )
        except (NvmlFailure, GpuBusy) as err:
            failures.retry_failed(placement, str(err))
            continue
        if failure is not None:
            failures.retry_failed(placement, failure.message)
            continue
        if not made:
            counted("create")
        failures.worked(placement)
