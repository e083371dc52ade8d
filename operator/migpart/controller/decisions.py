"""The pure decisions of a round between the plan and the writes: which GPUs and nodes the
plan changes, which of them to reconfigure now, and the spec each of them gets."""

from __future__ import annotations

from collections.abc import Iterable

from migpart.api.models import (
    GpuSpec,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    condition_status,
)
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


def grows_only(changes: Changes, node: str) -> bool:
    """Every GPU the plan changes on `node` keeps all it has (its planned layout and what is
    in use) and only gains instances: nothing there needs the destroy protocol."""
    return all(before <= after for (n, _), (before, after) in changes.items() if n == node)


def choose_nodes(
    changes: Changes, nodes: Iterable[MigNode], plan: Plan, max_concurrent: int
) -> list[str]:
    """The changed nodes to reconfigure now.

    A node still reconfiguring gets a new spec only when the plan merely adds instances to
    the layout it is moving to (`grows_only`) and its agent reports nothing wrong (no
    `Degraded`): it already holds a slot, and the agent carries out the newest spec in its
    next pass. Under a burst, the planner packs new requests next to the instances of the
    last plan; if those nodes had to finish first, the requests would wait a round each.
    Every other changed node takes one of `max_concurrent` slots (minus the nodes
    reconfiguring now), nodes serving more requests first.
    """
    changed = sorted({n for n, _ in changes})
    busy = {node_name(n): n for n in nodes if reconfiguring(n)}
    topped_up = [
        n for n in changed if n in busy and not degraded(busy[n]) and grows_only(changes, n)
    ]
    slots = max(0, max_concurrent - len(busy))
    served: dict[str, int] = {}
    for a in plan.assignments:
        served[a.node] = served.get(a.node, 0) + 1
    candidates = sorted((n for n in changed if n not in busy), key=lambda n: (-served.get(n, 0), n))
    return topped_up + candidates[:slots]


def degraded(node: MigNode) -> bool:
    """The agent reports a problem (an instance it kept, a GPU lost, an NVML failure)."""
    if node.status is None:
        return False
    return condition_status(node.status.conditions, "Degraded") == "True"


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
