"""The agent loop follows the spec, reports status and serves metrics and health."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.agent.kube import status_patch
from migpart.agent.metrics import AgentMetrics, HealthServer
from migpart.agent.runner import Agent
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import MigNodeSpec, MigNodeStatus
from migpart.commands.agent import config_from, parser
from migpart.slices.dra import DRIVER
from migpart.testing.mignodes import InMemoryMigNodes
from tests.unit.agent.conftest import H100, H200
from tests.unit.agent.helpers import one_gpu, running

if TYPE_CHECKING:
    from migpart.agent.checkpoint import Checkpoint


async def test_loop_follows_spec_changes_and_serves_metrics(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes()
    metrics = AgentMetrics("node-a")
    agent = Agent("node-a", sim, checkpoint, store, metrics, resync_s=3600)
    health = HealthServer(metrics, 0, "127.0.0.1")
    port = await health.start()
    try:
        async with running(agent):
            first = await store.wait_for(lambda s: bool(s.gpus))
            assert first.observed_plan_id is None
            await store.set_spec(one_gpu("p1", ("3g.40gb", 0), ("3g.40gb", 4)))
            done = await store.wait_for(lambda s: s.observed_plan_id == "p1")
            assert [i.profile for i in done.gpus[0].instances] == ["3g.40gb", "3g.40gb"]
            await store.set_spec(one_gpu("p2", ("7g.80gb", 0)))
            await store.wait_for(lambda s: s.observed_plan_id == "p2")
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{port}"
                async with http.get(f"{base}/readyz") as r:
                    assert r.status == 200
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 200
                async with http.get(f"{base}/metrics") as r:
                    text = await r.text()
            assert (
                'migpart_agent_mig_instances{node="node-a",profile="7g.80gb",state="Free"} 1.0'
                in text
            )
            assert 'migpart_agent_mig_operations_total{kind="destroy",node="node-a"} 2.0' in text
            assert "migpart_agent_reconcile_duration_seconds_count" in text
    finally:
        await health.stop()
    assert not metrics.alive


async def test_nvml_failure_is_counted_and_retried(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    import pynvml

    store = InMemoryMigNodes(one_gpu("p1", ("7g.80gb", 0)))
    metrics = AgentMetrics("node-a")
    sim.fail_next("create_gi", pynvml.NVML_ERROR_UNKNOWN)
    agent = Agent("node-a", sim, checkpoint, store, metrics, resync_s=3600, backoff_s=0.001)
    async with running(agent):
        await store.wait_for(lambda s: s.observed_plan_id == "p1")
    sample = metrics.registry.get_sample_value(
        "migpart_agent_nvml_errors_total",
        {"node": "node-a", "code": str(pynvml.NVML_ERROR_UNKNOWN)},
    )
    assert sample == 1


class FlakyStore(InMemoryMigNodes):
    """The API server refuses the first status write."""

    def __init__(self, spec: MigNodeSpec) -> None:
        super().__init__(spec)
        self.refused = 0

    async def write_status(self, status: MigNodeStatus) -> None:
        if not self.refused:
            self.refused += 1
            raise ApiException(status=503, reason="Service Unavailable")
        await super().write_status(status)


async def test_a_failed_status_write_is_counted_and_retried(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = FlakyStore(one_gpu("p1", ("7g.80gb", 0)))
    metrics = AgentMetrics("node-a")
    agent = Agent("node-a", sim, checkpoint, store, metrics, resync_s=3600, backoff_s=0.001)
    async with running(agent):
        await store.wait_for(lambda s: s.observed_plan_id == "p1")
    value = metrics.registry.get_sample_value
    assert value("migpart_agent_status_write_failures_total", {"node": "node-a"}) == 1
    # only the pass whose status reached the API server is a reconcile pass that took time
    assert value("migpart_agent_reconcile_duration_seconds_count", {"node": "node-a"}) == 1
    assert not value("migpart_agent_nvml_errors_total", {"node": "node-a", "code": "unknown"})


def test_status_patch_clears_observed_plan_id() -> None:
    assert status_patch(MigNodeStatus())["status"]["observedPlanId"] is None
    assert status_patch(MigNodeStatus())["status"]["kubeletPlugin"] is None
    assert status_patch(MigNodeStatus(observed_plan_id="x"))["status"]["observedPlanId"] == "x"


def test_cli_flags() -> None:
    args = parser().parse_args(
        [
            "--node-name",
            "n1",
            "--simulate",
            f"{H100}:2,{H200}:1",
            "--simulate",
            f"{H100}:1",
            "--sim-latency-ms",
            "250",
            "--no-kubelet-plugin",
            "--metrics-port",
            "0",
        ]
    )
    config = config_from(args)
    assert config.node == "n1"
    assert config.simulate == [(H100, 2), (H200, 1), (H100, 1)]
    assert config.sim_latency_s == pytest.approx(0.25)
    assert (config.kubelet_plugin, config.metrics_port) == (False, 0)
    assert str(config.plugin_dir) == f"/var/lib/kubelet/plugins/{DRIVER}"


def test_cli_requires_a_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(ValueError, match="--node-name"):
        config_from(parser().parse_args([]))


async def test_a_mignode_created_again_gets_the_status_though_nothing_changed(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """The MigNode was deleted and the store created it again: the new object has no status,
    so the same status is written again (an unchanged status is otherwise not written)."""
    store = InMemoryMigNodes()
    agent = Agent("node-a", sim, checkpoint, store, AgentMetrics("node-a"), resync_s=3600)
    async with running(agent):
        first = await store.wait_for(lambda s: bool(s.gpus))
        await store.set_spec(None)  # an event that changes nothing: no write
        await asyncio.sleep(0.05)
        assert store.statuses == [first]
        await store.recreate()
        again = await store.wait_for(lambda s: s is not first)
        assert again == first
        assert len(store.statuses) == 2
