"""A dead agent does not stall its policy: once its Lease is stale the operator frees the
node's `maxConcurrentNodes` slot, plans and publishes nothing there and says so (MigNode
`Stale` condition, policy `unavailableNodes`); a restarted agent brings the node back.

Agents run as real `migpart agent --simulate` processes, so that one can be SIGKILLed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from migpart.controller.state import OperatorState
from migpart.testbed import Testbed
from tests.integration.agent_processes import (
    AgentProcess,
    agents_fixture,  # noqa: F401 - the `agents` fixture
    condition,
    devices,
    mignode,
    one_slot_policy,
    pending_claim,
    planned,
    spec_under_way,
)
from tests.integration.conftest import (
    eventually,
    get,
    gpu_status,
    patch_status,
    put_mignode,
    renew_lease,
    running_operator,
)

pytestmark = pytest.mark.integration

LEASE_TIMEOUT_S = 3.0
LABEL = {"migpart-test": "health"}


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
        one_slot_policy(cluster, "health", LABEL, a, b)
        pending_claim(cluster, "health-a", "1g.10gb", {"health-node": "a"})
        plan_a = spec_under_way(cluster, a, "1g.10gb")
        agents[a].kill()  # holds the policy's only slot, and will never finish

        pending_claim(cluster, "health-b", "3g.40gb", {"health-node": "b"})

        # a's lease goes stale: its slot is free, so b is repartitioned and its device published
        eventually(lambda: planned(mignode(cluster, b), "3g.40gb"), timeout=90)
        eventually(lambda: any("3g40gb" in d for d in devices(cluster, b)), timeout=60)
        stale = eventually(lambda: condition(mignode(cluster, a), "Stale"))
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
        assert devices(cluster, a) == []  # nothing published for the stale node
        state: OperatorState = operator.memo.state
        sample = state.metrics.registry.get_sample_value
        assert (sample("migpart_unavailable_nodes", {"reason": "LeaseExpired"}) or 0) >= 1
        assert mignode(cluster, a)["spec"]["planId"] == plan_a  # nothing new planned there

        # the agent is back: the node returns to service and carries out its spec
        agents[a].start(latency_ms=0)
        back = eventually(
            lambda: (
                (mignode(cluster, a).get("status") or {}).get("observedPlanId") == plan_a
                and mignode(cluster, a)
            ),
            timeout=60,
        )
        assert (condition(back, "Stale") or {}).get("status") != "True"
        eventually(lambda: any("1g10gb" in d for d in devices(cluster, a)), timeout=60)
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
        assert (condition(mignode(cluster, node), "Stale") or {}).get("status") == "True"
        renew_lease(cluster, node)  # the agent renews: alive now
        cleared = eventually(
            lambda: (
                (condition(mignode(cluster, node), "Stale") or {}).get("status") == "False"
                and condition(mignode(cluster, node), "Stale")
            )
        )
        assert cleared["reason"] == "LeaseRenewed"
