"""The agent loop: reconcile whenever the spec changes, a claim is (un)prepared, or a resync
period passes, and write the result to MigNode.status.

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

from migpart.agent.reconciler import reconcile_once
from migpart.dra import now_iso
from migpart.errors import GpuBusy, NvmlFailure

if TYPE_CHECKING:
    from migpart.agent.backend import NvmlBackend
    from migpart.agent.checkpoint import Checkpoint
    from migpart.agent.kube import MigNodeStore
    from migpart.agent.metrics import AgentMetrics
    from migpart.api.models import MigNodeSpec, MigNodeStatus

log = structlog.get_logger("migpart.agent")


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

    def poke(self) -> None:
        """Ask for a reconcile pass soon (e.g. after a claim was prepared)."""
        self.trigger.set()

    async def _follow_specs(self) -> None:
        async for spec in self.store.specs():
            self.spec = spec
            self.trigger.set()

    async def reconcile(self) -> None:
        """One pass: converge, then write the status if it changed. Its duration is recorded
        only when the whole pass, status write included, succeeded."""
        started = time.monotonic()
        result = await reconcile_once(
            self.spec, self.backend, self.checkpoint, previous=self.status, now=now_iso()
        )
        for op in result.ops:
            self.metrics.operations.labels(self.node, op.kind).inc()
        if result.status != self.status:
            await self.store.write_status(result.status)
            log.info(
                "mignode_status_written",
                node=self.node,
                converged=result.converged,
                plan_id=result.status.observed_plan_id,
                ops=len(result.ops),
            )
        self.status = result.status
        self.metrics.reconcile_seconds.labels(self.node).observe(time.monotonic() - started)
        self.metrics.observe_status(result.status)
        self.metrics.ready = True

    async def run(self) -> None:
        """Run until cancelled."""
        self.spec = await self.store.ensure()
        follower = asyncio.create_task(self._follow_specs(), name=f"mignode-watch-{self.node}")
        backoff = self.backoff_s
        try:
            while True:
                self.trigger.clear()
                try:
                    await self.reconcile()
                    backoff = self.backoff_s
                    delay = self.resync_s
                except (NvmlFailure, GpuBusy) as err:
                    self.metrics.nvml_error(getattr(err, "code", None))
                    log.warning("reconcile_failed", node=self.node, error=str(err))
                    delay, backoff = backoff, min(backoff * 2, 60.0)
                except (TimeoutError, ApiException, aiohttp.ClientError) as err:
                    self.metrics.status_write_failed()
                    log.warning("status_write_failed", node=self.node, error=str(err))
                    delay, backoff = backoff, min(backoff * 2, 60.0)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.trigger.wait(), timeout=delay)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            self.metrics.alive = False
