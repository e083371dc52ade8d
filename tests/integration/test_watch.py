"""The operator's own watches (kube.watch.follow) against the real API server: the waiting
pods (field selector `spec.nodeName=`: a bound pod leaves), claims, and a pod whose watch
event is one line over aiohttp's 64 KiB line limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from migpart.api.models import GROUP
from migpart.controller.watching.indexes import WATCHED, watch_index
from migpart.kube.watch import Index
from migpart.testbed import Testbed
from tests.integration.conftest import apply, claim_body, pending_pod

pytestmark = pytest.mark.integration

NS = "watch-test"


async def until(changed: asyncio.Event, check: Callable[[], bool]) -> None:
    """Wait until `check` holds, re-checking after each change the indexes see (`changed`;
    the per-test timeout bounds the wait)."""
    while not check():
        changed.clear()
        await changed.wait()


async def test_watched_indexes_follow_claims_and_waiting_pods(
    cluster: Testbed, api: ApiClient
) -> None:
    cluster.kubectl("create", "namespace", NS)
    changed = asyncio.Event()  # set by the indexes on every list and event
    claims = Index(WATCHED["claims_index"].entry, changed.set)
    waiting = Index(WATCHED["waiting_index"].entry, changed.set)
    tasks = [
        asyncio.create_task(watch_index(api, "claims_index", claims)),
        asyncio.create_task(watch_index(api, "waiting_index", waiting)),
    ]
    try:
        await asyncio.gather(claims.synced.wait(), waiting.synced.wait())
        for name in ("c1", "c2"):
            apply(cluster, claim_body(name, NS, "true"))
        pending_pod(cluster, "p1", NS, "c1")
        await until(changed, lambda: f"{NS}/c1" in claims and f"{NS}/c2" in claims)
        await until(changed, lambda: f"{NS}/c1" in waiting)

        # bound by a scheduler: the pod leaves the field-selected watch, and the index
        core = CoreV1Api(api)
        await core.create_namespaced_binding(
            NS,
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "p1"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "watch-node"},
            },
            _preload_content=False,
        )
        await until(changed, lambda: f"{NS}/c1" not in waiting)

        # a pod over 64 KiB on one watch line
        pending_pod(cluster, "p2", NS, "c2")
        await until(changed, lambda: f"{NS}/c2" in waiting)
        # one event that is over 64 KiB and changes what the index keeps (a toleration)
        big = {
            "metadata": {"annotations": {f"{GROUP}/test-padding": "x" * 70_000}},
            "spec": {"tolerations": [{"key": "big", "operator": "Exists"}]},
        }
        cluster.kubectl("patch", "pod", "-n", NS, "p2", "--type=merge", "-p", json.dumps(big))
        await until(
            changed,
            lambda: any(
                t.get("key") == "big" for v in waiting.get(f"{NS}/c2", []) for t in v["tolerations"]
            ),
        )

        cluster.kubectl("delete", "resourceclaim", "-n", NS, "c1", "--wait=false")
        await until(changed, lambda: f"{NS}/c1" not in claims)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        cluster.kubectl("delete", "namespace", NS, "--wait=false")
