"""A real agent run with `--report-registration` and the real operator: the node's devices are
published only once kubelet has registered the plugin, and stay published through an agent
restart while kubelet registers the plugin again (the registration grace). The test plays
kubelet's part of the registration (pluginregistration v1 over the agent's real socket:
GetInfo, then NotifyRegistrationStatus), as kubelet's plugin watcher does when it finds the
socket."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes_asyncio.client import ApiClient

from migpart.agent.app import AgentConfig, serve
from migpart.agent.proto import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from migpart.agent.simulator import SimulatedNvml
from migpart.controller.core.state import OperatorState
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from tests.integration.agent_processes import running_agent
from tests.integration.conftest import H100, RunningOperator, get_or_none
from tests.stopping import stop_task

pytestmark = pytest.mark.integration

NODE = "registration-a"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mpr-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path)


async def poll(fn: Any) -> Any:
    """`fn()` (run in a thread) until truthy; the per-test timeout bounds the wait."""
    while True:
        got = await asyncio.to_thread(fn)
        if got:
            return got
        await asyncio.sleep(0.2)


def _kubelet_plugin(bed: Testbed) -> dict[str, Any] | None:
    got = get_or_none(bed, "mignode", NODE) or {}
    plugin: dict[str, Any] | None = (got.get("status") or {}).get("kubeletPlugin")
    return plugin


def _config(root: Path) -> AgentConfig:
    return AgentConfig(
        node=NODE,
        simulate=[(H100, 1)],
        state_dir=root / "state",
        cdi_dir=root / "cdi",
        plugin_dir=root / "plugin",
        registration_dir=root / "registry",
        report_registration=True,
        metrics_port=0,
    )


def _devices(bed: Testbed) -> list[str] | None:
    got = get_or_none(bed, "resourceslice", f"{NODE}-{DRIVER}")
    if got is None:
        return None
    return sorted(d["name"] for d in got["spec"].get("devices") or [])


async def test_devices_are_published_once_kubelet_registered_the_plugin(
    cluster: Testbed, operator: RunningOperator, api: ApiClient, short_dir: Path
) -> None:
    await asyncio.to_thread(cluster.add_node, NODE, {"migpart-test": "registration"})
    sim = SimulatedNvml([(H100, 1)], node=NODE)
    await sim.create(0, "1g.10gb", 0)  # no spec yet: the agent keeps and reports it
    config = _config(short_dir)
    started = asyncio.Event()
    task = asyncio.create_task(serve(config, api, backend=sim, started=started))
    await started.wait()
    try:
        waiting = await poll(lambda: _kubelet_plugin(cluster))
        assert waiting["registered"] is False
        assert "waiting for kubelet" in waiting["message"]
        # the agent reports its instance, but the operator publishes no device for it
        await poll(
            lambda: (get_or_none(cluster, "mignode", NODE) or {}).get("status", {}).get("gpus")
        )
        await asyncio.sleep(2)  # what the operator would need to publish it
        assert not _devices(cluster)

        socket = config.registration_dir / f"{DRIVER}-reg.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            registration = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = await registration.GetInfo(pluginregistration_v1_pb2.InfoRequest())
            assert info.name == DRIVER
            await registration.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True)
            )
        registered = await poll(
            lambda: (_kubelet_plugin(cluster) or {}).get("registered") and _kubelet_plugin(cluster)
        )
        assert registered["registered"] is True
        assert await poll(lambda: _devices(cluster)) == ["gpu-0-1g10gb-0"]
    finally:
        await stop_task(task, f"the agent of {NODE}")


def _generation(bed: Testbed) -> int:
    got = get_or_none(bed, "resourceslice", f"{NODE}-{DRIVER}") or {}
    return int(got["spec"]["pool"]["generation"])


async def _register(config: AgentConfig) -> None:
    """kubelet's part: GetInfo, then NotifyRegistrationStatus(registered)."""
    socket = config.registration_dir / f"{DRIVER}-reg.sock"
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        registration = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        await registration.GetInfo(pluginregistration_v1_pb2.InfoRequest())
        await registration.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True)
        )


async def test_an_agent_restart_keeps_the_devices_published_for_the_grace(
    cluster: Testbed, operator: RunningOperator, api: ApiClient, short_dir: Path
) -> None:
    """The restarted agent reports "waiting for kubelet" until kubelet registers the plugin
    again: the node's devices stay published meanwhile (the slice is not rewritten at all).
    Restarted again with no kubelet to register it, the node loses its devices once the
    grace (10 s by default) has passed."""
    await asyncio.to_thread(cluster.add_node, NODE, {"migpart-test": "registration"})
    sim = SimulatedNvml([(H100, 1)], node=NODE)
    await sim.create(0, "1g.10gb", 0)
    config = _config(short_dir)
    async with running_agent(config, api, sim):
        await _register(config)
        assert await poll(lambda: _devices(cluster)) == ["gpu-0-1g10gb-0"]
    generation = await asyncio.to_thread(_generation, cluster)

    async with running_agent(config, api, sim):
        waiting = await poll(
            lambda: (plugin := _kubelet_plugin(cluster)) and not plugin["registered"] and plugin
        )
        assert "waiting for kubelet" in waiting["message"]
        await asyncio.sleep(2)  # what the operator would need to withdraw the devices
        assert _devices(cluster) == ["gpu-0-1g10gb-0"]
        await _register(config)
        await poll(lambda: (_kubelet_plugin(cluster) or {}).get("registered"))
        await asyncio.sleep(2)
        assert _devices(cluster) == ["gpu-0-1g10gb-0"]
        assert await asyncio.to_thread(_generation, cluster) == generation

    async with running_agent(config, api, sim):  # no kubelet registers it this time
        await poll(lambda: (plugin := _kubelet_plugin(cluster)) and not plugin["registered"])
        assert await poll(lambda: _devices(cluster) == [])
        state: OperatorState = operator.memo.state
        assert state.health.reason(NODE) == "PluginNotRegistered"
