"""Offer mode end to end on the testbed's real kube-apiserver and kube-scheduler, with the
operator started with `--offer-publishing` and a real `migpart agent --simulate` process (one
H100, no kubelet: the pod is bound, not run).

On 1.36+ (partitionable devices and binding conditions served) an `Auto` policy runs Offer: a
pod whose profile has no instance anywhere is allocated an offered placement at once, the relay
adds it to the spec, the agent creates it, the claim gets the ready condition and the pod is
bound, with no `FailedScheduling` on the way and no planning round (no spec written by a
round, no `Repartitioning` Event). On 1.34 the same policy falls back to Reactive, and the
same pod is served reactively: Unschedulable first, then a round creates the instance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from migpart.controller.state import OperatorState
from migpart.dra import DRIVER, INSTANCE_READY
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from migpart.testing.builders import ClaimBuilder, PodBuilder, profile_is
from tests.integration.agent_processes import (
    AgentProcess,
    agents_fixture,  # noqa: F401 - the `agents` fixture
    mignode,
)
from tests.integration.conftest import (
    apply,
    events,
    eventually,
    get,
    policy_body,
    running_operator,
)

pytestmark = pytest.mark.integration

NS = "default"
LABEL = {"migpart-test": "offer-wiring"}
# On by default from 1.36 (kube_features.go); the testbed sets no feature gates.
SERVED = tuple(int(p) for p in kube_version().split(".")[:2]) >= (1, 36)


def pool_devices(bed: Testbed, node: str) -> list[dict[str, Any]]:
    """Every device of our slices of `node`'s pool, in slice-name order."""
    items = json.loads(bed.kubectl("get", "resourceslices", "-o", "json"))["items"]
    ours = sorted(
        (s for s in items if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == node),
        key=lambda s: s["metadata"]["name"],
    )
    return [d for s in ours for d in s["spec"].get("devices") or []]


def offered(bed: Testbed, node: str) -> list[str]:
    """The devices of the pool that wait for a binding condition: placements not created."""
    return [d["name"] for d in pool_devices(bed, node) if d.get("bindingConditions")]


def allocation_of(bed: Testbed, claim: str) -> dict[str, Any]:
    body = get(bed, "resourceclaim", claim, "-n", NS)
    results = ((body.get("status") or {}).get("allocation") or {}).get("devices") or {}
    [result] = results.get("results") or [{}]
    return dict(result)


def ready(bed: Testbed, claim: str) -> bool:
    devices = (get(bed, "resourceclaim", claim, "-n", NS).get("status") or {}).get("devices")
    return any(
        c["type"] == INSTANCE_READY and c["status"] == "True"
        for d in devices or []
        for c in d.get("conditions") or []
    )


def instances(bed: Testbed, node: str) -> list[tuple[str, int, str]]:
    gpus = (mignode(bed, node).get("status") or {}).get("gpus") or []
    return sorted(
        (i["profile"], i["start"], i.get("uuid") or "") for g in gpus for i in g["instances"]
    )


def reasons(bed: Testbed, name: str, namespace: str = "") -> list[str]:
    return [str(e["reason"]) for e in events(bed, name, namespace)]


def test_a_pod_is_served_from_the_offer_without_a_round(
    cluster: Testbed, agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    node, policy = "offer-wiring-a", "offer-wiring"
    cluster.add_node(node, LABEL)
    agents[node] = AgentProcess(cluster, node, tmp_path, 0)
    with running_operator(cluster, offer_publishing=True) as running:
        eventually(lambda: (mignode(cluster, node).get("status") or {}).get("gpus"), timeout=90)
        assert instances(cluster, node) == []
        apply(cluster, policy_body(policy, LABEL, reconfiguration={"batchWindowSeconds": 0}))
        status = eventually(
            lambda: (get(cluster, "gpp", policy).get("status") or {}).get("allocation")
        )
        if SERVED:
            assert status["mode"] == "Offer"
            assert status["reason"] == "Auto: Offer served"
            # the pool offers placements before any pod asks for one
            assert "gpu-0-3g40gb-0" in eventually(lambda: offered(cluster, node))
        else:
            assert status["mode"] == "Reactive"
            assert "not served: partitionable devices, binding conditions" in status["reason"]
            assert offered(cluster, node) == []

        apply(cluster, ClaimBuilder("offered", NS).request(profile_is("3g.40gb")).obj())
        pod = PodBuilder("offered", NS).container("main").claim("offered")
        apply(cluster, pod.node_selector({"kubernetes.io/hostname": node}).obj())
        bound = eventually(
            lambda: get(cluster, "pod", "offered", "-n", NS)["spec"].get("nodeName"), timeout=120
        )
        assert bound == node
        result = allocation_of(cluster, "offered")
        assert result["pool"] == node
        assert result["device"].startswith("gpu-0-3g40gb-")
        start = int(result["device"].rsplit("-", 1)[1])
        assert ("3g.40gb", start) in [(p, s) for p, s, _ in instances(cluster, node)]
        state: OperatorState = running.memo.state
        rounds_wrote = [e for e in running.steps(node) if e.step == "spec_written"]
        if SERVED:
            # allocated a placement not created yet, held in PreBind until the relay said ready
            assert result.get("bindingConditions") == [INSTANCE_READY]
            assert ready(cluster, "offered")
            assert "FailedScheduling" not in reasons(cluster, "offered", NS)
            assert rounds_wrote == []
            assert "Repartitioning" not in reasons(cluster, policy)
            assert state.offers.offered(node)
        else:
            # served reactively: the scheduler found nothing, a round created the instance
            assert "bindingConditions" not in result
            assert "FailedScheduling" in reasons(cluster, "offered", NS)
            assert rounds_wrote
            assert "Repartitioning" in reasons(cluster, policy)
            assert not state.offers.offered(node)
