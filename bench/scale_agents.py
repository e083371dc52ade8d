"""The agents of bench/scale.py: one process hosting the real agent of every simulated node.

Each node runs `migpart.agent.app.serve` exactly as `migpart agent --simulate` does (its own
MigNode watch, reconcile loop, checkpoint and simulated NVML of 8 x H100 80GB), minus the
kubelet plugin (there is no kubelet) and the metrics port; all of them share this process's one
asyncio loop and one ApiClient, whose connection limit is raised so that every node's watch
gets a connection. It exits on SIGTERM/SIGINT, which the kernel also sends when its parent
dies, so a killed benchmark leaves no agents behind.

Usage (bench/scale.py starts it): `python -m bench.scale_agents --kubeconfig K --nodes-file F
--state-dir D [--latency-ms 0]`, with one node name per line in F.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

import aiohttp
import structlog
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from bench.scale_processes import die_with_parent
from migpart import logs
from migpart.agent.app import AgentConfig, serve
from migpart.kube.client import api_client

H100 = "NVIDIA H100 80GB HBM3"
GPUS_PER_NODE = 8
# Connections beyond one watch per node: status writes, GETs, re-lists.
SPARE_CONNECTIONS = 128
# Agents started per step: a thousand TLS handshakes at once only slow each other down.
START_STEP = 50
# What a crashed agent process would wait before its DaemonSet restarted it.
RESTART_S = 2.0

log = structlog.get_logger("bench.scale_agents")


def agent_config(node: str, state_dir: Path, latency_ms: float) -> AgentConfig:
    root = state_dir / node
    return AgentConfig(
        node=node,
        simulate=[(H100, GPUS_PER_NODE)],
        sim_latency_s=latency_ms / 1000.0,
        state_dir=root / "state",
        cdi_dir=root / "cdi",
        plugin_dir=root / "plugins",
        registration_dir=root / "registry",
        kubelet_plugin=False,
        metrics_port=0,
    )


async def supervise(config: AgentConfig, api: ApiClient) -> None:
    """Run one node's agent; restart it after an API error ends it (e.g. at start-up, where
    a real agent process would exit and be restarted), as its DaemonSet would."""
    while True:
        try:
            await serve(config, api)
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            log.warning("agent_restarted", node=config.node, error=str(err))
        await asyncio.sleep(RESTART_S)


async def host(nodes: list[str], kubeconfig: Path, state_dir: Path, latency_ms: float) -> None:
    cfg = Configuration()
    await kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = len(nodes) + SPARE_CONNECTIONS
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if main is not None:
            loop.add_signal_handler(sig, main.cancel)
    async with api_client(cfg) as api, asyncio.TaskGroup() as group:
        for i, node in enumerate(nodes):
            group.create_task(supervise(agent_config(node, state_dir, latency_ms), api), name=node)
            if i % START_STEP == START_STEP - 1:
                await asyncio.sleep(0.2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--nodes-file", type=Path, required=True, help="one node name per line")
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--latency-ms", type=float, default=0.0, help="simulated NVML latency")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args()
    logs.configure(args.log_level, json=True)
    nodes = args.nodes_file.read_text().split()
    die_with_parent()
    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        asyncio.run(host(nodes, args.kubeconfig, args.state_dir, args.latency_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
