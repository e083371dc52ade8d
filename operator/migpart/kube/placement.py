"""Which nodes a pending pod may run on, as far as a plan needs to know.

A device created on a node the pod can never run on serves nobody, and worse: the next round
sees a free instance that fits the claim and plans nothing more, so the pod waits for ever.
The operator therefore plans a claim only on nodes that every pod using it allows:

- `spec.nodeName` (a pod bound by hand),
- `spec.nodeSelector` (labels equal),
- `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution` (terms ORed,
  expressions within a term ANDed; operators In, NotIn, Exists, DoesNotExist, Gt, Lt on labels;
  `matchFields` on `metadata.name` with In and NotIn),
- the node's `NoSchedule` and `NoExecute` taints against the pod's tolerations.

Preferred affinity, pod (anti-)affinity and topology spread are left to kube-scheduler: they
rank nodes or depend on other pods, and a plan cannot honour them ahead of time. A term the
operator cannot read (an unknown operator or field) allows every node: planning on a node the
scheduler then refuses is the smaller mistake than never planning for the pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from migpart.types import Body

# Where one waiting pod may run (its node selector, affinity, tolerations), as
# `pod_placement` reads it: not a MIG placement (a profile at a start on a GPU), which is what
# "placement" means everywhere else in migpart.
PodPlacement = Mapping[str, Any]

_HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What placement needs of a Node: its labels and taints."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()


def node_facts(body: Body) -> NodeFacts:
    """The labels and taints of a Node body, for an index (built once per Node event, not
    once per round)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return NodeFacts(
        labels=dict(meta.get("labels") or {}),
        taints=tuple(dict(t) for t in spec.get("taints") or []),
    )


def pod_placement(pod: Body) -> dict[str, Any]:
    """The parts of a pod's spec that restrict its node, as plain data for an index, and its
    priority (`spec.priority`, set from its PriorityClass at admission), which becomes the
    priority of the planner requests of the claims it waits for, and when it was created
    (`metadata.creationTimestamp`), from which those requests age
    (`planning.overtime.aged_requests`)."""
    spec = pod.get("spec") or {}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return {
        "nodeName": spec.get("nodeName") or "",
        "nodeSelector": dict(spec.get("nodeSelector") or {}),
        "terms": [dict(t) for t in required.get("nodeSelectorTerms") or []],
        "tolerations": [dict(t) for t in spec.get("tolerations") or []],
        "priority": int(spec.get("priority") or 0),
        "created": str((pod.get("metadata") or {}).get("creationTimestamp") or ""),
    }


def _expression(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and len(values) == 1:
        try:
            have, bound = int(value or ""), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return True  # not readable here: leave it to the scheduler


def _term(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    for expr in term.get("matchExpressions") or []:
        if not _expression(expr, labels.get(str(expr.get("key")))):
            return False
    for expr in term.get("matchFields") or []:
        if expr.get("key") == "metadata.name" and not _expression(expr, name):
            return False
    return True


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        key = tol.get("key") or ""
        if tol.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def allows(placement: PodPlacement, name: str, node: NodeFacts) -> bool:
    """Whether a pod with this placement may run on node `name`."""
    if placement.get("nodeName") and placement["nodeName"] != name:
        return False
    for key, value in (placement.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return False
    terms = placement.get("terms") or []
    # An empty term list places no constraint; an empty term matches no node (as kube does).
    if terms and not any(t and _term(t, name, node.labels) for t in terms):
        return False
    tolerations = placement.get("tolerations") or []
    return all(_tolerated(t, tolerations) for t in node.taints if t.get("effect") in _HARD_EFFECTS)


# What a placement carries beside where the pod may run.
_NOT_PLACING = frozenset({"priority", "created"})


def _unconstrained(placement: PodPlacement) -> bool:
    return not (
        placement.get("nodeName") or placement.get("nodeSelector") or placement.get("terms")
    )


class NodeFilter:
    """`allowed(placements)` for many claims over one set of nodes, cached per distinct set
    of placements (pods from one template share theirs)."""

    def __init__(self, nodes: Mapping[str, NodeFacts]) -> None:
        self.nodes = nodes
        self.tainted = any(
            t.get("effect") in _HARD_EFFECTS for n in nodes.values() for t in n.taints
        )
        self._cache: dict[str, frozenset[str] | None] = {}

    def allowed(self, placements: Iterable[PodPlacement]) -> frozenset[str] | None:
        """The nodes every placement allows; None when they allow every node."""
        placements = list(placements)
        if not self.tainted and all(_unconstrained(p) for p in placements):
            return None
        key = json.dumps(
            [{k: v for k, v in p.items() if k not in _NOT_PLACING} for p in placements],
            sort_keys=True,
            default=str,
        )
        if key not in self._cache:
            self._cache[key] = frozenset(
                name
                for name, node in self.nodes.items()
                if all(allows(p, name, node) for p in placements)
            )
        return self._cache[key]
