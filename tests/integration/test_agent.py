"""An agent on the simulator against the testbed's real API server: it creates its MigNode
(owned by its Node), reports the inventory, converges to a spec written by the test, and its
kubelet plugin reads claim allocations from the API server."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration

from migpart.agent.app import AgentConfig
from migpart.agent.claims import ClaimNotFound, KubeClaims
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import GROUP
from migpart.slices.dra import DRIVER, AllocatedDevice
from migpart.testing.builders import ClaimBuilder
from tests.integration.agent_processes import running_agent
from tests.stopping import stop_async_process

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from migpart.testbed import Testbed

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crds(testbed: Testbed) -> Testbed:
    testbed.kubectl("apply", "-f", str(REPO / "crds"))
    testbed.kubectl("wait", "--for=condition=established", "--timeout=60s", f"crd/mignodes.{GROUP}")
    return testbed


@pytest.fixture
async def api(crds: Testbed) -> AsyncIterator[ApiClient]:
    cfg = Configuration()
    await kube_config.load_kube_config(config_file=str(crds.kubeconfig), client_configuration=cfg)
    async with ApiClient(cfg) as client:
        yield client


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mpi-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


async def kubectl_json(bed: Testbed, *args: str) -> dict[str, Any] | None:
    out = await asyncio.to_thread(bed.kubectl, *args, "-o", "json", check=False)
    return json.loads(out) if out.strip() else None


async def until(bed: Testbed, name: str, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll the MigNode until `ok` holds (the per-test timeout bounds the wait)."""
    while True:
        obj = await kubectl_json(bed, "get", "mignode", name)
        if obj is not None and ok(obj):
            return obj
        await asyncio.sleep(0.2)


def agent_config(node: str, gpus: int, root: Path, *, resync_s: float) -> AgentConfig:
    """An agent of `gpus` simulated H100s, its directories under `root`."""
    return AgentConfig(
        node=node,
        simulate=[(H100, gpus)],
        state_dir=root / "state",
        cdi_dir=root / "cdi",
        plugin_dir=root / "plugin",
        registration_dir=root / "registry",
        metrics_port=0,
        resync_s=resync_s,
    )


async def test_agent_creates_mignode_reports_and_converges(
    crds: Testbed, api: ApiClient, short_dir: Path
) -> None:
    node = "agent-it-node-1"
    await asyncio.to_thread(crds.add_node, node)
    node_uid = (await kubectl_json(crds, "get", "node", node) or {})["metadata"]["uid"]
    sim = SimulatedNvml([(H100, 2)], node=node, latency_s=0.01)
    config = agent_config(node, 2, short_dir, resync_s=5)
    async with running_agent(config, api, sim):
        obj = await until(crds, node, lambda o: bool(o.get("status", {}).get("gpus")))
        owners = obj["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("Node", node, node_uid)]
        gpus = obj["status"]["gpus"]
        assert [(g["index"], g["model"], g["migEnabled"]) for g in gpus] == [
            (0, H100, True),
            (1, H100, True),
        ]
        one_g = next(p for p in gpus[0]["profiles"] if p["name"] == "1g.10gb")
        assert one_g["placements"] == [0, 1, 2, 3, 4, 5, 6]
        assert one_g["memoryMiB"] == 9984

        spec = {
            "spec": {
                "planId": "plan-1",
                "gpus": [
                    {
                        "index": 0,
                        "instances": [
                            {"profile": "3g.40gb", "start": 0},
                            {"profile": "2g.20gb", "start": 4},
                            {"profile": "1g.10gb", "start": 6},
                        ],
                    },
                    {"index": 1, "instances": [{"profile": "7g.80gb", "start": 0}]},
                ],
            }
        }
        await asyncio.to_thread(
            crds.kubectl, "patch", "mignode", node, "--type=merge", "-p", json.dumps(spec)
        )
        done = await until(
            crds, node, lambda o: o.get("status", {}).get("observedPlanId") == "plan-1"
        )
        status = done["status"]
        assert [(i["profile"], i["start"], i["state"]) for i in status["gpus"][0]["instances"]] == [
            ("3g.40gb", 0, "Free"),
            ("2g.20gb", 4, "Free"),
            ("1g.10gb", 6, "Free"),
        ]
        assert [i["profile"] for i in status["gpus"][1]["instances"]] == ["7g.80gb"]
        assert status["summary"] == {"gpus": 2, "instances": 4, "free": 4, "synced": True}
        ready = {c["type"]: c["status"] for c in status["conditions"]}
        # no other publisher of the node's GPUs (the overlap guard, migpart.agent.publishers)
        assert ready == {"Ready": "True", "Degraded": "False", "PublisherOverlap": "False"}
        assert [(i.profile, i.start) for i in await sim.instances(1)] == [("7g.80gb", 0)]

        # a second plan that needs the first one's slices
        spec2 = {
            "spec": {
                "planId": "plan-2",
                "gpus": [
                    {"index": 0, "instances": [{"profile": "7g.80gb", "start": 0}]},
                ],
            }
        }
        await asyncio.to_thread(
            crds.kubectl, "patch", "mignode", node, "--type=merge", "-p", json.dumps(spec2)
        )
        await until(crds, node, lambda o: o.get("status", {}).get("observedPlanId") == "plan-2")
        assert [(i.profile, i.start) for i in await sim.instances(0)] == [("7g.80gb", 0)]

    # a restarted agent (same GPUs, fresh process state) changes nothing and stays synced
    sim.calls.clear()
    async with running_agent(config, api, sim):
        await asyncio.sleep(0)  # let it make one pass
        again = await until(crds, node, lambda o: o["status"]["summary"]["synced"])
        assert again["status"]["observedPlanId"] == "plan-2"
    assert sim.calls == []


async def test_a_mignode_deleted_under_the_agent_comes_back_with_its_status(
    crds: Testbed, api: ApiClient, short_dir: Path
) -> None:
    """Deleted by hand (or by a tool that cleans up), the MigNode is created again by the
    agent; the new object must get the status at once, though nothing on the node changed
    (before, the agent skipped the write as "unchanged", and the node had no slice devices
    and no plans until the agent restarted)."""
    node = "agent-it-node-deleted"
    await asyncio.to_thread(crds.add_node, node)
    sim = SimulatedNvml([(H100, 1)], node=node, latency_s=0.01)
    # no periodic pass: only the deletion may bring the write
    config = agent_config(node, 1, short_dir, resync_s=3600)
    async with running_agent(config, api, sim):
        first = await until(crds, node, lambda o: bool(o.get("status", {}).get("gpus")))
        await asyncio.to_thread(crds.kubectl, "delete", "mignode", node, "--wait=true")
        again = await until(
            crds,
            node,
            lambda o: (
                o["metadata"]["uid"] != first["metadata"]["uid"]
                and bool(o.get("status", {}).get("gpus"))
            ),
        )
        assert again["status"]["gpus"] == first["status"]["gpus"]


async def test_kube_claims_reads_allocation_from_the_api_server(
    crds: Testbed, api: ApiClient
) -> None:
    ns = "default"
    claim = ClaimBuilder("agent-it-claim", ns).request().obj()
    await asyncio.to_thread(crds.kubectl, "apply", "-f", "-", input=json.dumps(claim))
    body = await kubectl_json(crds, "get", "resourceclaim", "agent-it-claim", "-n", ns)
    assert body is not None
    uid = body["metadata"]["uid"]
    source = KubeClaims(api)
    with pytest.raises(ClaimNotFound, match="not allocated"):
        await source.allocation(ns, "agent-it-claim", uid)
    allocated = ClaimBuilder("agent-it-claim").allocated("node-x", "gpu-0-1g10gb-3")
    allocation = {"status": allocated.obj()["status"]}
    await asyncio.to_thread(
        crds.kubectl,
        "patch",
        "resourceclaim",
        "agent-it-claim",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(allocation),
    )
    assert await source.allocation(ns, "agent-it-claim", uid) == [
        AllocatedDevice("gpu", DRIVER, "node-x", "gpu-0-1g10gb-3")
    ]
    with pytest.raises(ClaimNotFound, match="UID"):
        await source.allocation(ns, "agent-it-claim", "some-other-uid")
    with pytest.raises(ClaimNotFound, match="not found"):
        await source.allocation(ns, "no-such-claim", uid)


async def test_migpart_agent_command_runs_on_the_simulator(crds: Testbed, short_dir: Path) -> None:
    """`migpart agent --simulate` as its own process: reports, serves /readyz and /metrics,
    and exits cleanly on SIGTERM."""
    import os
    import socket
    import sys

    import aiohttp

    node = "agent-it-cli"
    await asyncio.to_thread(crds.add_node, node)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "migpart.cli",
        "agent",
        "--node-name",
        node,
        "--simulate",
        f"{H100}:1,NVIDIA H200:1",
        "--sim-latency-ms",
        "5",
        "--kubeconfig",
        str(crds.kubeconfig),
        "--state-dir",
        str(short_dir / "state"),
        "--cdi-dir",
        str(short_dir / "cdi"),
        "--plugin-dir",
        str(short_dir / "plugin"),
        "--registration-dir",
        str(short_dir / "registry"),
        "--metrics-port",
        str(port),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        obj = await until(crds, node, lambda o: len(o.get("status", {}).get("gpus", [])) == 2)
        assert [g["model"] for g in obj["status"]["gpus"]] == [H100, "NVIDIA H200"]
        assert (short_dir / "registry" / f"{DRIVER}-reg.sock").exists()
        assert (short_dir / "plugin" / "dra.sock").exists()
        async with aiohttp.ClientSession() as http:
            while True:  # readiness follows the first status write
                async with http.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert "migpart_agent_reconcile_duration_seconds" in await r.text()
    finally:
        _, stderr = await stop_async_process(proc, "migpart agent")
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert not (short_dir / "registry" / f"{DRIVER}-reg.sock").exists()
