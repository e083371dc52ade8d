"""The agents' node Leases as the operator sees them, and the `Stale` condition it derives
(written by `kube.objects.patch_mignode_conditions`).

One list+watch of migpart's Leases (a label selector, in one namespace) for the whole cluster:
at 1,000 nodes renewing every 10 s that is 100 small events a second, which cost the operator
a dict update each and never a planning round. What a renewal means (fresh or stale) is
decided by `controller.health.NodeHealth`, which this feeds through `LeaseSink`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.leases import LEASE_LABELS, lease_name
from migpart.api.models import Condition
from migpart.dra import now_iso

log = structlog.get_logger(__name__)

WATCH_TIMEOUT_S = 300
MAX_BACKOFF_S = 30.0
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
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    name = (lease.get("metadata") or {}).get("name")
    renew = spec.get("renewTime")
    if not holder or name != lease_name(str(holder)) or not renew:
        return None
    return str(holder), str(renew)


def _selector() -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(LEASE_LABELS.items()))


async def watch_leases(api: ApiClient, namespace: str, sink: LeaseSink) -> None:
    """List and watch migpart's Leases in `namespace` until cancelled; relist after any break
    (a failed list is logged once per outage and retried with back-off)."""
    leases: Any = CoordinationV1Api(api)
    backoff = 0.5
    failing = False
    while True:
        try:
            # plain JSON, not the client's models: at 1,000 nodes this watch carries 100
            # events a second, and building a V1Lease (managedFields and all) per event
            # would cost the idle operator several per cent of a core
            response = await leases.list_namespaced_lease(
                namespace, label_selector=_selector(), _preload_content=False
            )
            body = await response.read()
            response.release()
            if not 200 <= response.status <= 299:
                raise ApiException(status=response.status, reason=body.decode(errors="replace"))
            listed = json.loads(body)
            items = listed.get("items") or []
            sink.leases_listed(dict(r for item in items if (r := _renewal(item))))
            if failing:
                log.info("lease_watch_restored", namespace=namespace)
            failing, backoff = False, 0.5
            version = (listed.get("metadata") or {}).get("resourceVersion")
            await _follow(leases, namespace, version, sink)
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            if not failing:
                log.warning(
                    "lease_watch_failed",
                    namespace=namespace,
                    error=str(err).splitlines()[0] if str(err) else type(err).__name__,
                    retry="with back-off",
                )
        # A dead watch would look like every agent dead: a bug must not end it either.
        except Exception:
            log.exception("lease_watch_crashed", namespace=namespace)
        else:
            continue  # the watch ended normally (its timeout): list again
        sink.lease_watch_broken()
        failing = True
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


async def _follow(leases: Any, namespace: str, version: str | None, sink: LeaseSink) -> None:
    """Deliver the watch's events from `version` until it ends (its timeout) or reports an
    error (e.g. 410 Gone: the caller lists again). One JSON parse per event, no models."""
    response = await leases.list_namespaced_lease(
        namespace,
        label_selector=_selector(),
        resource_version=version,
        timeout_seconds=WATCH_TIMEOUT_S,
        watch=True,
        _preload_content=False,
    )
    try:
        if not 200 <= response.status <= 299:
            body = await response.read()
            raise ApiException(status=response.status, reason=body.decode(errors="replace"))
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                return
            renewal = _renewal(obj)
            if renewal is None:
                continue
            if kind == "DELETED":
                sink.lease_deleted(renewal[0])
            else:
                sink.lease_renewed(*renewal)
    finally:
        response.release()


def stale_conditions(
    conditions: list[Condition], stale: bool, message: str
) -> list[Condition] | None:
    """The MigNode's conditions with `Stale` set as told, or None when they already say so.
    An absent `Stale` condition means fresh: the agent's own status writes drop it."""
    old = next((c for c in conditions if c.type == STALE), None)
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
