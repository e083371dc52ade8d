"""Offer mode: the agent killed inside a prepare, on a real kubelet (issue 35).

The agent's simulated NVML ends the process (exit 137, as SIGKILL leaves it) at a crash point
of the prepare path (`--sim-faults crash_after=...`, migpart.agent.simulator): right after the
destroy that made room for the allocated placement, before its create; or right after the
create, before the CDI spec is written. The agent is started again with the same flags (the
crash marker it wrote keeps it from crashing again), kubelet retries the prepare, and:

- the pod runs on the placement it was allocated before the crash;
- nothing prepared was destroyed (the scenario's InvariantMonitor);
- nothing leaked: every instance on the GPU is complete and prepared for a claim or free, and
  the MigNode status reports exactly what the GPU holds;
- each instance was made once (the killed agent's create is reused, not made again).

On 1.34 offer mode is not served: the policy runs Reactive, where prepare makes and destroys
nothing (the reconciler does, outside any prepare), so the crash points never fire; the tests
check that there: the same pods served through planning rounds, by the agent process that
started, which wrote no crash marker.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from migpart.agent.simulator import CRASH_STATUS, CRASHED_FILE, mig_uuid
from migpart.demo.cluster import LocalCluster
from tests.e2e.conftest import H100, SERVED, Scenario
from tests.e2e.offer import by_profile, instances, offered, reasons

pytestmark = pytest.mark.e2e

SERVE_S = 90.0
# kubelet retries the prepare with its pod-sync back-off, once the plugin registered again
RETRY_S = 180.0
POLICY = {"reconfiguration": {"batchWindowSeconds": 0, "maxConcurrentNodes": 4}}


def state_dir(cluster: LocalCluster, node: str) -> Path:
    return cluster.nodes[node].dir / "state"


def on_gpu(cluster: LocalCluster, node: str) -> list[dict[str, Any]]:
    """What the simulated GPU 0 holds, whatever the agent says (`ci` None: half made)."""
    raw = json.loads((state_dir(cluster, node) / "simulated-nvml.json").read_text())
    return list(raw.get("0", []))


def crash_marker(cluster: LocalCluster, node: str) -> dict[str, Any] | None:
    path = state_dir(cluster, node) / CRASHED_FILE
    return json.loads(path.read_text()) if path.exists() else None


def agent_ended(cluster: LocalCluster, node: str, timeout_s: float = SERVE_S) -> int:
    """Wait for the node's agent process to end; its exit status. (Not `wait_for`: that
    fails as soon as a component died.)"""
    proc = cluster.nodes[node].proc
    assert proc is not None
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"the agent of {node} did not end"
        time.sleep(0.2)
    return proc.returncode


def restarted(cluster: LocalCluster, node: str) -> None:
    """The ended agent reaped and started again with the flags it had."""
    cluster.kill_agent(node)
    cluster.start_agent(node)


def creates(cluster: LocalCluster, node: str) -> list[str]:
    """`profile@start` of every create the node's agents logged, every run of it (a create
    the crash cut short before its log line is in the crash marker instead)."""
    log = (cluster.dir / "logs" / f"agent-{node}.log").read_text(errors="replace")
    made = []
    for line in log.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            entry = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == "mig_instance_created":
                made.append(f"{entry['profile']}@{entry['start']}")
    return made


def leaks(sc: Scenario, node: str) -> list[str]:
    """What is wrong with the GPU: a half-made instance, one the status does not report (or
    reports and the GPU lacks), one neither prepared for a claim nor free."""
    held = on_gpu(sc.cluster, node)
    wrong = [f"half made: {i}" for i in held if i["ci"] is None]
    [gpu] = sc.gpus(node)
    reported = {(i["profile"], i["start"]): i for i in gpu["instances"]}
    there = {(i["profile"], i["start"]) for i in held}
    if set(reported) != there:
        wrong.append(f"the status reports {sorted(reported)}, the GPU holds {sorted(there)}")
    wrong += [
        f"neither prepared nor free: {i}"
        for i in reported.values()
        if (i["state"], bool(i["claims"])) not in {("Prepared", True), ("Free", False)}
    ]
    return wrong


def assert_nothing_leaked(sc: Scenario, node: str) -> None:
    """Every instance on the GPU complete, reported, and prepared for a claim or free (the
    status written after the last prepare)."""
    with contextlib.suppress(TimeoutError):  # the assertion below says what is wrong
        sc.eventually("the GPU and its status agree", lambda: not leaks(sc, node), 30.0)
    assert leaks(sc, node) == []


def prepared(sc: Scenario, node: str) -> dict[str, list[str]]:
    """`profile@start` -> the claims the agent reports an instance of GPU 0 prepared for."""
    [gpu] = sc.gpus(node)
    return {f"{i['profile']}@{i['start']}": list(i["claims"]) for i in gpu["instances"]}


def pid(cluster: LocalCluster, node: str) -> int:
    proc = cluster.nodes[node].proc
    assert proc is not None
    return proc.pid


def agent_running(cluster: LocalCluster, node: str) -> bool:
    proc = cluster.nodes[node].proc
    return proc is not None and proc.poll() is None


def claim_of(sc: Scenario, pod: str) -> str:
    body = sc.get("pod", pod, "-n", sc.namespace)
    [status] = body["status"]["resourceClaimStatuses"]
    return f"{sc.namespace}/{status['resourceClaimName']}"


def reactive_premise(sc: Scenario, node: str, started: int) -> None:
    """1.34: the policy runs Reactive; the pods went through rounds and the armed crash
    points never fired: prepare made and destroyed nothing there."""
    assert sc.get("gpp", sc.pool)["status"]["allocation"]["mode"] == "Reactive"
    assert "Repartitioning" in reasons(sc, sc.pool)
    assert agent_running(sc.cluster, node)
    assert pid(sc.cluster, node) == started
    assert crash_marker(sc.cluster, node) is None
    assert_nothing_leaked(sc, node)


def test_an_agent_killed_between_the_destroy_and_the_create_finishes_on_the_retry(
    offering: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(
        f"{H100}:1", agent_args=("--sim-faults", "crash_after=prepare_destroy")
    )
    started = pid(offering, node)
    scenario.policy(**POLICY)
    if SERVED:
        scenario.eventually(
            "the pool lists every placement", lambda: len(offered(scenario, node)) == 25
        )
    # a free 1g.10gb, made for a first pod that is gone
    scenario.pod("p1", by_profile("1g.10gb"))
    [small] = scenario.wait_served("p1", SERVE_S)
    where = small["device"].removeprefix("gpu-0-1g10gb-")
    scenario.finish("p1")
    scenario.eventually(
        "p1 unprepared", lambda: all(s != "Prepared" for _, s in instances(scenario, node).values())
    )
    # a 7g.80gb overlaps every placement of the GPU: prepare destroys the free 1g.10gb first
    scenario.pod("p2", by_profile("7g.80gb"))
    if not SERVED:
        [whole] = scenario.wait_served("p2", SERVE_S)
        assert whole["device"] == "gpu-0-7g80gb-0"
        reactive_premise(scenario, node, started)
        return
    assert instances(scenario, node)[f"1g.10gb@{where}"][1] == "Free"
    scenario.eventually("p2 allocated", lambda: bool(scenario.allocated("p2")))
    [allocated] = scenario.allocated("p2")
    assert allocated["device"] == "gpu-0-7g80gb-0"
    assert agent_ended(offering, node) == CRASH_STATUS
    marker = crash_marker(offering, node)
    assert marker is not None
    assert (marker["point"], marker["profile"], marker["start"]) == (
        "prepare_destroy",
        "1g.10gb",
        int(where),
    )
    assert on_gpu(offering, node) == []  # room made, nothing created yet

    restarted(offering, node)
    [whole] = scenario.wait_served("p2", RETRY_S)
    assert whole == allocated  # the placement allocated before the crash
    claim = claim_of(scenario, "p2")
    scenario.eventually(
        "the 7g.80gb reported prepared for p2's claim",
        lambda: prepared(scenario, node) == {"7g.80gb@0": [claim]},
    )
    assert_nothing_leaked(scenario, node)
    assert sorted(creates(offering, node)) == [f"1g.10gb@{where}", "7g.80gb@0"]  # each once
    assert scenario.monitor.violations == []


def test_an_agent_killed_between_the_create_and_the_cdi_write_reuses_the_instance(
    offering: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(f"{H100}:1", agent_args=("--sim-faults", "crash_after=prepare_create"))
    started = pid(offering, node)
    scenario.policy(**POLICY)
    scenario.pod("p1", by_profile("3g.40gb"))
    if not SERVED:
        scenario.wait_served("p1", SERVE_S)
        scenario.pod("p2", by_profile("1g.10gb"))
        scenario.wait_served("p2", SERVE_S)
        reactive_premise(scenario, node, started)
        return
    scenario.eventually("p1 allocated", lambda: bool(scenario.allocated("p1")))
    [allocated] = scenario.allocated("p1")
    assert agent_ended(offering, node) == CRASH_STATUS
    where = allocated["device"].removeprefix("gpu-0-3g40gb-")
    marker = crash_marker(offering, node)
    assert marker is not None
    assert (marker["point"], marker["profile"], marker["start"]) == (
        "prepare_create",
        "3g.40gb",
        int(where),
    )
    [made] = on_gpu(offering, node)  # made, complete, before the crash
    assert (made["profile"], made["start"]) == ("3g.40gb", int(where))
    assert made["ci"] is not None
    checkpoint = state_dir(offering, node) / "checkpoint.json"
    if checkpoint.exists():
        assert json.loads(checkpoint.read_text()).get("claims", {}) == {}  # not recorded
    cdi = offering.nodes[node].dir / "cdi"
    assert not (cdi.is_dir() and list(cdi.glob("*.json")))  # no CDI spec written

    restarted(offering, node)
    [device] = scenario.wait_served("p1", RETRY_S)
    assert device == allocated
    claim = claim_of(scenario, "p1")
    scenario.eventually(
        "the 3g.40gb reported prepared for p1's claim",
        lambda: prepared(scenario, node) == {f"3g.40gb@{where}": [claim]},
    )
    [gpu] = scenario.gpus(node)
    [reported] = gpu["instances"]
    assert reported["uuid"] == mig_uuid(gpu["uuid"], made["gi"])  # the instance made before
    assert creates(offering, node) == []  # the restarted agent made none (the marker has it)
    assert list(cdi.glob("*.json"))

    # the same flags, the marker there: the next create at prepare does not crash the agent
    again = pid(offering, node)
    scenario.pod("p2", by_profile("1g.10gb"))
    scenario.wait_served("p2", SERVE_S)
    assert pid(offering, node) == again
    assert agent_running(offering, node)
    assert len(creates(offering, node)) == 1
    assert_nothing_leaked(scenario, node)
    assert scenario.monitor.violations == []
