"""Offer mode under faults, end to end (migpart issue 23): real kubelets, the real
kube-scheduler, agents on simulated NVML, the operator started with `--offer-publishing`.

- An NVML error at create: the node the pod prefers answers INSUFFICIENT_RESOURCES to every
  create (`--sim-faults create_insufficient=1.0`). On 1.36+ the scheduler allocates its
  offered placement, the relay writes the failure condition, and the pod is sent back and runs
  on the other node; nothing on the failing node is destroyed or left half made, and once no
  claim holds the failed placement the relay drops it from the spec (the agent stops
  retrying it) and the node does not offer it again meanwhile (its back-off).
- The operator SIGKILLed with an allocation in flight: once before the relay saw it, once after
  the relay wrote the spec but before the (stopped) agent created it. On 1.36+ the pod waits in
  PreBind meanwhile; the operator started again picks the allocation up and the pod runs on the
  placement it was allocated, created exactly once, nothing destroyed.

On 1.34 offer mode is not served: the policy runs Reactive and the same pods are served
through rounds, which the same faults must not stop either.

kube-scheduler polls binding conditions about every 5 s and gives up after 600 s; a restarted
operator takes the election Lease of a killed one after 15 s. The waits allow for those, not
for the 600 s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from migpart.demo.cluster import LocalCluster
from migpart.dra import INSTANCE_READY
from tests.e2e.conftest import H100, OPERATOR_FLAGS, SERVED, Scenario
from tests.e2e.test_offer_mode import by_profile, claim_of, offered, ready

pytestmark = pytest.mark.e2e

# a profile with one placement on an H100: a node offers it once, on GPU 0 at start 0
WHOLE = "7g.80gb"
WHOLE_DEVICE = "gpu-0-7g80gb-0"
# the agent's simulated NVML refuses every create
FAILING = ("--sim-faults", "create_insufficient=1.0")
# one binding-condition poll and a pod start, several times over
SERVE_S = 90.0
STEP_S = 60.0


def agent_log(sc: Scenario, node: str, event: str) -> list[dict[str, Any]]:
    """The node's agent's log lines of `event` (JSON lines; a restart appends to the file)."""
    path: Path = sc.cluster.dir / "logs" / f"agent-{node}.log"
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == event:
                out.append(entry)
    return out


def created(sc: Scenario, node: str) -> list[str]:
    """`profile@start` of every instance the node's agent created, in order."""
    return [f"{e['profile']}@{e['start']}" for e in agent_log(sc, node, "mig_instance_created")]


def instances(sc: Scenario, node: str) -> dict[str, str]:
    """`profile@start` -> MIG UUID ("" while half made) of what the agent reports on GPU 0."""
    [gpu] = sc.gpus(node)
    return {f"{i['profile']}@{i['start']}": str(i.get("uuid") or "") for i in gpu["instances"]}


def events(sc: Scenario, reason: str) -> list[dict[str, Any]]:
    """The test namespace's Events of `reason`."""
    items = sc.get("events", "-n", sc.namespace)["items"]
    return [e for e in items if e.get("reason") == reason]


def bound(sc: Scenario, pod: str) -> bool:
    return bool(sc.get("pod", pod, "-n", sc.namespace)["spec"].get("nodeName"))


def allocation(sc: Scenario, pod: str) -> dict[str, Any]:
    """The allocation of the pod's claim ({} while there is none)."""
    status = sc.get("pod", pod, "-n", sc.namespace).get("status") or {}
    if not status.get("resourceClaimStatuses"):
        return {}
    return dict((claim_of(sc, pod).get("status") or {}).get("allocation") or {})


def wanted(sc: Scenario, node: str) -> int:
    """How many instances the node's MigNode spec wants."""
    spec = sc.mignode(node).get("spec") or {}
    return sum(len(g.get("instances") or []) for g in spec.get("gpus") or [])


def dropped(sc: Scenario, node: str, placement: str) -> bool:
    """Whether the node's spec no longer wants `placement` (`profile@start` on GPU 0) and its
    agent carried that spec out without reporting any placement failed."""
    body = sc.mignode(node)
    spec, status = body.get("spec") or {}, body.get("status") or {}
    wants = [
        f"{i['profile']}@{i['start']}"
        for g in spec.get("gpus") or []
        if g["index"] == 0
        for i in g.get("instances") or []
    ]
    carried_out = status.get("observedPlanId") == spec.get("planId")
    return placement not in wants and carried_out and not status.get("failedInstances")


def unschedulable(sc: Scenario, pod: str) -> bool:
    return any(e["involvedObject"].get("name") == pod for e in events(sc, "FailedScheduling"))


def offers_whole(sc: Scenario, *nodes: str) -> list[bool]:
    """Whether each node offers the whole-GPU placement."""
    return [WHOLE_DEVICE in offered(sc, node) for node in nodes]


def test_an_nvml_error_at_create_sends_the_pod_to_another_node(
    offering: LocalCluster, scenario: Scenario
) -> None:
    failing = scenario.add_node(f"{H100}:1", labels={"e2e-first": "yes"}, agent_args=FAILING)
    healthy = scenario.add_node(f"{H100}:1")
    scenario.policy(reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4})
    if SERVED:
        scenario.eventually(
            f"{WHOLE} offered on both nodes", lambda: all(offers_whole(scenario, failing, healthy))
        )
    # kube-scheduler scores the failing node first wherever both fit
    scenario.pod("p1", by_profile(WHOLE), prefer={"e2e-first": "yes"})
    [device] = scenario.wait_served("p1", SERVE_S)

    # served on the healthy node, by an instance created there once
    assert scenario.get("pod", "p1", "-n", scenario.namespace)["spec"]["nodeName"] == healthy
    assert (device["pool"], device["device"]) == (healthy, WHOLE_DEVICE)
    made = instances(scenario, healthy)
    assert list(made) == [f"{WHOLE}@0"]
    assert made[f"{WHOLE}@0"].startswith("MIG-")
    assert created(scenario, healthy) == [f"{WHOLE}@0"]
    # the failing node: NVML refused before anything was made; nothing made, nothing destroyed
    assert instances(scenario, failing) == {}
    assert created(scenario, failing) == []
    assert agent_log(scenario, failing, "mig_instance_destroyed") == []
    # ... though it was tried there first
    assert agent_log(scenario, failing, "mig_instance_create_failed")
    if SERVED:
        # allocated there first, failed, sent back
        warnings = events(scenario, "NvmlError")
        assert warnings, "no NvmlError Warning on the claim"
        for event in warnings:
            assert event["type"] == "Warning"
            assert event["involvedObject"]["kind"] == "ResourceClaim"
            assert event["message"].startswith(f"{WHOLE_DEVICE} on node {failing}: ")
        # no claim holds the failed placement any more: the relay dropped it from the spec
        # (nothing there to destroy), the agent no longer tries it, and the node does not
        # offer it again before its back-off ends
        scenario.eventually(
            f"{WHOLE} dropped from {failing}'s spec, no longer reported failed",
            lambda: dropped(scenario, failing, f"{WHOLE}@0"),
            STEP_S,
        )
        assert WHOLE_DEVICE not in offered(scenario, failing)
        assert instances(scenario, failing) == {}
        assert agent_log(scenario, failing, "mig_instance_destroyed") == []
        # on the healthy node: the offered placement, made ready by the relay; or, where the
        # attempt that deallocated the claim marked the pod Unschedulable, the instance a
        # round made there first, which needs no binding condition
        claim = claim_of(scenario, "p1")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        if result.get("bindingConditions"):
            assert result["bindingConditions"] == [INSTANCE_READY]
            assert ready(claim)
        attempts = sum(int(e.get("count") or 1) for e in warnings)
        how = "an offered placement" if result.get("bindingConditions") else "a round's instance"
        print(f"failed on {failing} {attempts}x, served on {healthy} by {how}")  # pytest -rA
    else:
        # planned there first (the first node on ties), then, the create failed, elsewhere;
        # no relay in Reactive mode: the round's failed placement stays wanted and failed
        failed = scenario.mignode(failing)["status"].get("failedInstances") or []
        assert [(f["profile"], f["start"], f["reason"]) for f in failed] == [
            (WHOLE, 0, "NvmlError")
        ]
        assert scenario.get("gpp", scenario.pool)["status"]["allocation"]["mode"] == "Reactive"


def test_an_allocation_made_while_the_operator_was_down_is_served_once_it_is_back(
    offering: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4})
    if SERVED:
        scenario.eventually("3g.40gb offered", lambda: "gpu-0-3g40gb-0" in offered(scenario, node))

    # 1. SIGKILLed before the pod came: the relay never saw the allocation
    offering.kill_operator()
    scenario.pod("p1", by_profile("3g.40gb"))
    if SERVED:
        # allocated an offered placement at once; PreBind waits: nobody says ready
        scenario.eventually(
            "p1's claim allocated", lambda: bool(allocation(scenario, "p1")), STEP_S
        )
        first = allocation(scenario, "p1")
        [result] = first["devices"]["results"]
        assert result["bindingConditions"] == [INSTANCE_READY]
        assert not ready(claim_of(scenario, "p1"))
    else:
        scenario.eventually("p1 unschedulable", lambda: unschedulable(scenario, "p1"), STEP_S)
    assert wanted(scenario, node) == 0
    assert not bound(scenario, "p1")
    offering.start_operator(*OPERATOR_FLAGS, "--offer-publishing")
    [device] = scenario.wait_served("p1", SERVE_S)
    if SERVED:
        # on the placement allocated while the operator was down, never allocated again
        assert device["device"] == result["device"]
        assert allocation(scenario, "p1")["allocationTimestamp"] == first["allocationTimestamp"]
    assert len(instances(scenario, node)) == 1

    # 2. SIGKILLed after the relay (on 1.34: a round) wrote the spec, before the agent created
    offering.stop_agent(node)
    scenario.pod("p2", by_profile("3g.40gb"))
    scenario.eventually("a spec with p2's instance", lambda: wanted(scenario, node) == 2, STEP_S)
    if SERVED:
        [second] = allocation(scenario, "p2")["devices"]["results"]
        assert second["bindingConditions"] == [INSTANCE_READY]
        assert str(scenario.mignode(node)["spec"]["planId"]).startswith("relay+")
    offering.kill_operator()
    assert len(instances(scenario, node)) == 1
    offering.start_agent(node)
    scenario.eventually(
        "the agent created p2's instance", lambda: len(instances(scenario, node)) == 2, STEP_S
    )
    assert not bound(scenario, "p2")  # nobody said ready (on 1.34: published): operator down
    offering.start_operator(*OPERATOR_FLAGS, "--offer-publishing")
    [device] = scenario.wait_served("p2", SERVE_S)
    if SERVED:
        assert device["device"] == second["device"]
    assert scenario.phase("p1") == "Running"
    # each instance created once, and nothing destroyed
    made = created(scenario, node)
    assert sorted(made) == sorted(instances(scenario, node))
    assert len(set(made)) == len(made) == 2
    assert agent_log(scenario, node, "mig_instance_destroyed") == []
