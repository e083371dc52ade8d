"""The agents' node Leases as the operator sees them, and the `Stale` condition it derives
(written by `kube.objects.patch_mignode_conditions`).

One list+watch of migpart's Leases (a label selector, in one namespace) for the whole cluster:
at 1,000 nodes renewing every 10 s that is 100 small events a second, which cost the operator
a dict update each and never a planning round. What a renewal means (fresh or stale) is
decided by `controller.core.health.NodeHealth`, which this feeds through `LeaseSink`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import structlog
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api

from migpart.api.leases import LEASE_LABELS, lease_node
from migpart.api.models import Condition, condition_of
from migpart.kube.watch import follow, label_selector
from migpart.slices.dra import now_iso

log = structlog.get_logger(__name__)

STALE = "Stale"


class LeaseSink(Protocol):
    """Where the watch delivers: every Lease at each (re)list, then each change."""

    def leases_listed(self, renewals: Mapping[str, str]) -> None: ...

    def lease_renewed(self, node: str, renew_time: str) -> None: ...

    def lease_deleted(self, node: str) -> None: ...

    def lease_watch_broken(self) -> None:
        """Renewals are not seen until the next list."""
        ...


def _renewal(lease: Mapping[str, Any]) -> tuple[str, str] | None:
    """(node, renewTime) of one of our Leases, as plain JSON (None: not ours, or never
    renewed). The renewTime is kept as the API server wrote it: it is only compared."""
    node = lease_node(lease)
    renew = (lease.get("spec") or {}).get("renewTime")
    if node is None or not renew:
        return None
    return node, str(renew)


class _Renewals:
    """`kube.watch.Sink` -> `LeaseSink`: Lease bodies to (node, renewTime)."""

    def __init__(self, sink: LeaseSink) -> None:
        self._sink = sink

    def listed(self, objects: Sequence[Mapping[str, Any]]) -> None:
        self._sink.leases_listed(dict(r for obj in objects if (r := _renewal(obj))))

    def changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        renewal = _renewal(obj)
        if renewal is None:
            return
        if kind == "DELETED":
            self._sink.lease_deleted(renewal[0])
        else:
            self._sink.lease_renewed(*renewal)

    def broken(self) -> None:
        self._sink.lease_watch_broken()


async def watch_leases(api: ApiClient, namespace: str, sink: LeaseSink) -> None:
    """List and watch migpart's Leases in `namespace` until cancelled (`kube.watch.follow`:
    plain JSON, since at 1,000 nodes this watch carries 100 events a second)."""
    leases: Any = CoordinationV1Api(api)
    await follow(
        functools.partial(leases.list_namespaced_lease, namespace),
        _Renewals(sink),
        "leases",
        label_selector=label_selector(LEASE_LABELS),
    )


def stale_conditions(
    conditions: list[Condition], stale: bool, message: str
) -> list[Condition] | None:
    """The MigNode's conditions with `Stale` set as told, or None when they already say so.
    An absent `Stale` condition means fresh: the agent's own status writes drop it."""
    old = condition_of(conditions, STALE)
    if (old is None and not stale) or (old is not None and old.status == str(stale)):
        return None
    condition = Condition(
        type=STALE,
        status="True" if stale else "False",
        reason="LeaseExpired" if stale else "LeaseRenewed",
        message=message[:4000],
        last_transition_time=now_iso(),
    )
    return [*(c for c in conditions if c.type != STALE), condition]
