"""The agent waits for its CRD instead of dying, and reports kubelet's plugin registration."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from structlog.testing import capture_logs

from migpart.agent.kube import MIGNODE_RESOURCE
from migpart.agent.metrics import AgentMetrics
from migpart.agent.plugin import RegistrationServicer
from migpart.agent.runner import Agent
from migpart.api.leases import lease_name, lease_node
from migpart.api.models import GROUP, VERSION, MigNodeSpec
from migpart.commands.agent import config_from, parser
from migpart.errors import ResourceNotServed
from migpart.slices.dra import micro_time
from migpart.testing.mignodes import InMemoryMigNodes
from tests.unit.agent.helpers import running

if TYPE_CHECKING:
    from migpart.agent.checkpoint import Checkpoint
    from migpart.agent.simulator import SimulatedNvml


class LateCrd(InMemoryMigNodes):
    """A store whose MigNode resource is served only after `missing` attempts."""

    def __init__(self, missing: int) -> None:
        super().__init__()
        self.missing = missing
        self.attempts = 0
        self.retried = asyncio.Event()  # set at the fifth attempt

    async def ensure(self) -> MigNodeSpec | None:
        self.attempts += 1
        if self.attempts >= 5:
            self.retried.set()
        if self.attempts <= self.missing:
            raise ResourceNotServed(MIGNODE_RESOURCE)
        return await super().ensure()


async def test_a_missing_crd_is_told_once_and_retried_until_served(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = LateCrd(missing=3)
    metrics = AgentMetrics("node-a")
    agent = Agent("node-a", sim, checkpoint, store, metrics, resync_s=3600, backoff_s=0.001)
    with capture_logs() as logs:
        async with running(agent):
            await store.wait_for(lambda s: bool(s.gpus))
    assert store.attempts == 4
    told = [e for e in logs if e["event"] == "resource_not_served"]
    assert len(told) == 1
    assert told[0]["resource"] == f"mignodes.{GROUP}/{VERSION}"
    assert told[0]["retry"].startswith("with back-off")
    assert [e["resource"] for e in logs if e["event"] == "resource_served"] == [
        f"mignodes.{GROUP}/{VERSION}"
    ]


async def test_readiness_waits_for_the_crd(sim: SimulatedNvml, checkpoint: Checkpoint) -> None:
    store = LateCrd(missing=10**9)
    metrics = AgentMetrics("node-a")
    agent = Agent("node-a", sim, checkpoint, store, metrics, resync_s=3600, backoff_s=0.001)
    async with running(agent) as task:
        await store.retried.wait()
        assert not metrics.ready
        assert not task.done()


async def test_the_registration_kubelet_notifies_is_reported_in_the_status(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes()
    registration = RegistrationServicer("/plugins/dra.sock")
    agent = Agent(
        "node-a",
        sim,
        checkpoint,
        store,
        AgentMetrics("node-a"),
        resync_s=3600,
        registration=registration.status,
    )
    registration.on_change = agent.poke
    async with running(agent):
        first = await store.wait_for(lambda s: s.kubelet_plugin is not None)
        assert first.kubelet_plugin is not None
        assert not first.kubelet_plugin.registered
        assert "waiting for kubelet" in first.kubelet_plugin.message

        class Notice:
            plugin_registered = True
            error = ""

        await registration.NotifyRegistrationStatus(Notice(), None)
        done = await store.wait_for(
            lambda s: bool(s.kubelet_plugin and s.kubelet_plugin.registered)
        )
        assert done.gpus == first.gpus


async def test_without_a_registration_source_nothing_is_reported(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes()
    agent = Agent("node-a", sim, checkpoint, store, AgentMetrics("node-a"), resync_s=3600)
    async with running(agent):
        status = await store.wait_for(lambda s: bool(s.gpus))
        assert status.kubelet_plugin is None


def test_lease_names_and_times() -> None:
    assert lease_name("gpu-1") == "migpart-gpu-1"
    body: dict[str, Any] = {
        "metadata": {"name": "migpart-gpu-1"},
        "spec": {"holderIdentity": "gpu-1"},
    }
    assert lease_node(body) == "gpu-1"
    assert lease_node({"metadata": {"name": "gpu-1"}, "spec": {"holderIdentity": "gpu-1"}}) is None
    assert micro_time().endswith("Z")
    assert len(micro_time().split(".")[1]) == 7  # microseconds and the Z


def test_lease_and_registration_flags() -> None:
    config = config_from(
        parser().parse_args(
            [
                "--node-name",
                "n1",
                "--report-registration",
                "--lease-namespace",
                "ops",
                "--lease-duration-seconds",
                "20",
                "--lease-renew-seconds",
                "5",
            ]
        )
    )
    assert config.report_registration
    assert (config.lease_namespace, config.lease_duration_s, config.lease_renew_s) == ("ops", 20, 5)
    defaults = config_from(parser().parse_args(["--node-name", "n1"]))
    assert not defaults.report_registration
    assert (defaults.lease_namespace, defaults.lease_duration_s) == ("kube-node-lease", 25)
    with pytest.raises(ValueError, match="lease"):
        config_from(parser().parse_args(["--node-name", "n1", "--lease-renew-seconds", "0"]))
