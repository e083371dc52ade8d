"""A dead agent does not stall its policy: once its Lease is stale the operator frees the
node's `maxConcurrentNodes` slot, plans and publishes nothing there and says so (MigNode
`Stale` condition, policy `unavailableNodes`); a restarted agent brings the node back.

Agents run as real `migpart agent --simulate` processes, so that one can be SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from migpart.controller.state import OperatorState
from migpart.testbed import Testbed
from tests.integration.conftest import (
    H100,
    PROFILE_IS,
    apply,
    claim_body,
    eventually,
    get,
    get_or_none,
    gpu_status,
    patch_status,
    pending_pod,
    policy_body,
    put_mignode,
    renew_lease,
    running_operator,
)
from tests.stopping import stop_process

pytestmark = pytest.mark.integration

LEASE_TIMEOUT_S = 3.0
LABEL = {"migpart-test": "health"}


class AgentProcess:
    def __init__(self, bed: Testbed, node: str, root: Path, latency_ms: int) -> None:
        self.bed, self.node, self.root = bed, node, root
        self.log_path = root / f"agent-{node}.log"
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(latency_ms)

    def start(self, latency_ms: int) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "migpart.cli",
                "agent",
                "--node-name",
                self.node,
                "--simulate",
                f"{H100}:1",
                "--sim-latency-ms",
                str(latency_ms),
                "--no-kubelet-plugin",
                "--kubeconfig",
                str(self.bed.kubeconfig),
                "--state-dir",
                str(self.root / self.node / "state"),
                "--cdi-dir",
                str(self.root / self.node / "cdi"),
                "--metrics-port",
                "0",
                "--lease-renew-seconds",
                "0.5",
                "--lease-duration-seconds",
                "3",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        assert self._log is not None
        self._log.close()

    def stop(self) -> None:
        try:
            if self.proc is not None:
                stop_process(self.proc, f"the agent of {self.node}")
        finally:
            if self._log is not None:
                self._log.close()


@pytest.fixture
def agents(cluster: Testbed, tmp_path: Path) -> Iterator[dict[str, AgentProcess]]:
    running: dict[str, AgentProcess] = {}
    yield running
    for agent in running.values():
        agent.stop()
        print(agent.log_path.read_text()[-3000:])  # shown when the test failed


def _mignode(bed: Testbed, node: str) -> dict[str, Any]:
    return get_or_none(bed, "mignode", node) or {}


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def _devices(bed: Testbed, node: str) -> list[str]:
    got = get_or_none(bed, "resourceslice", f"{node}-mig.migpart.io")
    return sorted(d["name"] for d in ((got or {}).get("spec") or {}).get("devices") or [])


def _planned(obj: dict[str, Any], profile: str) -> bool:
    gpus = (obj.get("spec") or {}).get("gpus") or []
    return any(i["profile"] == profile for g in gpus for i in g.get("instances") or [])


def test_a_dead_agent_frees_its_slot_and_comes_back(
    cluster: Testbed, agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    a, b = "health-a", "health-b"
    cluster.add_node(a, {**LABEL, "health-node": "a"})
    cluster.add_node(b, {**LABEL, "health-node": "b"})
    # a's NVML is slow: it is still carrying out its spec when it is killed
    agents[a] = AgentProcess(cluster, a, tmp_path, latency_ms=2000)
    agents[b] = AgentProcess(cluster, b, tmp_path, latency_ms=0)
    with running_operator(cluster, lease_timeout_s=LEASE_TIMEOUT_S) as operator:
        for node in (a, b):
            eventually(lambda n=node: (_mignode(cluster, n).get("status") or {}).get("gpus"))  # type: ignore[misc]
        apply(
            cluster,
            policy_body(
                "health",
                LABEL,
                reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 1},
            ),
        )
        apply(cluster, claim_body("health-a", "default", PROFILE_IS.format("1g.10gb")))
        pending_pod(cluster, "health-a", "default", "health-a", {"health-node": "a"})
        spec_a = eventually(
            lambda: _planned(_mignode(cluster, a), "1g.10gb") and _mignode(cluster, a)
        )
        plan_a = spec_a["spec"]["planId"]
        assert (spec_a.get("status") or {}).get("observedPlanId") != plan_a
        agents[a].kill()  # holds the policy's only slot, and will never finish

        apply(cluster, claim_body("health-b", "default", PROFILE_IS.format("3g.40gb")))
        pending_pod(cluster, "health-b", "default", "health-b", {"health-node": "b"})

        # a's lease goes stale: its slot is free, so b is repartitioned and its device published
        eventually(lambda: _planned(_mignode(cluster, b), "3g.40gb"), timeout=90)
        eventually(lambda: any("3g40gb" in d for d in _devices(cluster, b)), timeout=60)
        stale = eventually(lambda: _condition(_mignode(cluster, a), "Stale"))
        assert stale["status"] == "True"
        assert stale["reason"] == "LeaseExpired"
        assert "not renewed" in stale["message"]
        eventually(
            lambda: (
                get(cluster, "gpp", "health")["status"].get("unavailableNodes")
                == [{"name": a, "reason": "LeaseExpired"}]
            )
        )
        status = get(cluster, "gpp", "health")["status"]
        assert status["nodes"] == 2
        assert _devices(cluster, a) == []  # nothing published for the stale node
        state: OperatorState = operator.memo.state
        sample = state.metrics.registry.get_sample_value
        assert (sample("migpart_unavailable_nodes", {"reason": "LeaseExpired"}) or 0) >= 1
        assert _mignode(cluster, a)["spec"]["planId"] == plan_a  # nothing new planned there

        # the agent is back: the node returns to service and carries out its spec
        agents[a].start(latency_ms=0)
        back = eventually(
            lambda: (
                (_mignode(cluster, a).get("status") or {}).get("observedPlanId") == plan_a
                and _mignode(cluster, a)
            ),
            timeout=60,
        )
        assert (_condition(back, "Stale") or {}).get("status") != "True"
        eventually(lambda: any("1g10gb" in d for d in _devices(cluster, a)), timeout=60)
        eventually(
            lambda: not get(cluster, "gpp", "health")["status"].get("unavailableNodes"),
            timeout=30,
        )


def test_a_stale_mark_left_by_an_earlier_operator_goes_once_the_agent_renews(
    cluster: Testbed,
) -> None:
    node = "health-left"
    cluster.add_node(node, {"migpart-test": "health-left"})
    put_mignode(cluster, node, [gpu_status(0, [])])  # renews the Lease once
    stale = {
        "type": "Stale",
        "status": "True",
        "reason": "LeaseExpired",
        "message": "written by an operator that is gone",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    patch_status(cluster, "mignode", node, {"conditions": [stale]})
    with running_operator(cluster, lease_timeout_s=3600.0):
        time.sleep(2)  # a Lease merely existing proves nothing: the mark stays
        assert (_condition(_mignode(cluster, node), "Stale") or {}).get("status") == "True"
        renew_lease(cluster, node)  # the agent renews: alive now
        cleared = eventually(
            lambda: (
                (_condition(_mignode(cluster, node), "Stale") or {}).get("status") == "False"
                and _condition(_mignode(cluster, node), "Stale")
            )
        )
        assert cleared["reason"] == "LeaseRenewed"
