"""The admission policy of manifests/agent-admission.yaml on a real API server: an agent's
token, bound to a pod on its node, writes that node's MigNode and nothing else's.

The tokens are real TokenRequests bound to Pods with spec.nodeName, as kubelet mounts them
into the agent's pod; the API server puts the pod's node into the token's user info. Requests
are made as the agent makes them (POST to create, merge PATCH of the status subresource).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from migpart.api.leases import LEASE_NAMESPACE, lease_name
from migpart.testbed import Testbed
from tests.integration.access import (
    AGENT,
    MIGNODES,
    NAMESPACE,
    account_token,
    agent_pod,
    call,
    create_mignode,
    forbidden,
)
from tests.integration.conftest import eventually, gpu_status

pytestmark = pytest.mark.integration

OPERATOR = "migpart-operator"
NODES = ("adm-node-a", "adm-node-b")


def _patch_status(bed: Testbed, token: str, node: str) -> tuple[int, str]:
    status = {"gpus": [gpu_status(0, []).model_dump(by_alias=True, mode="json")]}
    return call(bed, token, "PATCH", f"{MIGNODES}/{node}/status", {"status": status})


@pytest.fixture(scope="module")
def tokens(installed: Testbed) -> Iterator[dict[str, str]]:
    """One bound agent token per node, as kubelet would mount into each node's agent pod."""
    for node in NODES:
        installed.add_node(node)
        agent_pod(installed, f"agent-{node}", node)
    # The API server loads a new policy asynchronously: wait until it denies.
    probe = account_token(installed, AGENT, f"agent-{NODES[0]}")
    eventually(lambda: create_mignode(installed, probe, "adm-probe")[0] == 403)
    yield {node: account_token(installed, AGENT, f"agent-{node}") for node in NODES}
    installed.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--force", "--grace-period=0")
    installed.kubectl("delete", "mignodes", *NODES, "--ignore-not-found")


def test_agent_writes_its_own_mignode_and_status(
    installed: Testbed, tokens: dict[str, str]
) -> None:
    a, _ = NODES
    assert create_mignode(installed, tokens[a], a)[0] in (201, 409)
    code, body = _patch_status(installed, tokens[a], a)
    assert code == 200, body
    mignode = json.loads(installed.kubectl("get", "mignode", a, "-o", "json"))
    assert mignode["status"]["gpus"][0]["index"] == 0


def test_agent_is_forbidden_the_other_nodes_mignode(
    installed: Testbed, tokens: dict[str, str]
) -> None:
    a, b = NODES
    installed.kubectl("delete", "mignode", b, "--ignore-not-found")
    message = forbidden(create_mignode(installed, tokens[a], b))
    assert f"the migpart agent of node {a} may write only MigNode {a}, not {b}" in message
    assert not installed.kubectl("get", "mignode", b, "--ignore-not-found").strip()

    # B's own agent creates it; A still cannot write its status.
    assert create_mignode(installed, tokens[b], b)[0] == 201
    message = forbidden(_patch_status(installed, tokens[a], b))
    assert f"may write only MigNode {a}, not {b}" in message
    assert "status" not in json.loads(installed.kubectl("get", "mignode", b, "-o", "json"))


def test_agent_token_bound_to_no_pod_writes_no_mignode(
    installed: Testbed, tokens: dict[str, str]
) -> None:
    a, _ = NODES
    create_mignode(installed, tokens[a], a)
    unbound = account_token(installed, AGENT)
    assert "names no node" in forbidden(_patch_status(installed, unbound, a))
    assert "names no node" in forbidden(create_mignode(installed, unbound, "adm-node-c"))


def test_policy_does_not_bind_the_operator(installed: Testbed, tokens: dict[str, str]) -> None:
    """The operator writes every node's spec; its token names no node."""
    for node in NODES:
        create_mignode(installed, tokens[node], node)
    operator = account_token(installed, OPERATOR)
    for node in NODES:
        spec = {"spec": {"planId": "adm-test", "gpus": []}}
        code, body = call(installed, operator, "PATCH", f"{MIGNODES}/{node}", spec)
        assert code == 200, body


def _lease(holder_node: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": holder_node, "leaseDurationSeconds": 40},
    }


def test_agent_renews_only_its_own_nodes_lease(installed: Testbed, tokens: dict[str, str]) -> None:
    """A compromised agent cannot keep another node looking alive (or let it look dead)."""
    a, b = NODES
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
    for node in NODES:
        installed.kubectl(
            "delete", "lease", lease_name(node), "-n", LEASE_NAMESPACE, "--ignore-not-found"
        )
    code, body = call(installed, tokens[a], "POST", leases, _lease(a, lease_name(a)))
    assert code == 201, body
    message = forbidden(call(installed, tokens[a], "POST", leases, _lease(a, lease_name(b))))
    assert f"may write only Lease {lease_name(a)}, not {lease_name(b)}" in message
    assert call(installed, tokens[b], "POST", leases, _lease(b, lease_name(b)))[0] == 201
    current = json.loads(
        installed.kubectl("get", "lease", lease_name(b), "-n", LEASE_NAMESPACE, "-o", "json")
    )
    message = forbidden(call(installed, tokens[a], "PUT", f"{leases}/{lease_name(b)}", current))
    assert f"not {lease_name(b)}" in message
