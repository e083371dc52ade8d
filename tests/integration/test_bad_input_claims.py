"""Claims migpart cannot serve, on the real API server with the operator running: each gets a
Warning event saying why, and a good claim pending in the same round is still planned.

The API server accepts every claim of BAD (it type-checks CEL only as far as its declared
types go), so the operator is the first to say what is wrong with them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed, TestbedError
from tests.integration.conftest import (
    PROFILE_IS,
    RunningOperator,
    add_mignode,
    apply,
    claim_body,
    events,
    eventually,
    pending_pod,
    planned_spec,
    policy_body,
    policy_status,
)

pytestmark = pytest.mark.integration

ATTR = f'device.attributes["{DRIVER}"]'
CAP = f'device.capacity["{DRIVER}"]'
LABELS = {"migpart-test": "bad-claims"}


def _with_request(name: str, **exactly: Any) -> dict[str, Any]:
    body = claim_body(name, "default", PROFILE_IS.format("1g.10gb"))
    body["spec"]["devices"]["requests"][0]["exactly"].update(exactly)
    return body


# claim name -> (body, words its Unsatisfiable event must contain)
BAD = {
    "bad-attribute": (
        claim_body("bad-attribute", "default", f'{ATTR}.color == "red"'),
        ["no such member in mapping: 'color'", "devices have attributes"],
    ),
    "bad-type": (
        claim_body("bad-type", "default", f"{ATTR}.profile > 5"),
        ["no matching overload for > applied to (string, int)"],
    ),
    "bad-count": (_with_request("bad-count", count=8), ["count 8 is more than any node"]),
    "bad-all": (
        _with_request("bad-all", allocationMode="All", count=None),
        ["allocationMode All"],
    ),
    "bad-driver": (
        claim_body("bad-driver", "default", 'device.driver == "gpu.nvidia.com"'),
        ['satisfies device.driver == "gpu.nvidia.com"'],
    ),
}


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        pytest.param(f"{ATTR}.profile == ", "Syntax error", id="does-not-compile"),
        pytest.param(f"{CAP}.memory > 10", "no matching overload", id="quantity-compared-to-int"),
    ],
)
def test_the_api_server_refuses_cel_it_can_check(
    cluster: Testbed, expression: str, words: str
) -> None:
    """CEL that does not compile, and comparisons the typed capacity rules out, never reach
    migpart: the API server refuses the claim, naming the field. (Attributes are untyped
    there, so a wrong-type comparison on an attribute is the operator's to report.)"""
    body = claim_body("refused", "default", expression)
    with pytest.raises(TestbedError) as refused:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(body))
    message = str(refused.value)
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in message
    assert words in message


def test_bad_claims_are_told_why_and_a_good_claim_is_served(
    cluster: Testbed, operator: RunningOperator
) -> None:
    node = "bad-claims-node"
    add_mignode(cluster, node, LABELS)
    # A class of another driver: its claims are that driver's business, not migpart's.
    apply(
        cluster,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]},
        },
    )
    other = claim_body("other-driver", "default", "true")
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.example.com"
    bodies = [body for body, _ in BAD.values()] + [other]
    bodies.append(claim_body("good", "default", PROFILE_IS.format("3g.40gb")))
    for body in bodies:
        apply(cluster, body)
        name = body["metadata"]["name"]
        pending_pod(cluster, f"pod-{name}", "default", name, node_selector=LABELS)
    # One round sees them all: the batch window gathers them first.
    apply(
        cluster,
        policy_body("bad-claims", LABELS, reconfiguration={"batchWindowSeconds": 2}),
    )

    spec = planned_spec(cluster, node)
    profiles = [i["profile"] for g in spec["gpus"] for i in g["instances"]]
    assert profiles == ["3g.40gb"], spec

    for name, (_, words) in BAD.items():

        def warned(name: str = name) -> dict[str, Any]:
            found = events(cluster, name, "default", reason="Unsatisfiable")
            assert len(found) == 1, (name, found)
            return found[0]

        event = eventually(warned)
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "ResourceClaim"
        for w in words:
            assert w in event["message"], (name, event["message"])

    assert not events(cluster, "other-driver", "default")
    assert not events(cluster, "good", "default")

    def reported() -> dict[str, Any]:
        status = policy_status(cluster, "bad-claims")
        assert status.get("lastPlan", {}).get("planId") == spec["planId"]
        return status

    status = eventually(reported)
    assert status["lastPlan"]["satisfied"] == 1
    assert status["pendingRequests"] == len(BAD) + 1
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Unsatisfiable")
    assert ready["message"].startswith(f"{len(BAD)} pending claim(s)")
    cluster.kubectl("delete", "deviceclass", "gpu.example.com")
