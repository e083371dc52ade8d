"""Offer mode end to end: the operator started with `--offer-publishing`, a real kubelet and
agent (simulated NVML), the real kube-scheduler.

On 1.36+ (partitionable devices and binding conditions served) an `Auto` policy runs Offer: a
pod whose profile has no instance anywhere is allocated an offered placement at once, the
relay adds it to the MigNode spec, the agent creates it, the claim gets the ready condition,
the pod binds and runs. Never Unschedulable on the way (no `FailedScheduling` Event), and no
planning round in its path (no `Repartitioning` Event; the only spec is the relay's). On 1.34
the same policy falls back to Reactive and the same pod is served reactively, through a round.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from migpart.demo.cluster import LocalCluster
from migpart.dra import DRIVER, INSTANCE_READY
from tests.e2e.conftest import H100, SERVED, Scenario

pytestmark = pytest.mark.e2e


def by_profile(profile: str) -> str:
    return f'device.attributes["{DRIVER}"].profile == "{profile}"'


def pool_devices(sc: Scenario, node: str) -> list[dict[str, Any]]:
    """Every device of our slices of `node`'s pool, in slice-name order."""
    items = sc.get("resourceslices")["items"]
    ours = sorted(
        (s for s in items if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == node),
        key=lambda s: s["metadata"]["name"],
    )
    return [d for s in ours for d in s["spec"].get("devices") or []]


def offered(sc: Scenario, node: str) -> list[str]:
    """The pool's devices that wait for a binding condition: placements not created yet."""
    return [d["name"] for d in pool_devices(sc, node) if d.get("bindingConditions")]


def reasons(sc: Scenario, name: str, namespace: str | None = None) -> list[str]:
    scope = ["-n", namespace] if namespace else ["-A"]
    items = json.loads(sc.tb.kubectl("get", "events", *scope, "-o", "json"))["items"]
    return [str(e["reason"]) for e in items if e["involvedObject"].get("name") == name]


def claim_of(sc: Scenario, pod: str) -> dict[str, Any]:
    body = sc.get("pod", pod, "-n", sc.namespace)
    [status] = body["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = sc.get("resourceclaim", status["resourceClaimName"], "-n", sc.namespace)
    return claim


def ready(claim: dict[str, Any]) -> bool:
    return any(
        c["type"] == INSTANCE_READY and c["status"] == "True"
        for d in (claim.get("status") or {}).get("devices") or []
        for c in d.get("conditions") or []
    )


def test_a_pod_is_served_from_the_offer_with_no_round_and_never_unschedulable(
    offering: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4})
    allocation: dict[str, Any] = {}

    def resolved() -> bool:
        allocation.update(
            (scenario.get("gpp", scenario.pool).get("status") or {}).get("allocation") or {}
        )
        return bool(allocation)

    scenario.eventually("the policy's allocation mode reported", resolved)
    if SERVED:
        assert (allocation["mode"], allocation["reason"]) == ("Offer", "Auto: Offer served")
        # the pool offers placements before any pod asks for one
        scenario.eventually(
            "3g.40gb placements offered", lambda: "gpu-0-3g40gb-0" in offered(scenario, node)
        )
    else:
        assert allocation["mode"] == "Reactive"
        assert "not served: partitionable devices, binding conditions" in allocation["reason"]

    scenario.pod("p1", by_profile("3g.40gb"))
    [device] = scenario.wait_served("p1")
    assert device["pool"] == node
    assert device["device"].startswith("gpu-0-3g40gb-")
    claim = claim_of(scenario, "p1")
    spec = scenario.mignode(node)["spec"]
    pod_reasons = reasons(scenario, "p1", scenario.namespace)
    if SERVED:
        # allocated a placement not created yet; PreBind held the pod until the relay said ready
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == [INSTANCE_READY]
        assert ready(claim)
        assert "FailedScheduling" not in pod_reasons
        assert "Repartitioning" not in reasons(scenario, scenario.pool)
        assert str(spec["planId"]).startswith("relay+")  # written by the relay, not a round
    else:
        assert "FailedScheduling" in pod_reasons  # served reactively: Unschedulable first
        assert "Repartitioning" in reasons(scenario, scenario.pool)
        assert "+" not in str(spec["planId"])
