"""One demo run on a local cluster: its settings, its nodes and policy, its replay.

`migpart demo` owns a whole testbed and runs these steps once; the e2e cross-check
(`tests/e2e/test_sim_crosscheck.py`) runs the same steps on the suite's shared cluster, with
its own node label, policy name and namespace, and compares the `Stats` with the simulator.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TextIO

from kubernetes_asyncio import config

from migpart.api.models import GROUP, GpuPartitionPolicy
from migpart.demo.cluster import LocalCluster
from migpart.demo.replay import NAMESPACE, Replay, Stats
from migpart.demo.trace import TracePod
from migpart.mig import ModelTable


@dataclass(frozen=True)
class DemoRun:
    """What one run replays, on which nodes, under which policy.

    The pods arrive over the first 60% of `duration_s` (`migpart.demo.trace.accelerate`); the
    replay looks until `duration_s` and then ends, pods still running or pending included.
    """

    table: ModelTable
    pods: tuple[TracePod, ...]
    duration_s: float
    nodes: int = 2
    gpus_per_node: int = 8
    sim_latency_ms: float = 50.0
    batch_window_s: int = 1
    max_concurrent_nodes: int = 2
    name: str = "demo"
    """The policy's name; nodes are `<node_prefix>-1`, ..."""
    node_prefix: str = "gpu-node"
    labels: Mapping[str, str] = field(default_factory=lambda: {f"{GROUP}/demo": "true"})
    """The nodes' labels: the policy selects them and the pods ask for them."""
    namespace: str = NAMESPACE

    @property
    def node_names(self) -> list[str]:
        return [f"{self.node_prefix}-{i + 1}" for i in range(self.nodes)]

    def policy(self) -> GpuPartitionPolicy:
        """The run's GpuPartitionPolicy (the simulator reads its settings from it too)."""
        return GpuPartitionPolicy.model_validate(
            {
                "metadata": {"name": self.name},
                "spec": {
                    "mode": "Active",
                    "nodeSelector": {"matchLabels": dict(self.labels)},
                    "reconfiguration": {
                        "batchWindowSeconds": self.batch_window_s,
                        "maxConcurrentNodes": self.max_concurrent_nodes,
                    },
                },
            }
        )


def start_nodes(cluster: LocalCluster, run: DemoRun) -> list[str]:
    """The run's GPU nodes (a kubelet and an agent each), once every agent reported its GPUs."""
    gpus = f"{run.table.model}:{run.gpus_per_node}"
    for name in run.node_names:
        cluster.add_gpu_node(name, gpus, dict(run.labels), run.sim_latency_ms)
    cluster.wait_for(
        "every agent to report its GPUs", lambda: agents_ready(cluster, run.node_names)
    )
    return run.node_names


def apply_policy(cluster: LocalCluster, run: DemoRun) -> None:
    body = run.policy().model_dump(mode="json", by_alias=True, exclude_none=True)
    cluster.testbed.kubectl("apply", "-f", "-", input=json.dumps(body))


def replay(cluster: LocalCluster, run: DemoRun, out: TextIO = sys.stdout) -> Stats:
    """Replay the run's pods for `duration_s` (blocking) and return what was seen."""
    return asyncio.run(_replay(cluster, run, out))


def agents_ready(cluster: LocalCluster, nodes: Collection[str] | None = None) -> bool:
    """Whether the agents of `nodes` (default: all the cluster's) reported their GPUs."""
    want = set(cluster.nodes if nodes is None else nodes)
    out = cluster.testbed.kubectl("get", "mignodes", "-o", "json", check=False)
    if not out:
        return False
    ready = {
        n["metadata"]["name"]
        for n in json.loads(out)["items"]
        if (n.get("status") or {}).get("gpus")
    }
    return want <= ready


async def _replay(cluster: LocalCluster, run: DemoRun, out: TextIO) -> Stats:
    api = await config.new_client_from_config(config_file=str(cluster.testbed.kubeconfig))
    try:
        replayer = Replay(
            api,
            list(run.pods),
            run.duration_s,
            out,
            namespace=run.namespace,
            node_selector=run.labels,
            nodes=run.node_names,
        )
        await replayer.setup(run.table)
        return await replayer.run()
    finally:
        await api.close()
