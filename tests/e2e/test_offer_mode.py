"""Offer mode end to end: the operator started with `--offer-publishing`, a real kubelet and
agent (simulated NVML), the real kube-scheduler.

On 1.36+ (partitionable devices served) an `Auto` policy runs Offer: the node's stable pool
lists every placement before any pod asks; a pod whose profile has no instance anywhere is
allocated a placement at once and binds at once, and the agent makes the instance when kubelet
prepares the claim. Never Unschedulable on the way (no `FailedScheduling` Event), no planning
round in its path (no `Repartitioning` Event), and the pool is never written again: not for an
allocation, an instance made, kept, reused or destroyed to make room, nor for the operator's
restart. On 1.34 the same policy falls back to Reactive and the same pods are served
reactively, through rounds.
"""

from __future__ import annotations

import pytest

from migpart.demo.cluster import LocalCluster
from tests.e2e.conftest import H100, OPERATOR_FLAGS, SERVED, Scenario, wait_s
from tests.e2e.offer import (
    allocation_mode,
    by_profile,
    generation,
    instances,
    offered,
    operator_log,
    reasons,
)

pytestmark = pytest.mark.e2e

SERVE_S = 90.0


def test_pods_are_served_from_a_stable_pool_made_at_prepare_and_kept(
    offering: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4})
    scenario.eventually(
        "the policy's allocation mode reported", lambda: bool(allocation_mode(scenario))
    )
    allocation = allocation_mode(scenario)
    if not SERVED:
        assert allocation["mode"] == "Reactive"
        assert "not served: partitionable devices" in allocation["reason"]
        scenario.pod("p1", by_profile("3g.40gb"))
        scenario.wait_served("p1", SERVE_S)
        assert "FailedScheduling" in reasons(scenario, "p1", scenario.namespace)
        assert "Repartitioning" in reasons(scenario, scenario.pool)
        return
    assert (allocation["mode"], allocation["reason"]) == ("Offer", "Auto: Offer served")
    # every placement of the H100 is listed before any pod asks, and the spec says Offer
    scenario.eventually(
        "the pool lists every placement", lambda: len(offered(scenario, node)) == 25
    )
    assert scenario.mignode(node)["spec"]["allocation"] == "Offer"
    assert scenario.mignode(node)["spec"].get("gpus", []) == []
    published = generation(scenario, node)

    # 1. a new placement, made at prepare
    scenario.pod("p1", by_profile("3g.40gb"))
    [first] = scenario.wait_served("p1", SERVE_S)
    assert first["pool"] == node
    made = instances(scenario, node)
    where = first["device"].removeprefix("gpu-0-3g40gb-")
    uuid, _ = made[f"3g.40gb@{where}"]
    assert uuid.startswith("MIG-")
    assert "FailedScheduling" not in reasons(scenario, "p1", scenario.namespace)
    assert "Repartitioning" not in reasons(scenario, scenario.pool)

    # 2. released: the instance stays, free; the next pod of its placement reuses it
    scenario.finish("p1")
    scenario.eventually(
        "p1's instance kept, free",
        lambda: instances(scenario, node).get(f"3g.40gb@{where}") == (uuid, "Free"),
    )
    scenario.pod("p2", by_profile("3g.40gb"))
    [second] = scenario.wait_served("p2", SERVE_S)
    assert second["device"] == first["device"]  # first fit in the planner's order: the same
    assert instances(scenario, node)[f"3g.40gb@{where}"][0] == uuid  # reused, not made again

    # 3. a placement over the free instance: destroyed at prepare, then the new one made
    scenario.finish("p2")
    scenario.eventually(
        "p2's instance free", lambda: instances(scenario, node)[f"3g.40gb@{where}"][1] == "Free"
    )
    scenario.pod("p3", by_profile("7g.80gb"))
    [whole] = scenario.wait_served("p3", SERVE_S)
    assert whole["device"] == "gpu-0-7g80gb-0"
    assert list(instances(scenario, node)) == ["7g.80gb@0"]
    assert "FailedScheduling" not in reasons(scenario, "p3", scenario.namespace)

    # 4. the operator restarted: it computes the same pool and writes none
    took_over = len(operator_log(offering, "took_over"))
    offering.stop_operator()
    offering.start_operator(*OPERATOR_FLAGS, "--offer-publishing")
    scenario.eventually(
        "the restarted operator took over (every slice checked, written where it differs)",
        lambda: len(operator_log(offering, "took_over")) > took_over,
    )
    wait_s(3)  # and a round or two ran
    # never rewritten: not per allocation, instance, destroy, nor restart
    assert generation(scenario, node) == published
    assert "Repartitioning" not in reasons(scenario, scenario.pool)
