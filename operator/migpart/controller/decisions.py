"""The pure decisions of a round between the plan and the writes: which GPUs and nodes the
plan changes, which of them to reconfigure now, and the spec each of them gets."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from migpart.api.models import GpuSpec, MigInstanceSpec, MigNode, MigNodeSpec
from migpart.kube.snapshot import node_name, reconfiguring
from migpart.planning.model import GpuPlan, Plan, Snapshot

Geometry = frozenset[tuple[int, str]]  # (start, profile) of each instance of a GPU
Changes = dict[tuple[str, int], tuple[Geometry, Geometry]]


def layout_changes(snapshot: Snapshot, plan: Plan) -> Changes:
    """(node, GPU index) -> (its instances now, planned) for every GPU the plan changes.

    Plans cover every GPU of the policy (thousands at scale) and few of them change: plain
    tuples and an early exit for empty GPUs keep this a small part of a round.
    """
    now = {(n.name, g.index): g.instances for n in snapshot.nodes for g in n.gpus if g.instances}
    changes: Changes = {}
    for g in plan.gpus:
        have = now.get((g.node, g.index), ())
        if not have and not g.instances:
            continue
        before = frozenset((i.start, i.profile) for i in have)
        after = frozenset((i.start, i.profile) for i in g.instances)
        if before != after:
            changes[(g.node, g.index)] = (before, after)
    return changes


def changed_nodes(snapshot: Snapshot, plan: Plan) -> list[str]:
    return sorted({node for node, _ in layout_changes(snapshot, plan)})


def choose_nodes(
    changed: list[str], nodes: Iterable[MigNode], plan: Plan, max_concurrent: int
) -> list[str]:
    """The changed nodes to reconfigure now: never one still reconfiguring, and at most
    `max_concurrent` reconfiguring at once; nodes serving more requests go first."""
    busy = {node_name(n) for n in nodes if reconfiguring(n)}
    slots = max(0, max_concurrent - len(busy))
    served: dict[str, int] = {}
    for a in plan.assignments:
        served[a.node] = served.get(a.node, 0) + 1
    candidates = sorted((n for n in changed if n not in busy), key=lambda n: (-served.get(n, 0), n))
    return candidates[:slots]


def node_spec(plan_id: str, targets: Iterable[GpuPlan]) -> MigNodeSpec:
    return MigNodeSpec(
        plan_id=plan_id,
        gpus=[
            GpuSpec(
                index=g.index,
                instances=[MigInstanceSpec(profile=i.profile, start=i.start) for i in g.instances],
            )
            for g in sorted(targets, key=lambda g: g.index)
        ],
    )


def refused_spec_repair(node: MigNode, token: int | None) -> MigNodeSpec | None:
    """The spec that replaces one the agent refused, or None when there is none to replace.

    The agent refuses a spec whose fencing token is lower than one it applied: written by a
    leader whose write passed its fence and reached the API server only after a newer leader
    had written here (docs/destroy-protocol.md, "The fence"). It goes on with the spec it had,
    but the refused one stays the node's spec, so the node would count as reconfiguring for
    ever. The leader (`token` its own, at least the agent's) writes instead what the agent
    actually has: every reported GPU as it is, under the agent's last carried-out planId. That
    spec destroys and creates nothing, and the next round plans from it.
    """
    spec, status = node.spec, node.status
    if spec is None or status is None or spec.leader_term is None or status.leader_term is None:
        return None
    if spec.leader_term >= status.leader_term or token is None or token < status.leader_term:
        return None
    try:
        return MigNodeSpec(
            plan_id=status.observed_plan_id or f"repaired-{spec.plan_id or ''}"[:128],
            gpus=[
                GpuSpec(
                    index=g.index,
                    instances=[
                        MigInstanceSpec(profile=i.profile, start=i.start) for i in g.instances
                    ],
                )
                for g in status.gpus
            ],
        )
    except ValidationError:  # a reported instance no spec can name: the agent has to say
        return None
