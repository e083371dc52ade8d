"""Pending claims make the operator write MigNode.spec; policy status and events report it."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from migpart.testbed import Testbed
from tests.integration.conftest import (
    RunningOperator,
    add_mignode,
    apply,
    events,
    eventually,
    get,
    gpu_status,
    mignode_spec,
    pending_claim,
    planned_spec,
    policy_body,
    policy_status,
    put_mignode,
)

pytestmark = pytest.mark.integration


def one_pending_claim(cluster: Testbed, suffix: str, profile: str, **policy: Any) -> str:
    """Node plan-SUFFIX (labelled migpart-test=SUFFIX, one empty H100), policy-SUFFIX over it
    (no batch window; `policy`: more spec fields) and claim-SUFFIX for a `profile` of the
    pending pod pod-SUFFIX. Returns the node's name."""
    node, labels = f"plan-{suffix}", {"migpart-test": suffix}
    add_mignode(cluster, node, labels)
    spec = {"reconfiguration": {"batchWindowSeconds": 0}, **policy}
    apply(cluster, policy_body(f"policy-{suffix}", labels, **spec))
    pending_claim(cluster, f"claim-{suffix}", profile, pod=f"pod-{suffix}")
    return node


def test_pending_claim_produces_mignode_spec(cluster: Testbed, operator: RunningOperator) -> None:
    node = one_pending_claim(cluster, "b", "3g.40gb")
    spec = planned_spec(cluster, node)
    instances = spec["gpus"][0]["instances"]
    assert {"profile": "3g.40gb", "start": instances[0]["start"]} in instances
    assert [i["profile"] for i in instances].count("3g.40gb") == 1

    def reported() -> dict[str, Any]:
        status = policy_status(cluster, "policy-b")
        assert status.get("lastPlan", {}).get("planId") == spec["planId"]
        return status

    status = eventually(reported)
    assert status["nodes"] == 1
    assert status["gpus"] == 1
    assert status["pendingRequests"] == 1
    assert status["lastPlan"]["satisfied"] == 1
    assert status["lastPlan"]["created"] >= 1
    assert status["observedGeneration"] >= 1
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert eventually(lambda: events(cluster, "policy-b", reason="Repartitioning"))

    # level-triggered: with the demand unchanged, later rounds write no new plan
    written = [e for e in operator.steps(node) if e.step == "spec_written"]
    assert len(written) == 1
    put_mignode(cluster, node, [gpu_status(0, [])])  # wake everything up again
    eventually(lambda: len(operator.hooks.journal) > 0 and get(cluster, "mignode", node))
    assert get(cluster, "mignode", node)["spec"]["planId"] == spec["planId"]


def test_unsatisfiable_claim_warns_once_and_plans_nothing(
    cluster: Testbed, operator: RunningOperator
) -> None:
    node = one_pending_claim(cluster, "u", "7g.80gb", profiles={"allow": ["1g.10gb"]})

    warned = eventually(lambda: events(cluster, "claim-u", "default", reason="Unsatisfiable"))
    assert warned[0]["type"] == "Warning"
    assert "7g.80gb" in warned[0]["message"]

    def counted() -> dict[str, Any]:
        status = policy_status(cluster, "policy-u")
        assert status.get("pendingRequests") == 1
        return status

    status = eventually(counted)
    assert "lastPlan" not in status
    assert not mignode_spec(cluster, node).get("planId")
    warned = events(cluster, "claim-u", "default", reason="Unsatisfiable")
    assert sum(e.get("count", 1) for e in warned) == 1


def test_policy_without_nodes_is_not_ready(cluster: Testbed, operator: RunningOperator) -> None:
    apply(cluster, policy_body("policy-empty", {"migpart-test": "nothing-has-this"}))

    def reported() -> dict[str, Any]:
        status = policy_status(cluster, "policy-empty")
        ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
        assert ready
        assert ready[0]["status"] == "False"
        return ready[0]

    ready = eventually(reported)
    assert ready["reason"] == "NoNodes"


def test_policies_carry_no_finalizer_and_a_deleted_one_stops_planning(
    cluster: Testbed, operator: RunningOperator
) -> None:
    for name in ("policy-gone", "policy-orphan"):
        apply(cluster, policy_body(name, {"migpart-test": "nothing-has-this"}))

    def reported(name: str) -> dict[str, Any]:
        body = get(cluster, "gpupartitionpolicy", name)
        assert (body.get("status") or {}).get("conditions")  # its loop ran a round
        return body

    for name in ("policy-gone", "policy-orphan"):
        assert not eventually(functools.partial(reported, name))["metadata"].get("finalizers")
    assert {"policy-gone", "policy-orphan"} <= operator.policy_loops()

    # Deleted while the operator runs: the object goes at once, and so does its loop.
    cluster.kubectl("delete", "gpupartitionpolicy", "policy-gone", "--wait=true", "--timeout=30s")
    eventually(lambda: "policy-gone" not in operator.policy_loops() or None)

    # Deleted while the operator is down (e.g. during an uninstall): nothing holds it back.
    operator.shut_down()
    cluster.kubectl("delete", "gpupartitionpolicy", "policy-orphan", "--wait=true", "--timeout=30s")
    assert "policy-orphan" not in cluster.kubectl("get", "gpupartitionpolicies", "-o", "name")


def test_dry_run_reports_and_changes_nothing(cluster: Testbed, operator: RunningOperator) -> None:
    node = one_pending_claim(cluster, "dry", "2g.20gb", mode="DryRun")

    def reported() -> dict[str, Any]:
        status = policy_status(cluster, "policy-dry")
        assert status.get("lastPlan")
        return status

    status = eventually(reported)
    assert status["lastPlan"]["created"] >= 1
    assert eventually(lambda: events(cluster, "policy-dry", reason="DryRunPlan"))
    assert not mignode_spec(cluster, node).get("planId")
    assert not [e for e in operator.steps(node) if e.step == "spec_written"]


def test_claim_is_planned_only_where_its_pod_may_run(
    cluster: Testbed, operator: RunningOperator
) -> None:
    """Policy place-a comes first in line, but the pod selects place-b's node: a device made
    on place-a's node would serve nobody and, being free, would stop any further planning."""
    for policy, node in (("place-a", "place-a1"), ("place-b", "place-b1")):
        add_mignode(cluster, node, {"migpart-test": policy})
        apply(
            cluster,
            policy_body(
                policy, {"migpart-test": policy}, reconfiguration={"batchWindowSeconds": 0}
            ),
        )
    pending_claim(cluster, "claim-place", "2g.20gb", {"migpart-test": "place-b"}, pod="pod-place")

    spec = planned_spec(cluster, "place-b1")
    assert [i["profile"] for i in spec["gpus"][0]["instances"]] == ["2g.20gb"]
    assert not mignode_spec(cluster, "place-a1").get("planId")
    assert not [e for e in operator.steps("place-a1") if e.step == "spec_written"]


def test_under_shortage_the_higher_priority_pod_is_planned_first(
    cluster: Testbed, operator: RunningOperator
) -> None:
    """One GPU, two pods in one batch window: a 4g.40gb one (normal priority) and a 7g.80gb
    one whose PriorityClass is higher. Smallest-first alone would cut the 4g.40gb; the pod's
    priority must win the GPU instead."""
    node = "prio-a"
    add_mignode(cluster, node, {"migpart-test": "prio"})
    apply(
        cluster,
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "migpart-test-high"},
            "value": 100000,
        },
    )
    pending_claim(cluster, "claim-low", "4g.40gb", pod="pod-low")
    pending_claim(
        cluster, "claim-high", "7g.80gb", pod="pod-high", priority_class="migpart-test-high"
    )
    apply(
        cluster,
        policy_body(
            "policy-prio", {"migpart-test": "prio"}, reconfiguration={"batchWindowSeconds": 2}
        ),
    )

    instances = planned_spec(cluster, node)["gpus"][0]["instances"]
    assert instances == [{"profile": "7g.80gb", "start": 0}]
    status = eventually(lambda: policy_status(cluster, "policy-prio").get("lastPlan"))
    assert (status["satisfied"], status["unsatisfied"]) == (1, 1)
    cluster.kubectl("delete", "priorityclass", "migpart-test-high", "--ignore-not-found")
