"""What each service account of manifests/ may and may not do, asked of the real API server
with SubjectAccessReviews (tests/unit/test_manifests.py checks the rules equal the code's API
calls; this checks what the API server makes of them).

RBAC cannot name "this node's MigNode": the agent may create MigNodes and patch
mignodes/status for any name, and the admission policy narrows that to its own node
(tests/integration/test_admission.py).
"""

from __future__ import annotations

import json

import pytest

from migpart.api.leases import LEASE_NAMESPACE
from migpart.api.models import GROUP
from migpart.testbed import Testbed

pytestmark = pytest.mark.integration

NAMESPACE = "migpart-system"
OPERATOR = "migpart-operator"
AGENT = "migpart-agent"

# (service account, verb, group, resource, subresource, allowed), cluster-wide
Row = tuple[str, str, str, str, str, bool]

OPERATOR_ROWS: list[Row] = [
    # may
    (OPERATOR, "list", "resource.k8s.io", "resourceclaims", "", True),
    (OPERATOR, "watch", "", "pods", "", True),
    (OPERATOR, "create", "resource.k8s.io", "resourceslices", "", True),
    (OPERATOR, "update", "resource.k8s.io", "resourceslices", "", True),
    (OPERATOR, "delete", "resource.k8s.io", "resourceslices", "", True),  # a shrinking pool
    (OPERATOR, "patch", GROUP, "mignodes", "", True),
    (OPERATOR, "patch", GROUP, "gpupartitionpolicies", "status", True),
    (OPERATOR, "create", "", "events", "", True),
    # may not
    (OPERATOR, "get", "", "secrets", "", False),
    (OPERATOR, "list", "", "secrets", "", False),
    (OPERATOR, "watch", "", "secrets", "", False),
    (OPERATOR, "get", "", "configmaps", "", False),
    (OPERATOR, "create", "", "serviceaccounts", "token", False),
    (OPERATOR, "create", "", "pods", "", False),
    (OPERATOR, "delete", "", "pods", "", False),
    (OPERATOR, "update", "resource.k8s.io", "resourceclaims", "status", False),
    (OPERATOR, "patch", "resource.k8s.io", "resourceclaims", "status", False),  # nothing writes it
    (OPERATOR, "create", GROUP, "gpupartitionpolicies", "", False),
    (OPERATOR, "patch", GROUP, "gpupartitionpolicies", "", False),
    (OPERATOR, "delete", GROUP, "gpupartitionpolicies", "", False),
    (OPERATOR, "patch", GROUP, "mignodes", "status", True),  # the Stale condition
    (OPERATOR, "delete", GROUP, "mignodes", "", False),
    (OPERATOR, "create", "rbac.authorization.k8s.io", "clusterrolebindings", "", False),
    (OPERATOR, "patch", "", "nodes", "", False),
]

AGENT_ROWS: list[Row] = [
    # may (for its own node only: the admission policy)
    (AGENT, "get", "", "nodes", "", True),
    (AGENT, "create", GROUP, "mignodes", "", True),
    (AGENT, "watch", GROUP, "mignodes", "", True),
    (AGENT, "patch", GROUP, "mignodes", "status", True),
    (AGENT, "get", "resource.k8s.io", "resourceclaims", "", True),
    # the overlap guard: NVIDIA's DRA driver slices of its node (migpart.agent.publishers)
    (AGENT, "list", "resource.k8s.io", "resourceslices", "", True),
    # may not
    (AGENT, "get", "", "secrets", "", False),
    (AGENT, "list", "", "secrets", "", False),
    (AGENT, "create", GROUP, "gpupartitionpolicies", "", False),
    (AGENT, "patch", GROUP, "gpupartitionpolicies", "", False),
    (AGENT, "delete", GROUP, "gpupartitionpolicies", "", False),
    (AGENT, "patch", GROUP, "gpupartitionpolicies", "status", False),
    (AGENT, "create", "resource.k8s.io", "resourceslices", "", False),
    (AGENT, "update", "resource.k8s.io", "resourceslices", "", False),
    (AGENT, "delete", "resource.k8s.io", "resourceslices", "", False),
    (AGENT, "patch", GROUP, "mignodes", "", False),
    (AGENT, "update", GROUP, "mignodes", "", False),
    (AGENT, "delete", GROUP, "mignodes", "", False),
    (AGENT, "update", "resource.k8s.io", "resourceclaims", "status", False),
    (AGENT, "list", "resource.k8s.io", "resourceclaims", "", False),
    (AGENT, "patch", "", "nodes", "", False),
    (AGENT, "patch", "", "nodes", "status", False),
    (AGENT, "create", "", "pods", "", False),
    (AGENT, "create", "", "serviceaccounts", "token", False),
]


# (service account, verb, resource, allowed) on coordination.k8s.io Leases in each namespace
LEASE_ROWS = [
    (AGENT, "create", LEASE_NAMESPACE, True),
    (AGENT, "update", LEASE_NAMESPACE, True),
    (AGENT, "delete", LEASE_NAMESPACE, False),
    (AGENT, "list", LEASE_NAMESPACE, False),
    (AGENT, "update", "kube-system", False),  # leader-election Leases of the control plane
    (AGENT, "create", "default", False),
    (OPERATOR, "list", LEASE_NAMESPACE, True),
    (OPERATOR, "watch", LEASE_NAMESPACE, True),
    (OPERATOR, "update", LEASE_NAMESPACE, False),
    (OPERATOR, "create", LEASE_NAMESPACE, False),
    (OPERATOR, "update", "kube-system", False),
]


def _allowed(
    bed: Testbed,
    account: str,
    verb: str,
    group: str,
    resource: str,
    sub: str,
    namespace: str = "",
) -> bool:
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": sub}
    if namespace:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    out = bed.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    allowed: bool = json.loads(out)["status"].get("allowed", False)
    return allowed


def _id(row: Row) -> str:
    account, verb, _group, resource, sub, allowed = row
    target = f"{resource}/{sub}" if sub else resource
    return f"{account.removeprefix('migpart-')}-{'may' if allowed else 'not'}-{verb}-{target}"


@pytest.mark.parametrize("row", OPERATOR_ROWS + AGENT_ROWS, ids=_id)
def test_service_account_may_exactly(installed: Testbed, row: Row) -> None:
    account, verb, group, resource, sub, allowed = row
    assert _allowed(installed, account, verb, group, resource, sub) is allowed


@pytest.mark.parametrize(
    "row", LEASE_ROWS, ids=lambda r: f"{r[0].removeprefix('migpart-')}-{r[1]}-leases-in-{r[2]}"
)
def test_lease_rights_are_in_kube_node_lease_only(
    installed: Testbed, row: tuple[str, str, str, bool]
) -> None:
    account, verb, namespace, allowed = row
    got = _allowed(installed, account, verb, "coordination.k8s.io", "leases", "", namespace)
    assert got is allowed


@pytest.mark.parametrize("account", [OPERATOR, AGENT])
def test_service_accounts_hold_only_the_lease_role(installed: Testbed, account: str) -> None:
    """Besides their ClusterRole, the namespaced bindings naming them are the Lease ones: the
    node Leases in kube-node-lease, and for the operator its election Lease in its own
    namespace, which grants Leases and nothing else (a Secret reader could hide in another)."""
    bindings = json.loads(installed.kubectl("get", "rolebindings", "-A", "-o", "json"))["items"]
    named = [
        (b["metadata"]["namespace"], b["roleRef"]["name"])
        for b in bindings
        for s in b.get("subjects") or []
        if s.get("kind") == "ServiceAccount" and s.get("name") == account
    ]
    own = [(NAMESPACE, "migpart-operator-election")] if account == OPERATOR else []
    assert sorted(ns for ns, _ in named) == sorted([LEASE_NAMESPACE] + [ns for ns, _ in own])
    for namespace, role in own:
        assert (namespace, role) in named
        rules = json.loads(installed.kubectl("get", "role", role, "-n", namespace, "-o", "json"))
        assert rules["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ]
