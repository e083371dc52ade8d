"""Between a plan and its actuation: which GPUs and nodes the plan changes, and which of the
changed nodes to reconfigure now.

The operator's rounds (`controller.rounds.reconcile`) and the simulator's migpart policy
(`sim.migpart`) both decide with these, so that the simulator reconfigures the nodes the
operator would.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from migpart.planning.model import Plan, Snapshot

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


def changed_nodes(changes: Changes) -> list[str]:
    """The nodes having a changed GPU, by name."""
    return sorted({node for node, _ in changes})


def choose_nodes(
    changed: Sequence[str], busy: Collection[str], plan: Plan, max_concurrent: int
) -> list[str]:
    """The changed nodes to reconfigure now: never one still reconfiguring (`busy`), and at
    most `max_concurrent` reconfiguring at once; nodes serving more requests go first, ties in
    the order of `changed`."""
    slots = max(0, max_concurrent - len(busy))
    served: dict[str, int] = {}
    for a in plan.assignments:
        served[a.node] = served.get(a.node, 0) + 1
    candidates = sorted((n for n in changed if n not in busy), key=lambda n: -served.get(n, 0))
    return candidates[:slots]
