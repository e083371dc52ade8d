"""The agent loop: reconcile whenever the spec changes, a claim is (un)prepared, or a resync
period passes, and write the result to MigNode.status.

Fencing: a spec carries the fencing token of the operator leadership that wrote it
(`spec.leaderTerm`). The agent keeps the highest token it applied (in `status.leaderTerm`, so a
restarted agent still knows it) and refuses a spec with a lower one: written by a leader that
lost its Lease after a newer leader wrote here. It applies nothing of such a spec (it goes on
with the spec it had), logs `spec_refused` and posts a Warning Event `SpecRefused` on its
MigNode. A spec without a token (an operator running without leader election, or one from
before it) is applied as before and leaves the highest token as it is.

The overlap guard (`migpart.agent.publishers`): while NVIDIA's device plugin or DRA driver
offers the node's GPUs, a pass carries out no spec (it creates and destroys nothing) and the
status says why in its `PublisherOverlap` condition; the check runs at the first pass and then
at most once per resync period.

Unusable placements (`migpart.agent.failures`): on an offering node, a pass first retries the
placements the kubelet plugin reported unusable whose back-off is over, clears the reports of
those whose instance it then finds (however made), and adds the others to
`status.failedInstances` (after the pass's own failures to create what the spec lists; one
entry per placement) with a Warning Event `PlacementUnusable` once per report. A node that does
not offer reports none and forgets them.

The loop is level-triggered: a trigger only says "look again"; every pass reads the latest
spec and the whole NVML state. Failures of one pass (an NVML error, a status write the API
server refused or never answered) are logged, counted and retried with backoff; they never
kill the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import aiohttp
import structlog
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.agent.failures import PlacementFailures, retry_due
from migpart.agent.publishers import PUBLISHERS, Overlap, PublisherProbe
from migpart.agent.reconciler import condition, reconcile_once
from migpart.api.models import PUBLISHER_OVERLAP
from migpart.clock import Clock, RealClock
from migpart.errors import GpuBusy, NvmlFailure, ResourceNotServed
from migpart.slices.dra import now_iso

if TYPE_CHECKING:
    from collections.abc import Callable

    from migpart.agent.backend import NvmlBackend
    from migpart.agent.checkpoint import Checkpoint
    from migpart.agent.kube import MigNodeStore
    from migpart.agent.metrics import AgentMetrics
    from migpart.api.models import (
        Condition,
        FailedInstance,
        KubeletPluginStatus,
        MigNodeSpec,
        MigNodeStatus,
    )

log = structlog.get_logger("migpart.agent")

MAX_BACKOFF_S = 30.0
# `status.failedInstances` holds at most this many entries (the CRD's maxItems)
MAX_FAILED_INSTANCES = 64


class Agent:
    """One node's reconcile loop."""

    def __init__(
        self,
        node: str,
        backend: NvmlBackend,
        checkpoint: Checkpoint,
        store: MigNodeStore,
        metrics: AgentMetrics,
        *,
        resync_s: float = 30.0,
        backoff_s: float = 1.0,
        registration: Callable[[], KubeletPluginStatus | None] | None = None,
        publishers: PublisherProbe | None = None,
        allow_overlap: bool = False,
        clock: Clock | None = None,
        failures: PlacementFailures | None = None,
    ) -> None:
        self.node = node
        self.backend = backend
        self.checkpoint = checkpoint
        self.store = store
        self.metrics = metrics
        self.resync_s = resync_s
        self.backoff_s = backoff_s
        self.trigger = asyncio.Event()
        self.spec: MigNodeSpec | None = None
        self.status: MigNodeStatus | None = None
        # the highest fencing token applied (status.leaderTerm), and the spec last refused
        # (told once, though the watch shows it again with every status write)
        self.leader_term: int | None = None
        self.refused: MigNodeSpec | None = None
        # `store.created` when `status` was written: a MigNode created since has none
        self.written_on = -1
        # what kubelet said about the plugin's registration, reported in the status (None:
        # not reported, the agent runs without a kubelet that registers it)
        self.registration = registration
        # the last pass had an NVML error creating an instance: the next one comes with back-off
        self.failing = False
        # the overlap guard (module docstring): None runs without it (no API server to ask)
        self.publishers = publishers
        self.allow_overlap = allow_overlap
        self.overlap: Overlap | None = None
        self._overlap_checked: float | None = None  # monotonic time of the last check
        # when the loop waits, and the unusable placements' back-offs
        self.clock = clock if clock is not None else RealClock()
        # the placements an offering node's prepares keep failing to make (shared with the
        # kubelet plugin, which counts them)
        self.failures = (
            failures if failures is not None else PlacementFailures(node, checkpoint, self.clock)
        )
        # the unusable placements told in a Warning Event
        self._told_unusable: set[tuple[int, str, int]] = set()

    def offering(self) -> bool:
        """Whether the spec applied says Offer (`MigNodeSpec.allocation`) and the agent carries
        specs out (no other publisher on the node): prepare may then make room."""
        held = self.overlap is not None and not self.allow_overlap
        return not held and self.spec is not None and self.spec.allocation == "Offer"

    def poke(self) -> None:
        """Ask for a reconcile pass soon (e.g. after a claim was prepared)."""
        self.trigger.set()

    async def _follow_specs(self) -> None:
        async for spec in self.store.specs():
            if await self.accepts(spec):
                self.spec = spec
                self.trigger.set()

    async def accepts(self, spec: MigNodeSpec | None) -> bool:
        """Whether to apply `spec` (module docstring, "Fencing"); a refusal is told."""
        token = spec.leader_term if spec is not None else None
        if token is None or self.leader_term is None or token >= self.leader_term:
            if token is not None:
                self.leader_term = max(token, self.leader_term or 0)
            return True
        assert spec is not None
        if spec == self.refused:
            return False
        self.refused = spec
        message = (
            f"spec of plan {spec.plan_id} refused: written under operator leadership {token}, "
            f"older than leadership {self.leader_term} whose spec this node applied already"
        )
        log.warning(
            "spec_refused",
            node=self.node,
            plan_id=spec.plan_id,
            leader_term=token,
            applied_leader_term=self.leader_term,
        )
        try:
            await self.store.warn("SpecRefused", message)
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            log.warning("event_failed", node=self.node, error=str(err)[:200])
        return False

    async def reconcile(self) -> None:
        """One pass: converge, then write the status if it changed. Its duration is recorded
        only when the whole pass, status write included, succeeded."""
        started = time.monotonic()
        await self._check_publishers(started)
        held = self.overlap is not None and not self.allow_overlap
        offering = self.offering()
        if offering:
            assert self.spec is not None
            await retry_due(
                self.failures,
                self.backend,
                self.checkpoint,
                self.spec.desired(),
                counted=lambda kind: self.metrics.operations.labels(self.node, kind).inc(),
            )
        else:
            self.failures.forget()
        now = now_iso()
        result = await reconcile_once(
            None if held else self.spec,
            self.backend,
            self.checkpoint,
            previous=self.status,
            now=now,
        )
        for op in result.ops:
            self.metrics.operations.labels(self.node, op.kind).inc()
        for code in result.nvml_errors:
            self.metrics.nvml_error(code)
        self.failing = bool(result.nvml_errors)
        status = result.status
        if offering:  # what exists works, however it was made (by this pass, say)
            self.failures.exist(
                (g.index, i.profile, i.start) for g in status.gpus for i in g.instances if i.uuid
            )
        unusable = self.failures.reports() if offering else []
        await self._warn_failed(status.failed_instances, unusable)
        await self._warn_unusable(unusable)
        status = status.model_copy(
            update={"failed_instances": _merged(unusable, status.failed_instances)}
        )
        before = set(self.status.lost_gpus) if self.status is not None else set()
        for gpu in sorted(set(status.lost_gpus) - before):
            log.warning("gpu_lost", node=self.node, gpu=gpu, error="NVML_ERROR_GPU_IS_LOST")
        for gpu in sorted(before - set(status.lost_gpus)):
            log.info("gpu_back", node=self.node, gpu=gpu)
        if self.registration is not None:
            status = status.model_copy(update={"kubelet_plugin": self.registration()})
        status = status.model_copy(update={"leader_term": self.leader_term})
        if self.publishers is not None:
            status = status.model_copy(
                update={"conditions": [*status.conditions, self._overlap_condition(now)]}
            )
        created = self.store.created
        if status != self.status or created != self.written_on:
            await self.store.write_status(status)
            log.info(
                "mignode_status_written",
                node=self.node,
                converged=result.converged,
                plan_id=status.observed_plan_id,
                ops=len(result.ops),
            )
        self.status, self.written_on = status, created
        self.metrics.reconcile_seconds.labels(self.node).observe(time.monotonic() - started)
        self.metrics.observe_status(status)
        self.metrics.observe_unusable(unusable)
        self.metrics.ready = True

    async def _check_publishers(self, now_s: float) -> None:
        """Look for other publishers of the node's GPUs at the first pass and then at most once
        per resync period; a change is logged, counted and told in a Warning Event. A failed
        look keeps the last verdict (and is tried again at the next pass)."""
        if self.publishers is None:
            return
        checked = self._overlap_checked
        if checked is not None and now_s - checked < self.resync_s:
            return
        try:
            overlap = await self.publishers.overlap()
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            log.warning("publisher_check_failed", node=self.node, error=str(err)[:200])
            return
        self._overlap_checked = now_s
        before, self.overlap = self.overlap, overlap
        for publisher in PUBLISHERS:
            held = overlap is not None and publisher in overlap.found and not self.allow_overlap
            self.metrics.publisher_overlap.labels(self.node, publisher).set(1 if held else 0)
        if overlap == before:
            return
        if overlap is None:
            log.info("publisher_overlap_ended", node=self.node)
            return
        message = self._overlap_message(overlap)
        log.warning("publisher_overlap_found", node=self.node, overlap=message)
        try:
            await self.store.warn(PUBLISHER_OVERLAP, message)
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            log.warning("event_failed", node=self.node, error=str(err)[:200])

    def _overlap_message(self, overlap: Overlap) -> str:
        if self.allow_overlap:
            return f"{overlap.describe()}; managed anyway (--allow-publisher-overlap)"
        return (
            f"{overlap.describe()}: migpart creates and destroys nothing here and the operator "
            "publishes no device of this node, so that no MIG device is offered twice. Move "
            "the node to migpart (docs/gpu-operator.md#moving-a-node-to-migpart) or, if you "
            "know better, set --allow-publisher-overlap (chart: agent.allowPublisherOverlap)"
        )

    def _overlap_condition(self, now: str) -> Condition:
        overlap = self.overlap
        if overlap is None:
            return condition(
                PUBLISHER_OVERLAP,
                False,
                "NoOtherPublisher",
                "neither NVIDIA's device plugin nor its DRA driver offers this node's GPUs",
                self.status,
                now,
            )
        reason = "Overridden" if self.allow_overlap else overlap.reason
        message = self._overlap_message(overlap)
        return condition(
            PUBLISHER_OVERLAP, not self.allow_overlap, reason, message, self.status, now
        )

    async def _warn_failed(
        self, failed_instances: list[FailedInstance], unusable: list[FailedInstance]
    ) -> None:
        """A Warning Event on the MigNode for each instance of the spec newly not created
        (refused as overlapping, or refused by NVML): once per failure, not once per pass. A
        placement reported unusable has its own Event (`_warn_unusable`)."""
        before = set(self.status.failed_instances) if self.status is not None else set()
        reported = {(u.gpu, u.profile, u.start) for u in unusable}
        for failed in failed_instances:
            if failed in before or (failed.gpu, failed.profile, failed.start) in reported:
                continue
            reason = "InstanceRefused" if failed.reason == "Overlap" else "InstanceNotCreated"
            await self._warn(reason, failed)

    async def _warn_unusable(self, unusable: list[FailedInstance]) -> None:
        """A Warning Event `PlacementUnusable` for each placement newly reported unusable
        (not for each further failed prepare: those change only the count in its message)."""
        before = self._told_unusable
        self._told_unusable = {(u.gpu, u.profile, u.start) for u in unusable}
        for u in unusable:
            if (u.gpu, u.profile, u.start) not in before:
                await self._warn("PlacementUnusable", u)

    async def _warn(self, reason: str, failed: FailedInstance) -> None:
        message = f"{failed.profile}@{failed.start} on GPU {failed.gpu}: {failed.message}"
        try:
            await self.store.warn(reason, message[:1024])
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            log.warning("event_failed", node=self.node, error=str(err)[:200])

    async def ensure(self) -> MigNodeSpec | None:
        """The MigNode's spec once it exists. Until the API server serves MigNodes (the agent
        started before its CRD), or answers at all, retry with back-off; a missing CRD is told
        in one log line per outage, not one per attempt. Readiness stays false meanwhile: it
        comes with the first status written."""
        backoff = self.backoff_s
        missing: str | None = None
        while True:
            try:
                spec = await self.store.ensure()
            except ResourceNotServed as err:
                if missing is None:
                    log.warning(
                        "resource_not_served",
                        node=self.node,
                        resource=err.resource,
                        retry=f"with back-off up to {MAX_BACKOFF_S:g} s",
                    )
                missing = err.resource
            except (TimeoutError, ApiException, aiohttp.ClientError) as err:
                log.warning(
                    "mignode_ensure_failed", node=self.node, error=str(err), retry_s=backoff
                )
            else:
                if missing is not None:
                    log.info("resource_served", node=self.node, resource=missing)
                return spec
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def run(self) -> None:
        """Run until cancelled."""
        spec = await self.ensure()
        self.leader_term = self.store.leader_term
        self.spec = spec if await self.accepts(spec) else None
        follower = asyncio.create_task(self._follow_specs(), name=f"mignode-watch-{self.node}")
        backoff = self.backoff_s
        try:
            while True:
                self.trigger.clear()
                try:
                    await self.reconcile()
                    if self.failing:  # written in the status; tried again with back-off
                        delay, backoff = backoff, min(backoff * 2, 60.0)
                    else:
                        backoff = self.backoff_s
                        delay = self.resync_s
                    retry_s = self.failures.next_retry_s() if self.offering() else None
                    if retry_s is not None:  # an unusable placement's retry is due then
                        delay = min(delay, retry_s)
                except (NvmlFailure, GpuBusy) as err:
                    self.metrics.nvml_error(getattr(err, "code", None))
                    log.warning("reconcile_failed", node=self.node, error=str(err))
                    delay, backoff = backoff, min(backoff * 2, 60.0)
                except (TimeoutError, ApiException, aiohttp.ClientError, ResourceNotServed) as err:
                    self.metrics.status_write_failed()
                    log.warning("status_write_failed", node=self.node, error=str(err))
                    delay, backoff = backoff, min(backoff * 2, 60.0)
                await self.clock.wait(self.trigger, delay)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            self.metrics.alive = False


def _merged(unusable: list[FailedInstance], failed: list[FailedInstance]) -> list[FailedInstance]:
    """`status.failedInstances`: the unusable placements, then the pass's own failures to
    create what the spec lists that are not among them (one entry per placement), at most
    `MAX_FAILED_INSTANCES`."""
    reported = {(u.gpu, u.profile, u.start) for u in unusable}
    rest = [f for f in failed if (f.gpu, f.profile, f.start) not in reported]
    return [*unusable, *rest][:MAX_FAILED_INSTANCES]
