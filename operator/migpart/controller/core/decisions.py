"""The pure decisions of a round between the plan and the writes that speak the MigNode API:
the spec each chosen node gets, and the spec that replaces one its agent refused. Which GPUs
and nodes a plan changes, and which to reconfigure now, are `planning.changes` (the simulator
decides with them too)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from migpart.api.models import GpuSpec, MigInstanceSpec, MigNode, MigNodeSpec, MigNodeStatus
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


def offer_spec(plan_id: str) -> MigNodeSpec:
    """The spec of an offering node: no instance listed (the agent makes each one when kubelet
    prepares its claim, and keeps it), so that nothing the agent does on its own fights the
    prepare path."""
    return MigNodeSpec(plan_id=plan_id, allocation="Offer")


def as_it_is(status: MigNodeStatus, plan_id: str) -> MigNodeSpec | None:
    """A spec that wants every reported GPU as it is: it destroys and creates nothing, and
    rounds plan from it (None: a reported instance no spec can name; the agent has to say)."""
    try:
        return MigNodeSpec(
            plan_id=plan_id,
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
    except ValidationError:
        return None


def handed_back_spec(node: MigNode, plan_id: str) -> MigNodeSpec | None:
    """The spec that hands an offering node back to reactive mode: what it has, as it is
    (`as_it_is`; None: the node has no status yet, then `offer_spec`'s empty reactive twin)."""
    if node.status is None:
        return MigNodeSpec(plan_id=plan_id)
    return as_it_is(node.status, plan_id)


def refused_spec_repair(node: MigNode, token: int | None) -> MigNodeSpec | None:
    """The spec that replaces one the agent refused, or None when there is none to replace.

    The agent refuses a spec whose fencing token is lower than one it applied: written by a
    leader whose write passed its fence and reached the API server only after a newer leader
    had written here (docs/destroy-protocol.md, "The fence"). It goes on with the spec it had,
    but the refused one stays the node's spec, so the node would count as reconfiguring for
    ever. The leader (`token` its own, at least the agent's) writes instead what the agent
    actually has (`as_it_is`) under the agent's last carried-out planId and with the refused
    spec's allocation mode.
    """
    spec, status = node.spec, node.status
    if spec is None or status is None or spec.leader_term is None or status.leader_term is None:
        return None
    if spec.leader_term >= status.leader_term or token is None or token < status.leader_term:
        return None
    plan_id = status.observed_plan_id or f"repaired-{spec.plan_id or ''}"[:128]
    if spec.allocation == "Offer":
        return offer_spec(plan_id)
    return as_it_is(status, plan_id)
