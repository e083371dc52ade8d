"""Assembly of one agent: backend, checkpoint, CDI writer, kubelet plugin, MigNode store,
metrics, node lease, loop. `serve()` is what `migpart agent` runs, and what the demo and the
integration tests run in-process (several simulated nodes can share one process and one ApiClient).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from migpart.agent.cdi import CAPS_PROC, CdiWriter
from migpart.agent.checkpoint import Checkpoint
from migpart.agent.claims import KubeClaims
from migpart.agent.kube import KubeMigNodes
from migpart.agent.lease import NodeLease
from migpart.agent.metrics import AgentMetrics, HealthServer
from migpart.agent.publishers import KubePublishers
from migpart.agent.runner import Agent
from migpart.agent.simulator import SimFaults, SimulatedNvml
from migpart.api.leases import LEASE_DURATION_S, LEASE_NAMESPACE, LEASE_RENEW_S
from migpart.slices.dra import KUBELET_PLUGIN_DIR, KUBELET_REGISTRY_DIR

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from kubernetes_asyncio.client import ApiClient

    from migpart.agent.backend import NvmlBackend

log = structlog.get_logger("migpart.agent")


@dataclass
class AgentConfig:
    node: str
    simulate: list[tuple[str, int]] | None = None
    sim_latency_s: float = 0.0
    sim_faults: SimFaults | None = None
    state_dir: Path = Path("/var/lib/migpart")
    cdi_dir: Path = Path("/var/run/cdi")
    plugin_dir: Path = KUBELET_PLUGIN_DIR
    registration_dir: Path = KUBELET_REGISTRY_DIR
    kubelet_plugin: bool = True
    # report kubelet's plugin registration in the MigNode status (a kubelet that registers
    # plugins runs on this node); the operator then publishes devices only once registered
    report_registration: bool = False
    metrics_port: int = 8081
    metrics_host: str = "0.0.0.0"
    resync_s: float = 30.0
    lease_namespace: str = LEASE_NAMESPACE
    lease_duration_s: int = LEASE_DURATION_S
    lease_renew_s: float = LEASE_RENEW_S
    # manage the node even where NVIDIA's device plugin or DRA driver offers its GPUs too
    # (`migpart.agent.publishers`)
    allow_publisher_overlap: bool = False


# How long each part of the agent's shutdown may take (its tasks, the kubelet plugin's gRPC
# servers, the metrics server) before the agent logs it and goes on without it. The process
# (`migpart agent`) bounds the whole shutdown too: see `--stop-grace-seconds`.
STOP_GRACE_S = 5.0


async def stop_tasks(tasks: Sequence[asyncio.Task[None]], grace_s: float) -> None:
    """Cancel `tasks` and wait up to `grace_s` for them to end. One that has not ended by then
    is logged by name (an error: a task that ignores cancellation is a bug) and left behind.
    A task that failed re-raises its error here, as awaiting it would."""
    for task in tasks:
        task.cancel()
    done, pending = await asyncio.wait(tasks, timeout=grace_s)
    if pending:
        log.error(
            "agent_tasks_did_not_stop",
            tasks=sorted(t.get_name() for t in pending),
            grace_s=grace_s,
        )
    for task in tasks:
        if task in done and not task.cancelled():
            task.result()


async def bounded(
    what: str, stop: Callable[[], Awaitable[None]], grace_s: float = STOP_GRACE_S
) -> None:
    """Run one shutdown step for at most `grace_s`; log it and go on when it takes longer."""
    try:
        async with asyncio.timeout(grace_s):
            await stop()
    except TimeoutError:
        log.error("agent_stop_step_timed_out", step=what, grace_s=grace_s)


def _caps_root(config: AgentConfig) -> Path | None:
    """The driver's MIG capability files; simulated nodes use the driver's fixed numbering."""
    caps = Path(CAPS_PROC)
    return caps if config.simulate is None and caps.is_dir() else None


async def open_backend(config: AgentConfig) -> NvmlBackend:
    if config.simulate is not None:
        # The simulated GPUs' instances outlive the process, as a real GPU's do.
        return SimulatedNvml(
            config.simulate,
            node=config.node,
            latency_s=config.sim_latency_s,
            state_path=config.state_dir / "simulated-nvml.json",
            faults=config.sim_faults,
        )
    from migpart.agent.nvml import RealNvml

    return await RealNvml.open()


async def serve(
    config: AgentConfig,
    api: ApiClient,
    *,
    backend: NvmlBackend | None = None,
    started: asyncio.Event | None = None,
) -> None:
    """Run one agent until cancelled. `backend` overrides the one `config` describes (tests
    pass a simulator they keep a handle on)."""
    from migpart.agent.plugin import (  # loads grpc + generated code
        UNPREPARE_WAIT_S,
        DraDriver,
        KubeletPlugin,
    )

    own_backend = backend is None
    nvml = backend if backend is not None else await open_backend(config)
    checkpoint = Checkpoint(config.state_dir / "checkpoint.json")
    metrics = AgentMetrics(config.node)
    agent = Agent(
        config.node,
        nvml,
        checkpoint,
        KubeMigNodes(api, config.node),
        metrics,
        resync_s=config.resync_s,
        publishers=KubePublishers(api, config.node),
        allow_overlap=config.allow_publisher_overlap,
    )
    cdi = CdiWriter(config.cdi_dir, _caps_root(config))
    driver = DraDriver(
        config.node,
        nvml,
        KubeClaims(api),
        checkpoint,
        cdi,
        on_change=agent.poke,
        offering=agent.offering,
        counted=lambda kind: metrics.operations.labels(config.node, kind).inc(),
        failures=agent.failures,
        unprepare_wait_s=UNPREPARE_WAIT_S,
    )
    plugin = KubeletPlugin(driver, config.plugin_dir, config.registration_dir)
    if config.kubelet_plugin and config.report_registration:
        agent.registration = plugin.registration.status
        plugin.registration.on_change = agent.poke
    lease = NodeLease(
        api,
        config.node,
        namespace=config.lease_namespace,
        duration_s=config.lease_duration_s,
        renew_s=config.lease_renew_s,
        on_failure=metrics.lease_renewal_failures.labels(config.node).inc,
    )
    health = HealthServer(metrics, config.metrics_port, config.metrics_host)
    async with contextlib.AsyncExitStack() as stack:
        if own_backend:
            stack.push_async_callback(nvml.close)
        if config.metrics_port:
            port = await health.start()
            stack.push_async_callback(bounded, "metrics server", health.stop)
            log.info("metrics_listening", node=config.node, port=port)
        if config.kubelet_plugin:
            await plugin.start()
            stack.push_async_callback(bounded, "kubelet plugin", plugin.stop)
        log.info(
            "agent_started",
            node=config.node,
            simulated=config.simulate is not None,
            kubelet_plugin=config.kubelet_plugin,
        )
        heartbeat = asyncio.create_task(lease.run(), name=f"lease-{config.node}")
        task = asyncio.create_task(agent.run(), name=f"agent-{config.node}")
        if started is not None:
            started.set()
        try:
            await task
        finally:
            await stop_tasks((task, heartbeat), STOP_GRACE_S)
