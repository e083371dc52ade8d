"""The pure decisions of a round between the plan and the writes that speak the MigNode API:
the spec each chosen node gets, and the spec that replaces one its agent refused. Which GPUs
and nodes a plan changes, and which to reconfigure now, are `planning.changes` (the simulator
decides with them too)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from migpart.api.models import GpuSpec, MigInstanceSpec, MigNode, MigNodeSpec
from migpart.planning.model import GpuPlan


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
