"""bench/scale.py's fleet (bench/scale_fleet.py) against the testbed's real API server: its
nodes report what their agents would, follow a spec written to their MigNode (fencing
included), keep their Leases renewed and make a deleted MigNode again; and bench/scale.py at a
small size binds every pod through it with the real operator and kube-scheduler."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from bench.scale_cluster import GPUS_PER_NODE, H100
from bench.scale_fleet import Fleet, NoOtherPublisher
from migpart.agent.checkpoint import Checkpoint
from migpart.agent.metrics import AgentMetrics
from migpart.agent.runner import Agent
from migpart.agent.simulator import SimulatedNvml
from migpart.api.leases import LEASE_NAMESPACE, lease_name
from migpart.api.models import MigNodeSpec, MigNodeStatus
from migpart.testbed import Testbed
from migpart.testing.mignodes import InMemoryMigNodes
from tests.integration.conftest import events, get_or_none
from tests.stopping import stop_task

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODES = [f"fleet-it-{i}" for i in range(5)]
SPEC = {
    "planId": "fleet-plan-1",
    "leaderTerm": 3,
    "gpus": [
        {
            "index": 0,
            "instances": [
                {"profile": "3g.40gb", "start": 0},
                {"profile": "2g.20gb", "start": 4},
                {"profile": "1g.10gb", "start": 6},
            ],
        },
        {"index": 3, "instances": [{"profile": "7g.80gb", "start": 0}]},
    ],
}


async def until(what: Callable[[], Any]) -> Any:
    """Poll `what` (run in a thread: it calls kubectl) until it returns something truthy; the
    per-test timeout bounds the wait."""
    while True:
        out = await asyncio.to_thread(what)
        if out:
            return out
        await asyncio.sleep(0.2)


async def agent_status(node: str, spec: MigNodeSpec, root: Path) -> MigNodeStatus:
    """What the agent's own loop writes for `spec` on a node of fresh simulated GPUs."""
    store = InMemoryMigNodes(spec)
    agent = Agent(
        node,
        SimulatedNvml([(H100, GPUS_PER_NODE)], node=node),
        Checkpoint(root / node / "checkpoint.json"),
        store,
        AgentMetrics(node),
        publishers=NoOtherPublisher(),
    )
    agent.spec, agent.leader_term = spec, spec.leader_term
    await agent.reconcile()
    return store.statuses[-1]


def comparable(status: MigNodeStatus) -> dict[str, Any]:
    """A status as JSON, its conditions without their transition times."""
    body = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    for condition in body.get("conditions", []):
        condition.pop("lastTransitionTime", None)
    return body


@pytest.fixture
async def fleet(cluster: Testbed, api: ApiClient, tmp_path: Path) -> AsyncIterator[Fleet]:
    """A fleet of NODES renewing its Leases every second; its Nodes, MigNodes and Leases are
    deleted after."""
    for node in NODES:
        await asyncio.to_thread(cluster.add_node, node)
    fleet = Fleet(api, NODES, tmp_path / "fleet", renew_s=1.0)
    task = asyncio.create_task(fleet.run())
    try:
        yield fleet
    finally:
        await stop_task(task, "the fleet")
        for kind in ("mignode", "node"):
            await asyncio.to_thread(cluster.kubectl, "delete", kind, *NODES, "--wait=false")
        leases = [lease_name(n) for n in NODES]
        await asyncio.to_thread(
            cluster.kubectl, "delete", "lease", "-n", LEASE_NAMESPACE, *leases, "--wait=false"
        )


async def test_the_fleet_reports_and_follows_specs_as_its_agents_would(
    cluster: Testbed, fleet: Fleet, tmp_path: Path
) -> None:
    def reported() -> list[dict[str, Any]] | None:
        nodes = [get_or_none(cluster, "mignode", n) for n in NODES]
        ok = all(n and len((n.get("status") or {}).get("gpus", [])) == GPUS_PER_NODE for n in nodes)
        return [n for n in nodes if n] if ok else None

    first = await until(reported)
    for node, obj in zip(NODES, first, strict=True):
        owner = get_or_none(cluster, "node", node)
        assert owner is not None
        assert [(o["kind"], o["name"], o["uid"]) for o in obj["metadata"]["ownerReferences"]] == [
            ("Node", node, owner["metadata"]["uid"])
        ]
        expected = await agent_status(node, MigNodeSpec(), tmp_path / "reference")
        assert comparable(MigNodeStatus.model_validate(obj["status"])) == comparable(expected)

    # a spec written by a leader of term 3: carried out, the plan observed, the term kept
    node = NODES[2]
    await asyncio.to_thread(
        cluster.kubectl, "patch", "mignode", node, "--type=merge", "-p", json.dumps({"spec": SPEC})
    )

    def observed(plan: str) -> Callable[[], dict[str, Any] | None]:
        def check() -> dict[str, Any] | None:
            obj = get_or_none(cluster, "mignode", node)
            done = obj and (obj.get("status") or {}).get("observedPlanId") == plan
            return obj if done else None

        return check

    done = await until(observed("fleet-plan-1"))
    spec = MigNodeSpec.model_validate(SPEC)
    expected = await agent_status(node, spec, tmp_path / "reference-spec")
    assert comparable(MigNodeStatus.model_validate(done["status"])) == comparable(expected)
    assert done["status"]["leaderTerm"] == 3
    instances = {
        g["index"]: [(i["profile"], i["start"], i["state"]) for i in g["instances"]]
        for g in done["status"]["gpus"]
    }
    assert instances[0] == [("3g.40gb", 0, "Free"), ("2g.20gb", 4, "Free"), ("1g.10gb", 6, "Free")]
    assert instances[3] == [("7g.80gb", 0, "Free")]
    assert not any(instances[i] for i in (1, 2, 4, 5, 6, 7))

    # a spec of an older leadership is refused and told, as the agent does
    old = {**SPEC, "planId": "fleet-plan-old", "leaderTerm": 2, "gpus": []}
    await asyncio.to_thread(
        cluster.kubectl, "patch", "mignode", node, "--type=merge", "-p", json.dumps({"spec": old})
    )
    await until(lambda: any(e["reason"] == "SpecRefused" for e in events(cluster, node, "default")))
    after = get_or_none(cluster, "mignode", node)
    assert after is not None
    assert after["status"]["observedPlanId"] == "fleet-plan-1"

    # every node's Lease is renewed, again and again
    def renewals() -> dict[str, str] | None:
        leases = [
            get_or_none(cluster, "lease", "-n", LEASE_NAMESPACE, lease_name(n)) for n in NODES
        ]
        if not all(leases):
            return None
        assert [lease["spec"]["holderIdentity"] for lease in leases if lease] == NODES
        return {
            n: lease["spec"]["renewTime"] for n, lease in zip(NODES, leases, strict=True) if lease
        }

    before = await until(renewals)
    await until(lambda: all(a != before[n] for n, a in (renewals() or before).items()))

    # a MigNode deleted under the fleet comes back with its status
    gone = NODES[4]
    uid = first[4]["metadata"]["uid"]
    await asyncio.to_thread(cluster.kubectl, "delete", "mignode", gone, "--wait=true")

    def back() -> dict[str, Any] | None:
        obj = get_or_none(cluster, "mignode", gone)
        ok = obj and obj["metadata"]["uid"] != uid and (obj.get("status") or {}).get("gpus")
        return obj if ok else None

    again = await until(back)
    assert again["status"]["gpus"] == first[4]["status"]["gpus"]


SIZE_LINE = re.compile(r"^nodes 4 gpus 32 pods 8: bound p50 \S+ s p99 \S+ s all [\d.]+ s, ")


def test_bench_scale_binds_every_pod_through_the_fleet() -> None:
    """bench/scale.py at 4 nodes (its own testbed, the real operator and kube-scheduler, the
    fleet as agents): every pod bound, nothing destroyed in use, exit status 0. Its timeouts
    are generous bounds on waits, nothing is timed."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.scale",
            "--sizes=4",
            "--no-baseline",
            "--idle-s=1",
            "--timeout-s=600",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-3000:])
    assert "agents: the fleet" in out, out
    assert any(SIZE_LINE.match(line) for line in out.splitlines()), out
    assert "destroyed-in-use 0, allocated devices missing at the end 0" in out, out
