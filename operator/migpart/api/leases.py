"""The agent's heartbeat: one `coordination.k8s.io/v1` Lease per node, as kubelet keeps one.

The agent renews it every `LEASE_RENEW_S`; the operator watches these Leases (one watch for
all nodes, filtered by `LEASE_LABELS`) and takes a node whose Lease it has not seen renewed for
its lease timeout as unavailable (docs/operations.md, "Node leases"). Both sides name the Lease
from here.

They live in `kube-node-lease` by default, next to kubelet's own node Leases: every cluster has
that namespace (the API server creates it), so an agent never waits for an installer to make
one. A migpart Lease is named `migpart-<node>` so that it never collides with kubelet's, which
is named after the node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LEASE_NAMESPACE = "kube-node-lease"
LEASE_PREFIX = "migpart-"
LEASE_LABELS = {"app.kubernetes.io/managed-by": "migpart", "app.kubernetes.io/component": "agent"}
LEASE_DURATION_S = 25
"""`spec.leaseDurationSeconds` the agent writes; also the operator's default lease timeout.
Shorter than kubelet's 40 s node grace on purpose: kubelet deletes a driver's ResourceSlices 30 s
after its plugin went away, and by then the operator must already take the node as unavailable,
or it would publish the wiped slice again for a node no plugin serves. 25 s is still 2.5
renewal periods (a failed renewal is retried at once)."""
LEASE_RENEW_S = 10.0
"""How often the agent renews (a quarter of the duration, as kubelet does)."""


def lease_name(node: str) -> str:
    return f"{LEASE_PREFIX}{node}"


def lease_node(body: Mapping[str, Any]) -> str | None:
    """The node a watched Lease body belongs to (None: not one of ours)."""
    meta = body.get("metadata") or {}
    holder = (body.get("spec") or {}).get("holderIdentity")
    if not holder or meta.get("name") != lease_name(str(holder)):
        return None
    return str(holder)
