"""Offer mode's test world, shared by the offer tests (test_offers.py, test_offer_rounds.py,
test_offer_pool_writes.py): a node, a cluster with one policy over it, an operator state that
offers, and what a pool lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from migpart.api.models import (
    FailedInstance,
    MigNode,
)
from migpart.controller.reconcile import PolicyRound
from migpart.controller.scope import Cluster
from migpart.controller.state import OperatorState
from migpart.dra import DRIVER
from migpart.kube.features import DraFeatures
from migpart.kube.placement import NodeFacts
from migpart.planning.model import PolicyView
from migpart.slice_content import SliceContent
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import (
    DEVICE_CLASS,
    mignode,
    offline_state,
    placement,
    policy,
)
from tests.unit.kube.factories import gpu

SERVED = DraFeatures(True, True, "served: partitionable devices, binding conditions")
NONE = DraFeatures(False, False, "not served: partitionable devices, binding conditions")
EVERY_PROFILE = PolicyView(allowed=None)


def node(*gpus: Any, failed: list[FailedInstance] | None = None) -> MigNode:
    body = mignode("a", 1, gpus=list(gpus) or [gpu(0), gpu(1)])
    if failed:
        body["status"]["failedInstances"] = [f.model_dump(by_alias=True) for f in failed]
    return MigNode.model_validate(body)


def devices(pool: list[SliceContent]) -> list[dict[str, Any]]:
    return [d for s in pool for d in s.devices]


def by_name(pool: list[SliceContent]) -> dict[str, dict[str, Any]]:
    return {str(d["name"]): d for d in devices(pool)}


def memory(device: dict[str, Any]) -> set[tuple[str, str]]:
    """(counter set, memory slice) a device consumes."""
    return {
        (c["counterSet"], name)
        for c in device.get("consumesCounters") or []
        for name in c["counters"]
        if name.startswith("memory-slice-")
    }


def world(
    nodes: dict[str, dict[str, Any]],
    claims: Sequence[dict[str, Any]] = (),
    *,
    generation: int = 1,
    unschedulable: bool = True,
    **spec: Any,
) -> Cluster:
    """Node pool `a`, policy `pa` with `spec`, each claim used by a waiting pod that the
    scheduler found `unschedulable` (or has not)."""
    labels = {name: {"pool": "a"} for name in nodes}
    waits = {**placement(), "unschedulable": True} if unschedulable else placement()
    spec.setdefault("reconfiguration", {"batchWindowSeconds": 0})
    return Cluster(
        mignodes=nodes,
        node_labels=labels,
        policies={"pa": policy("pa", "a", generation, **spec)},
        claims={f"ns/{c['metadata']['name']}": c for c in claims},
        waiting={f"ns/{c['metadata']['name']}": (waits,) for c in claims},
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={name: NodeFacts(v, ()) for name, v in labels.items()},
    )


def offering_state(effects: InMemoryEffects, publishing: bool = True) -> OperatorState:
    state = offline_state(effects)
    state.dra = SERVED
    state.offer_publishing = publishing
    return state


async def run(state: OperatorState, cluster: Cluster) -> None:
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
