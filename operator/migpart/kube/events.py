"""The Events the operator posts, one create each.

Every Event of the operator's decisions goes through the Effects port
(`controller.core.effects.KubeEffects.event`), which posts it here: one path, whether the round
runs in a kopf handler's task or not (`kopf.event` works only there; the offer relay runs from
the claim watch, which kopf does not drive). They carry `reportingComponent: migpart`, as the
Events kopf itself posts do (`settings.posting.reporting_component`), so that
`kubectl get events --field-selector reportingComponent=migpart` finds them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from migpart.slices.dra import now_iso

REPORTING_COMPONENT = "migpart"


def event_body(obj: Mapping[str, Any], type: str, reason: str, message: str) -> dict[str, Any]:
    """A core/v1 Event about `obj` (a cluster-scoped one's Event goes to `default`)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "default")
    now = now_iso()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": str(obj.get("apiVersion") or ""),
            "kind": str(obj.get("kind") or ""),
            "name": name,
            "namespace": str(meta.get("namespace") or ""),
            "uid": str(meta.get("uid") or ""),
        },
        "type": type,
        "reason": reason,
        "message": message[:1000],
        "reportingComponent": REPORTING_COMPONENT,
        "source": {"component": REPORTING_COMPONENT},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post_event(
    api: ApiClient, obj: Mapping[str, Any], type: str, reason: str, message: str
) -> None:
    body = event_body(obj, type, reason, message)
    core: Any = CoreV1Api(api)  # the stubs want a CoreV1Event; the client takes a plain body
    await core.create_namespaced_event(body["metadata"]["namespace"], body)
