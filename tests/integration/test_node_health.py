"""A dead agent does not stall its policy: once its Lease is stale the operator frees the
node's `maxConcurrentNodes` slot, plans and publishes nothing there and says so (MigNode
`Stale` condition, policy `unavailableNodes`); a restarted agent brings the node back.

Agents run as real `migpart agent --simulate` processes, so that one can be SIGKILLed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from migpart.controller.core.state import OperatorState
from migpart.testbed import Testbed
from tests.integration.agent_processes import (
    AgentProcess,
    agents_fixture,  # noqa: F401 - the `agents` fixture
    condition,
    devices,
    mignode,
    planned,
    slot_held_by_a,
    two_agents,
)
from tests.integration.conftest import (
    add_mignode,
    eventually,
    patch_status,
    pending_claim,
    policy_status,
    renew_lease,
    running_operator,
)

pytestmark = pytest.mark.integration

LEASE_TIMEOUT_S = 3.0


def test_a_dead_agent_frees_its_slot_and_comes_back(
    cluster: Testbed, agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    # a's NVML is slow: it is still carrying out its spec when it is killed
    a, b = two_agents(cluster, agents, tmp_path, "health", 2000)
    with running_operator(cluster, lease_timeout_s=LEASE_TIMEOUT_S) as operator:
        plan_a = slot_held_by_a(cluster, "health", a, b)
        agents[a].kill()  # holds the policy's only slot, and will never finish

        pending_claim(cluster, b, "3g.40gb", {"health-node": "b"})

        # a's lease goes stale: its slot is free, so b is repartitioned and its device published
        eventually(lambda: planned(mignode(cluster, b), "3g.40gb"), timeout=90)
        eventually(lambda: any("3g40gb" in d for d in devices(cluster, b)), timeout=60)
        stale = eventually(lambda: condition(mignode(cluster, a), "Stale"))
        assert stale["status"] == "True"
        assert stale["reason"] == "LeaseExpired"
        assert "not renewed" in stale["message"]
        eventually(
            lambda: (
                policy_status(cluster, "health").get("unavailableNodes")
                == [{"name": a, "reason": "LeaseExpired"}]
            )
        )
        status = policy_status(cluster, "health")
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
            lambda: not policy_status(cluster, "health").get("unavailableNodes"),
            timeout=30,
        )


def test_a_stale_mark_left_by_an_earlier_operator_goes_once_the_agent_renews(
    cluster: Testbed,
) -> None:
    node = "health-left"
    add_mignode(cluster, node, {"migpart-test": "health-left"})  # renews the Lease once
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
