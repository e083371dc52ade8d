"""A real agent run with `--report-registration` and the real operator: the node's devices are
published only once kubelet has registered the plugin. The test plays kubelet's part of the
registration (pluginregistration v1 over the agent's real socket: GetInfo, then
NotifyRegistrationStatus), as kubelet's plugin watcher does when it finds the socket."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration

from migpart.agent.app import AgentConfig, serve
from migpart.agent.proto import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from migpart.agent.simulator import SimulatedNvml
from migpart.testbed import Testbed
from tests.integration.conftest import H100, RunningOperator, get_or_none
from tests.stopping import stop_task

pytestmark = pytest.mark.integration

NODE = "registration-a"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mpr-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path)


@pytest.fixture
async def api(cluster: Testbed) -> AsyncIterator[ApiClient]:
    cfg = Configuration()
    await kube_config.load_kube_config(
        config_file=str(cluster.kubeconfig), client_configuration=cfg
    )
    async with ApiClient(cfg) as client:
        yield client


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


def _devices(bed: Testbed) -> list[str] | None:
    got = get_or_none(bed, "resourceslice", f"{NODE}-mig.migpart.io")
    if got is None:
        return None
    return sorted(d["name"] for d in got["spec"].get("devices") or [])


async def test_devices_are_published_once_kubelet_registered_the_plugin(
    cluster: Testbed, operator: RunningOperator, api: ApiClient, short_dir: Path
) -> None:
    await asyncio.to_thread(cluster.add_node, NODE, {"migpart-test": "registration"})
    sim = SimulatedNvml([(H100, 1)], node=NODE)
    await sim.create(0, "1g.10gb", 0)  # no spec yet: the agent keeps and reports it
    config = AgentConfig(
        node=NODE,
        simulate=[(H100, 1)],
        state_dir=short_dir / "state",
        cdi_dir=short_dir / "cdi",
        plugin_dir=short_dir / "plugin",
        registration_dir=short_dir / "registry",
        report_registration=True,
        metrics_port=0,
    )
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

        socket = config.registration_dir / "mig.migpart.io-reg.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            registration = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
            info = await registration.GetInfo(pluginregistration_v1_pb2.InfoRequest())
            assert info.name == "mig.migpart.io"
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
