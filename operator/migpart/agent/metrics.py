"""Prometheus metrics and the health endpoints of one agent.

Each agent has its own `CollectorRegistry`, so several simulated agents can live in one process
(the demo, tests) without clashing on the global registry. `/healthz` answers while the loop
runs; `/readyz` once the first reconcile has written a status (and the kubelet plugin listens,
when enabled).

The node's counters are created at zero when the agent starts (an NVML error code is known
only when it happens): an alert on `increase()` then sees the first failure too.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import get_args

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as CounterMetric
from prometheus_client.exposition import generate_latest

from migpart.agent.checkpoint import UnusableReason
from migpart.agent.publishers import PUBLISHERS
from migpart.agent.reconciler import OpKind
from migpart.api.models import FailedInstance, InstanceStateName, MigNodeStatus
from migpart.process_metrics import register_process_metrics


class AgentMetrics:
    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        self.instances = Gauge(
            "migpart_agent_mig_instances",
            "MIG instances on the node by profile and state",
            ["node", "profile", "state"],
            registry=self.registry,
        )
        self.nvml_errors = CounterMetric(
            "migpart_agent_nvml_errors",
            "NVML calls that failed, by NVML return code",
            ["node", "code"],
            registry=self.registry,
        )
        self.status_write_failures = CounterMetric(
            "migpart_agent_status_write_failures",
            "Reconcile passes whose MigNode status write failed (API server error or no answer)",
            ["node"],
            registry=self.registry,
        )
        self.lease_renewal_failures = CounterMetric(
            "migpart_agent_lease_renewal_failures",
            "Renewals of the node's Lease that failed (retried with back-off); the operator "
            "takes the node as unavailable once none succeeded for its lease timeout",
            ["node"],
            registry=self.registry,
        )
        self.operations = CounterMetric(
            "migpart_agent_mig_operations",
            "MIG instances created and destroyed",
            ["node", "kind"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "migpart_agent_reconcile_duration_seconds",
            "Duration of one reconcile pass",
            ["node"],
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.gpu_instances = Gauge(
            "migpart_agent_gpu_mig_instances",
            "MIG instances on each GPU of the node by state",
            ["node", "gpu", "state"],
            registry=self.registry,
        )
        self.gpus = Gauge(
            "migpart_agent_gpus",
            "GPUs NVML reports on the node by model (lost GPUs not counted)",
            ["node", "model"],
            registry=self.registry,
        )
        self.lost_gpus = Gauge(
            "migpart_agent_lost_gpus",
            "GPUs NVML reports lost on the node (GPU_IS_LOST)",
            ["node"],
            registry=self.registry,
        )
        self.publisher_overlap = Gauge(
            "migpart_agent_publisher_overlap",
            "1 while the agent manages nothing on the node because NVIDIA's device plugin or "
            "DRA driver (publisher) also offers its GPUs (0 with --allow-publisher-overlap)",
            ["node", "publisher"],
            registry=self.registry,
        )
        self.unusable_placements = Gauge(
            "migpart_agent_unusable_placements",
            "Placements of an offering node reported unusable (status.failedInstances) after "
            "failed prepares in a row, by the last failure's reason; the operator taints their "
            "devices NoExecute until a retry makes them",
            ["node", "reason"],
            registry=self.registry,
        )
        for publisher in PUBLISHERS:
            self.publisher_overlap.labels(node, publisher).set(0)
        for reason in get_args(UnusableReason):
            self.unusable_placements.labels(node, reason).set(0)
        for counter in (self.status_write_failures, self.lease_renewal_failures):
            counter.labels(node)
        for kind in get_args(OpKind):
            self.operations.labels(node, kind)
        self.reconcile_seconds.labels(node)
        self.lost_gpus.labels(node).set(0)
        register_process_metrics(self.registry)
        self.ready = False
        self.alive = True
        self._shown: dict[str, set[tuple[str, ...]]] = defaultdict(set)

    def observe_status(self, status: MigNodeStatus) -> None:
        """Set the per-status series, then drop the ones the status no longer has (never
        cleared first: a scrape in between would see no instance at all)."""
        counts: Counter[tuple[str, ...]] = Counter()
        per_gpu: dict[tuple[str, ...], int] = {}
        for gpu in status.gpus:
            per_state = Counter(inst.state for inst in gpu.instances)
            for state in get_args(InstanceStateName):
                per_gpu[(str(gpu.index), state)] = per_state[state]
            counts.update((inst.profile, inst.state) for inst in gpu.instances)
        models: dict[tuple[str, ...], int] = {
            (model,): n for model, n in Counter(gpu.model for gpu in status.gpus).items()
        }
        _replace(self.instances, self.node, counts, self._shown["instances"])
        _replace(self.gpu_instances, self.node, per_gpu, self._shown["gpu_instances"])
        _replace(self.gpus, self.node, models, self._shown["gpus"])
        self.lost_gpus.labels(self.node).set(len(status.lost_gpus))

    def observe_unusable(self, unusable: Iterable[FailedInstance]) -> None:
        """Set the unusable placements' gauge from the reports in the status written."""
        per_reason = Counter(u.reason for u in unusable)
        for reason in get_args(UnusableReason):
            self.unusable_placements.labels(self.node, reason).set(per_reason[reason])

    def nvml_error(self, code: int | None) -> None:
        self.nvml_errors.labels(self.node, str(code) if code is not None else "unknown").inc()

    def status_write_failed(self) -> None:
        self.status_write_failures.labels(self.node).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """`/metrics`, `/healthz`, `/readyz` over HTTP (aiohttp, already a kubernetes_asyncio
    dependency, so no thread is needed)."""

    def __init__(self, metrics: AgentMetrics, port: int, host: str = "0.0.0.0") -> None:
        self.metrics = metrics
        self.port = port
        self.host = host
        self._runner: web.AppRunner | None = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _healthz(self, _request: web.Request) -> web.Response:
        ok = self.metrics.alive
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "stopped\n")

    async def _readyz(self, _request: web.Request) -> web.Response:
        ok = self.metrics.ready
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not ready\n")

    async def start(self) -> int:
        """Listen; return the bound port (useful with port 0 in tests)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _replace(
    gauge: Gauge, node: str, values: Mapping[tuple[str, ...], int], shown: set[tuple[str, ...]]
) -> None:
    """Make `gauge`'s series of `node` exactly `values` (labels after the node's); `shown`
    holds the label sets it had, and is updated."""
    for labels, n in values.items():
        gauge.labels(node, *labels).set(n)
    for labels in shown - set(values):
        gauge.remove(node, *labels)
    shown.clear()
    shown.update(values)
