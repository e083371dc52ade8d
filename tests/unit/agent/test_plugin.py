"""A gRPC client acting as kubelet drives the plugin over real unix sockets."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from migpart.agent.cdi import CdiWriter, cap_minor
from migpart.agent.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from migpart.agent.plugin import ClaimRef, DraDriver, KubeletPlugin, PrepareError
from migpart.agent.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from migpart.agent.reconciler import reconcile_once
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import GpuSpec, MigNodeSpec
from migpart.slices.dra import DRIVER, AllocatedDevice
from migpart.testing.claims import InMemoryClaims
from tests.unit.agent.conftest import H100

if TYPE_CHECKING:
    from collections.abc import Iterator

NODE = "node-a"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="mp-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def make_plugin(root: Path, sim: SimulatedNvml, claims: InMemoryClaims) -> KubeletPlugin:
    driver = DraDriver(
        NODE,
        sim,
        claims,
        Checkpoint(root / "state" / "checkpoint.json"),
        CdiWriter(root / "cdi", caps_root=None),
    )
    return KubeletPlugin(driver, root / "plugins" / DRIVER, root / "plugins_registry")


async def test_kubelet_registers_prepares_unprepares_across_restart(short_dir: Path) -> None:
    sim = SimulatedNvml([(H100, 2)], node=NODE)
    await sim.create(0, "3g.40gb", 0)
    mig = await sim.create(1, "1g.10gb", 2)
    claims = InMemoryClaims()
    claims.put(
        "team",
        "c1",
        "uid-1",
        [
            AllocatedDevice("gpu", DRIVER, NODE, "gpu-1-1g10gb-2"),
            AllocatedDevice("nic", "other.example.com", NODE, "eth0"),
        ],
    )
    plugin = make_plugin(short_dir, sim, claims)
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{plugin.registration_socket}") as ch:
            reg = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
            info = await reg.GetInfo(pluginregistration_v1_pb2.InfoRequest())
            assert (info.type, info.name) == ("DRAPlugin", DRIVER)
            assert info.endpoint == str(short_dir / "plugins" / DRIVER / "dra.sock")
            assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            await reg.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True)
            )
        assert plugin.registration.registered is True

        async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as ch:
            dra = dra_v1beta1_pb2_grpc.DRAPluginStub(ch)
            request = dra_v1beta1_pb2.NodePrepareResourcesRequest(
                claims=[dra_v1beta1_pb2.Claim(namespace="team", uid="uid-1", name="c1")]
            )
            first = await dra.NodePrepareResources(request)
            again = await dra.NodePrepareResources(request)  # kubelet retries: same answer
        assert first == again
        result = first.claims["uid-1"]
        assert result.error == ""
        [device] = result.devices
        assert (device.pool_name, device.device_name) == (NODE, "gpu-1-1g10gb-2")
        assert list(device.request_names) == ["gpu"]
        assert list(device.cdi_device_ids) == [f"{DRIVER}/mig=uid-1-gpu-1-1g10gb-2"]

        spec = json.loads((short_dir / "cdi" / f"{DRIVER}-uid-1.json").read_text())
        assert spec["cdiVersion"] == "0.6.0"
        assert spec["kind"] == f"{DRIVER}/mig"
        [entry] = spec["devices"]
        assert entry["name"] == "uid-1-gpu-1-1g10gb-2"
        assert entry["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={mig.uuid}"]
        nodes = [n["path"] for n in entry["containerEdits"]["deviceNodes"]]
        gi_cap = cap_minor(None, 1, mig.gi_id, None)
        assert nodes == [
            "/dev/nvidia1",
            f"/dev/nvidia-caps/nvidia-cap{gi_cap}",
            f"/dev/nvidia-caps/nvidia-cap{gi_cap + 1}",
        ]
        assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl"}]

        # the reconciler must not take the prepared instance away
        kept = await reconcile_once(
            MigNodeSpec(plan_id="p", gpus=[GpuSpec(index=1, instances=[])]),
            sim,
            plugin.driver.checkpoint,
        )
        assert [i.state for i in kept.status.gpus[1].instances] == ["Prepared"]
    finally:
        await plugin.stop()
    assert not plugin.registration_socket.exists()

    # restart: the checkpoint on disk is all the new process knows; the claim is gone from the
    # API server by now, so a second prepare must be answered from the checkpoint.
    claims.delete("team", "c1")
    restarted = make_plugin(short_dir, sim, claims)
    await restarted.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{restarted.plugin_socket}") as ch:
            dra1 = dra_v1_pb2_grpc.DRAPluginStub(ch)
            ref = [dra_v1_pb2.Claim(namespace="team", uid="uid-1", name="c1")]
            again_v1 = await dra1.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=ref)
            )
            assert [d.device_name for d in again_v1.claims["uid-1"].devices] == ["gpu-1-1g10gb-2"]
            for _ in range(2):  # idempotent
                done = await dra1.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=ref)
                )
                assert done.claims["uid-1"].error == ""
    finally:
        await restarted.stop()
    assert not (short_dir / "cdi" / f"{DRIVER}-uid-1.json").exists()
    assert Checkpoint(short_dir / "state" / "checkpoint.json").claims() == []


@pytest.mark.parametrize(
    ("allocated", "uid", "error"),
    [
        (None, "uid-9", "claim team/c9 not found"),
        (
            [AllocatedDevice("gpu", DRIVER, NODE, "gpu-7-7g80gb-0")],
            "uid-9",
            "device gpu-7-7g80gb-0 does not exist on node node-a",
        ),
        (  # a placement over an instance that exists: refused, nothing destroyed
            [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-7g80gb-0")],
            "uid-9",
            "device gpu-0-7g80gb-0 not created: would overlap 3g.40gb@0, which exists",
        ),
        (
            [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-3g40gb-0")],
            "other-uid",
            "has UID other-uid, kubelet asked for uid-9",
        ),
    ],
)
async def test_prepare_errors_go_back_to_kubelet(
    short_dir: Path, allocated: list[AllocatedDevice] | None, uid: str, error: str
) -> None:
    sim = SimulatedNvml([(H100, 1)], node=NODE)
    await sim.create(0, "3g.40gb", 0)
    claims = InMemoryClaims()
    if allocated is not None:
        claims.put("team", "c9", uid, allocated)
    plugin = make_plugin(short_dir, sim, claims)
    await plugin.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{plugin.plugin_socket}") as ch:
            dra = dra_v1_pb2_grpc.DRAPluginStub(ch)
            out = await dra.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="team", uid="uid-9", name="c9")]
                )
            )
    finally:
        await plugin.stop()
    assert error in out.claims["uid-9"].error
    assert not list(out.claims["uid-9"].devices)
    assert plugin.driver.checkpoint.claims() == []


def test_cap_minor_reads_the_driver_proc_file(tmp_path: Path) -> None:
    access = tmp_path / "gpu3" / "mig" / "gi2" / "ci0"
    access.mkdir(parents=True)
    (access.parent / "access").write_text("DeviceFileMinor: 57\nDeviceFileMode: 292\n")
    (access / "access").write_text("DeviceFileMinor: 58\n")
    assert cap_minor(tmp_path, 3, 2, None) == 57
    assert cap_minor(tmp_path, 3, 2, 0) == 58
    assert cap_minor(tmp_path, 3, 5, None) == cap_minor(None, 3, 5, None)


def test_checkpoint_write_is_atomic_and_reloads(tmp_path: Path) -> None:
    from migpart.agent.checkpoint import PreparedClaim, PreparedDevice

    path = tmp_path / "c.json"
    cp = Checkpoint(path)
    dev = PreparedDevice("gpu-0-7g80gb-0", 0, "7g.80gb", 0, "MIG-x", "k=v", ("r",), "n")
    cp.put(PreparedClaim("u", "ns", "n", (dev,)))
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temp file left behind
    assert Checkpoint(path).claims() == cp.claims()
    assert Checkpoint(path).prepared() == {(0, "7g.80gb", 0): ["ns/n"]}


async def test_sockets_and_checkpoint_are_owner_only(short_dir: Path) -> None:
    """Whoever can connect to the plugin's sockets can prepare claims, and the checkpoint says
    which claims run where: both are the agent's alone, whatever the umask."""
    # A permissive umask and a hostPath that kubelet created 0755 must not widen anything.
    (short_dir / "state").mkdir(mode=0o755)
    (short_dir / "plugins_registry").mkdir(mode=0o755)
    previous = os.umask(0)
    try:
        sim = SimulatedNvml([(H100, 1)], node=NODE)
        mig = await sim.create(0, "1g.10gb", 0)
        claims = InMemoryClaims()
        plugin = make_plugin(short_dir, sim, claims)
        await plugin.start()
        try:
            assert _mode(plugin.plugin_socket) == 0o600
            assert _mode(plugin.registration_socket) == 0o600
            assert _mode(plugin.plugin_socket.parent) == 0o700
            # The shared registration directory keeps the mode it had.
            assert _mode(plugin.registration_socket.parent) == 0o755
            checkpoint = plugin.driver.checkpoint
            assert _mode(checkpoint.path.parent) == 0o700
            checkpoint.put(
                PreparedClaim(
                    "uid-1",
                    "ns",
                    "claim",
                    (PreparedDevice("gpu-0-1g10gb-0", 0, "1g.10gb", 0, mig.uuid, "cdi"),),
                )
            )
            assert _mode(checkpoint.path) == 0o600
        finally:
            await plugin.stop()
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_lost_gpu_fails_only_its_own_prepares(tmp_path: Path) -> None:
    """While GPU 1 is lost, a claim on GPU 0 is prepared; a claim allocated on GPU 1 (before
    it was lost) is refused for kubelet to retry, and prepared once the GPU is back."""
    sim = SimulatedNvml([(H100, 2)], node=NODE)
    await sim.create(0, "3g.40gb", 0)
    await sim.create(1, "3g.40gb", 0)
    claims = InMemoryClaims()
    claims.put("team", "c0", "uid-0", [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-3g40gb-0")])
    claims.put("team", "c1", "uid-1", [AllocatedDevice("gpu", DRIVER, NODE, "gpu-1-3g40gb-0")])
    driver = make_plugin(tmp_path, sim, claims).driver
    sim.lose(1)
    assert [d.device for d in await driver.prepare(ClaimRef("team", "uid-0", "c0"))] == [
        "gpu-0-3g40gb-0"
    ]
    with pytest.raises(PrepareError, match="gpu-1-3g40gb-0 does not exist"):
        await driver.prepare(ClaimRef("team", "uid-1", "c1"))
    sim.recover(1)
    assert [d.device for d in await driver.prepare(ClaimRef("team", "uid-1", "c1"))] == [
        "gpu-1-3g40gb-0"
    ]
