"""The GpuPartitionPolicy status: what a round reports, built on what we last wrote.

`now` is the time a condition that changes status takes as its transition time (the round's
clock, as a Kubernetes `metav1.Time`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from migpart.api.models import (
    MAX_LISTED_NODES,
    AllocationStatus,
    Condition,
    GpuPartitionPolicyStatus,
    LastPlan,
    UnavailableNode,
    condition_of,
)
from migpart.controller.core.bodies import uid_of
from migpart.controller.rounds.scope import Scope
from migpart.types import Body

# (policy uid, the status as written)
Written = tuple[str, dict[str, Any]]


def previous_status(body: Body, written: Written | None = None) -> GpuPartitionPolicyStatus:
    """The status the next write builds on: what this operator last wrote for this very object
    (`written`, as (uid, status)), else the body's own (after a restart).

    The body can lag our last write; building on it would take `lastPlan` and the conditions'
    transition times back to an older round.
    """
    if written is not None and written[0] == uid_of(body):
        source: Any = written[1]
    else:
        source = body.get("status") or {}
    try:
        return GpuPartitionPolicyStatus.model_validate(source)
    except ValidationError:
        return GpuPartitionPolicyStatus()


def ready_condition(
    status: str, reason: str, message: str, previous: list[Condition], now: str
) -> Condition:
    old = condition_of(previous, "Ready")
    same = old is not None and old.status == status
    return Condition(
        type="Ready",
        status="True" if status == "True" else "False",
        reason=reason,
        message=message,
        last_transition_time=old.last_transition_time if same and old else now,
    )


def _generation(body: Body) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)


def excluded_condition(
    excluded: Mapping[str, str], previous: list[Condition], now: str
) -> Condition:
    """`NodesExcluded`: True while nodes the selector matches are left out of planning
    (controller/rounds/screening.py), naming each and why."""
    old = condition_of(previous, "NodesExcluded")
    status = "True" if excluded else "False"
    message = "; ".join(f"{name}: {why}" for name, why in sorted(excluded.items()))
    return Condition(
        type="NodesExcluded",
        status=status,
        reason="InvalidNodeStatus" if excluded else "AllNodesSound",
        message=(f"{len(excluded)} node(s) not planned: {message}" if excluded else "")[:4096],
        last_transition_time=(
            old.last_transition_time if old is not None and old.status == status else now
        ),
    )


def round_status(
    body: Body,
    scope: Scope,
    last_plan: LastPlan | None,
    written: Written | None,
    excluded: Mapping[str, str] | None = None,
    *,
    now: str,
    allocation: AllocationStatus | None = None,
) -> GpuPartitionPolicyStatus:
    """The status after a round over `scope` (which planned `last_plan`, if any); `excluded`:
    the policy's nodes left out of planning, and why; `allocation`: the mode in effect."""
    previous = previous_status(body, written)
    if not scope.nodes and scope.unavailable:
        ready = ready_condition(
            "False",
            "NodesUnavailable",
            f"all {len(scope.unavailable)} node(s) unavailable (see unavailableNodes)",
            previous.conditions,
            now,
        )
    elif not scope.nodes:
        ready = ready_condition(
            "False", "NoNodes", "the node selector matches no MigNode", previous.conditions, now
        )
    elif scope.demand.unsatisfiable:
        ready = ready_condition(
            "True",
            "Unsatisfiable",
            f"{len(scope.demand.unsatisfiable)} pending claim(s) no permitted profile can satisfy",
            previous.conditions,
            now,
        )
    else:
        ready = ready_condition("True", "Reconciled", "", previous.conditions, now)
    return GpuPartitionPolicyStatus(
        observed_generation=_generation(body),
        nodes=len(scope.nodes) + len(scope.unavailable),
        gpus=scope.gpus,
        pending_requests=scope.demand.pending,
        last_plan=last_plan or previous.last_plan,
        unavailable_nodes=[
            UnavailableNode.model_validate({"name": name, "reason": reason})
            for name, reason in scope.unavailable[:MAX_LISTED_NODES]
        ],
        allocation=allocation,
        conditions=[
            ready,
            excluded_condition(excluded or {}, previous.conditions, now),
            *(c for c in previous.conditions if c.type not in ("Ready", "NodesExcluded")),
        ],
    )


def invalid_status(
    body: Body, error: ValidationError, written: Written | None, now: str
) -> tuple[GpuPartitionPolicyStatus, str]:
    """The status of a policy whose spec is invalid, and the message naming the field."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = f"spec invalid at {where}: {first['msg']}"
    previous = previous_status(body, written)
    status = GpuPartitionPolicyStatus(
        observed_generation=_generation(body),
        conditions=[ready_condition("False", "InvalidSpec", message, previous.conditions, now)],
    )
    return status, message
