"""Reading ResourceClaims and Pods: which claims are pending, prepared or allocated, and which
devices are allocated.

Pure functions over API bodies (plain dicts as the watch delivers them) and parsed MigNodes,
so that the indexes can store small values and the rules are unit-tested without an API
server. Each state has this one definition, the one the operator's rounds use
(`controller.rounds.scope.ScopeCache`, `controller.rounds.destroy`).

A claim is pending when it is unallocated and a pod that uses it is waiting to be scheduled:
not bound to a node, not gated, not being deleted (`pod_waiting`). A pod names its claims directly
(`spec.resourceClaims[].resourceClaimName`) or through a ResourceClaimTemplate, in which case
the generated claim's name is in `status.resourceClaimStatuses[].resourceClaimName`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from migpart.api.models import MigNode
from migpart.slices.dra import RESOURCE_GROUP, RESOURCE_VERSION, DeviceId, allocated_ids
from migpart.types import Body


def claim_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def body_key(body: Body) -> str:
    meta = body.get("metadata") or {}
    return claim_key(str(meta.get("namespace", "")), str(meta.get("name", "")))


def is_allocated(claim: Body) -> bool:
    """The claim itself says it is allocated (`status.allocation`)."""
    return bool((claim.get("status") or {}).get("allocation"))


class AllocatedDevices:
    """Our devices that the claims of a claim index hold, kept across rounds: a claim's
    devices are parsed again only when its body changed (by identity: an index keeps a
    claim's body object until the claim changes), so a round costs the claims that changed,
    not all of them."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[Body, frozenset[DeviceId]]] = {}
        self._all: frozenset[DeviceId] = frozenset()

    def of(self, claims: Mapping[str, Body]) -> frozenset[DeviceId]:
        changed = False
        for gone in self._claims.keys() - claims.keys():
            changed = changed or bool(self._claims.pop(gone)[1])
        for key, body in claims.items():
            known = self._claims.get(key)
            if known is not None and known[0] is body:
                continue
            devices = frozenset(allocated_ids(body))
            changed = changed or devices != (known[1] if known else frozenset())
            self._claims[key] = (body, devices)
        if changed:
            self._all = frozenset().union(*(d for _, d in self._claims.values() if d))
        return self._all


def pod_claim_keys(pod: Body) -> frozenset[str]:
    """Every claim the pod uses, as "namespace/name" (direct and template-generated)."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    names = {
        str(ref["resourceClaimName"])
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []
        if ref.get("resourceClaimName")
    }
    names |= {
        str(st["resourceClaimName"])
        for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if st.get("resourceClaimName")
    }
    return frozenset(claim_key(namespace, n) for n in names)


def pod_waiting(pod: Body) -> bool:
    """The pod waits for the scheduler: not bound to a node yet, no scheduling gate holds it
    back, not being deleted, not finished. Whether the scheduler has tried it already
    (`PodScheduled=False/Unschedulable`) does not matter: under a burst its first verdict can
    take tens of seconds, and a claim that existing free devices can serve is planned onto them
    (nothing is created for it)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or spec.get("schedulingGates"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") in (None, "Pending")


def pending_claims(
    claims: Mapping[str, Body], waiting: Iterable[str], allocated: frozenset[str] = frozenset()
) -> Iterator[tuple[str, Body]]:
    """(key, body) of every pending claim, by key: unallocated, and used by a waiting pod.

    `waiting` holds the claim keys of waiting pods (see `pod_claim_keys`; a key the claim
    index does not hold yet is skipped); `allocated` the keys of claims known to be allocated
    from elsewhere than the claim itself, which the claim watch may not show yet (see
    `prepared_claims`).
    """
    for key in sorted(waiting):
        claim = claims.get(key)
        if claim is None or key in allocated or is_allocated(claim):
            continue
        yield key, claim


def prepared_claims(node: MigNode) -> frozenset[str]:
    """The claims ("namespace/name") that the node's agent reports prepared on an instance.

    kubelet prepares a claim only after kube-scheduler allocated it and bound its pod, so such
    a claim is allocated even while the claim and pod watches, which are separate streams
    from the MigNode watch, still show it unallocated and its pod waiting. Counting it
    as pending then would plan a second device for it.
    """
    if node.status is None:
        return frozenset()
    return frozenset(c for gpu in node.status.gpus for inst in gpu.instances for c in inst.claims)


def claim_generation(claim: Body) -> int:
    return int((claim.get("metadata") or {}).get("generation") or 0)


async def list_claims_quorum(api: ApiClient) -> list[dict[str, Any]]:
    """Every ResourceClaim, read with a quorum LIST (no resourceVersion given).

    A LIST without resourceVersion is served from etcd with a consistent read, so it includes
    every allocation committed before the call started: the destroy protocol relies on this to
    see allocations that raced with its slice write (the watch cache might lag behind).
    """
    result: dict[str, Any] = await CustomObjectsApi(api).list_cluster_custom_object(
        RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims"
    )
    items: list[dict[str, Any]] = result.get("items") or []
    return items
