"""Offer mode's relay against the real API server (1.36+: binding conditions served).

The test writes what kube-scheduler would (an allocation of a placement not created yet, with
the binding conditions the device carried) and what the agent would (its MigNode status);
the operator runs in-process. It checks that the relay adds the placement to the spec, that
the API server accepts the binding conditions the operator writes into the claim's
`status.devices`, and that of two claims allocated overlapping placements only one is
created and the other gets the failure condition and a Warning Event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from migpart.dra import DRIVER, INSTANCE_FAILED, INSTANCE_READY, placement_device_fields
from migpart.testbed import Testbed
from tests.integration.conftest import (
    LONG_LEASE_TIMEOUT_S,
    RunningOperator,
    apply,
    claim_body,
    events,
    eventually,
    get,
    gpu_status,
    patch_status,
    policy_body,
    put_mignode,
    running_operator,
)

pytestmark = pytest.mark.integration

NAMESPACE = "default"


def allocate_offered(bed: Testbed, claim: str, node: str, device: str) -> None:
    """The claim's allocation as kube-scheduler writes it for a device with binding
    conditions (it copies them into the result)."""
    fields = placement_device_fields()
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": node,
        "device": device,
        "bindingConditions": fields["bindingConditions"],
        "bindingFailureConditions": fields["bindingFailureConditions"],
    }
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    allocation = {
        "devices": {"results": [result]},
        "nodeSelector": {"nodeSelectorTerms": [selector]},
    }
    patch_status(bed, "resourceclaim", claim, {"allocation": allocation}, "-n", NAMESPACE)


def served(bed: Testbed, claim: str) -> bool:
    """Whether the API server kept the binding conditions in the allocation (1.36+)."""
    body = get(bed, "resourceclaim", claim, "-n", NAMESPACE)
    [result] = body["status"]["allocation"]["devices"]["results"]
    return bool(result.get("bindingConditions"))


def wanted(bed: Testbed, node: str) -> list[tuple[str, int]]:
    spec = get(bed, "mignode", node).get("spec") or {}
    return sorted(
        (i["profile"], i["start"])
        for g in spec.get("gpus") or []
        if g["index"] == 0
        for i in g.get("instances") or []
    )


def condition(bed: Testbed, claim: str, device: str) -> dict[str, Any] | None:
    body = get(bed, "resourceclaim", claim, "-n", NAMESPACE)
    for entry in (body.get("status") or {}).get("devices") or []:
        if entry["driver"] == DRIVER and entry["device"] == device:
            conditions = entry.get("conditions") or []
            return conditions[0] if conditions else None
    return None


@pytest.fixture
def offering(cluster: Testbed) -> Iterator[RunningOperator]:
    """An operator that publishes offers (`--offer-publishing`), with an Auto policy over the
    test's node: Offer where the API server serves it (1.36+), Reactive elsewhere."""
    with running_operator(
        cluster, lease_timeout_s=LONG_LEASE_TIMEOUT_S, offer_publishing=True
    ) as running:
        apply(cluster, policy_body("offer", {"migpart-test": "offer"}))
        yield running


def mode(bed: Testbed) -> str | None:
    status = get(bed, "gpupartitionpolicy", "offer").get("status") or {}
    return (status.get("allocation") or {}).get("mode")


def test_an_allocated_placement_is_created_and_bound_and_an_overlapping_one_fails(
    cluster: Testbed, offering: RunningOperator
) -> None:
    node = "offer-a"
    cluster.add_node(node, {"migpart-test": "offer"})
    put_mignode(cluster, node, [gpu_status(0, [("3g.40gb", 0)])])
    for name in ("offer-c1", "offer-c2"):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(claim_body(name, NAMESPACE, "true")))
    in_effect = eventually(lambda: mode(cluster))

    # c1 gets 3g.40gb@4, free next to the 3g.40gb@0 that exists: the relay wants it created
    allocate_offered(cluster, "offer-c1", node, "gpu-0-3g40gb-4")
    if not served(cluster, "offer-c1"):
        # Kubernetes 1.34: the API server drops binding conditions (alpha gate off), the
        # policy runs Reactive and the relay leaves the node alone; where an allocated
        # placement does not exist, the agent creates it at NodePrepareResources (agent tests)
        assert in_effect == "Reactive"
        assert wanted(cluster, node) == []
        return
    assert in_effect == "Offer"
    eventually(lambda: wanted(cluster, node) == [("3g.40gb", 0), ("3g.40gb", 4)])
    assert condition(cluster, "offer-c1", "gpu-0-3g40gb-4") is None

    # c2 gets 7g.80gb@0 from a stale slice: it overlaps both, and nothing is dropped for it
    allocate_offered(cluster, "offer-c2", node, "gpu-0-7g80gb-0")
    failed = eventually(lambda: condition(cluster, "offer-c2", "gpu-0-7g80gb-0"))
    assert (failed["type"], failed["status"], failed["reason"]) == (
        INSTANCE_FAILED,
        "True",
        "PlacementConflict",
    )
    assert wanted(cluster, node) == [("3g.40gb", 0), ("3g.40gb", 4)]
    eventually(
        lambda: [
            e for e in events(cluster, "offer-c2", NAMESPACE) if e["reason"] == "PlacementConflict"
        ]
    )

    # the agent created c1's instance: ready, and the API server took the condition as written
    plan = get(cluster, "mignode", node)["spec"]["planId"]
    put_mignode(
        cluster, node, [gpu_status(0, [("3g.40gb", 0), ("3g.40gb", 4)])], observed_plan_id=plan
    )
    ready = eventually(lambda: condition(cluster, "offer-c1", "gpu-0-3g40gb-4"))
    assert (ready["type"], ready["status"], ready["reason"]) == (
        INSTANCE_READY,
        "True",
        "InstanceCreated",
    )
    assert ready["lastTransitionTime"]
