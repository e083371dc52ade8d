"""The agent's heartbeat: it renews its node's Lease (`migpart.api.leases`) while it runs.

The operator takes a node whose Lease it has not seen renewed for its lease timeout as
unavailable: it plans nothing there, frees the node's `maxConcurrentNodes` slot and publishes
no devices for it. So the Lease is renewed from its own task, independent of reconcile passes
(which can take long on a slow GPU), and a failed renewal is retried at once with back-off: it
never stops the agent.

Like kubelet's node Lease, it is owned by the Node, so deleting the Node deletes it. Renewals
replace the Lease at the resourceVersion last written (one PUT per period, no GET); a conflict
or a missing Lease costs one GET or one create.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog
from kubernetes_asyncio.client import CoordinationV1Api, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.leases import (
    LEASE_DURATION_S,
    LEASE_LABELS,
    LEASE_NAMESPACE,
    LEASE_RENEW_S,
    lease_name,
)
from migpart.slices.dra import micro_time

if TYPE_CHECKING:
    from collections.abc import Callable

    from kubernetes_asyncio.client import ApiClient

log = structlog.get_logger("migpart.agent.lease")

MAX_BACKOFF_S = 30.0


class NodeLease:
    """Keeps `lease_name(node)` in `namespace` renewed every `renew_s`."""

    def __init__(
        self,
        api: ApiClient,
        node: str,
        *,
        namespace: str = LEASE_NAMESPACE,
        duration_s: int = LEASE_DURATION_S,
        renew_s: float = LEASE_RENEW_S,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.node = node
        self.namespace = namespace
        self.name = lease_name(node)
        self.duration_s = duration_s
        self.renew_s = renew_s
        # Typed as Any: the generated client's methods are untyped.
        self._leases: Any = CoordinationV1Api(api)
        self._core: Any = CoreV1Api(api)
        self._resource_version: str | None = None
        self.renewals = 0
        self.on_failure = on_failure  # counts the failure (agent metrics)

    def _body(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": dict(LEASE_LABELS),
        }
        if self._resource_version is not None:
            metadata["resourceVersion"] = self._resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": self.duration_s,
                "renewTime": micro_time(),
            },
        }

    async def _owner(self) -> list[dict[str, Any]]:
        try:
            node = await self._core.read_node(self.node)
        except ApiException as err:
            if err.status == 404:
                return []
            raise
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node.metadata.uid}]

    async def _written(self, call: Any, *args: Any) -> str:
        """Call a Lease write and return the resourceVersion it wrote, reading the reply as
        plain JSON: at 1,000 nodes (`bench/scale.py` hosts every agent in one process) that is
        100 writes a second, and building a V1Lease per reply costs more than the write."""
        response = await call(*args, _preload_content=False)
        body = await response.read()
        response.release()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=body.decode(errors="replace"))
        return str(json.loads(body)["metadata"]["resourceVersion"])

    async def renew(self) -> None:
        """Write the Lease with renewTime = now: replace, or create when there is none."""
        replace = self._leases.replace_namespaced_lease
        if self._resource_version is not None:
            try:
                self._resource_version = await self._written(
                    replace, self.name, self.namespace, self._body()
                )
                self.renewals += 1
                return
            except ApiException as err:
                if err.status not in (404, 409):
                    raise
                self._resource_version = None  # gone or changed: read it (or create it) below
        try:
            current = await self._leases.read_namespaced_lease(self.name, self.namespace)
            self._resource_version = current.metadata.resource_version
            written = await self._written(replace, self.name, self.namespace, self._body())
        except ApiException as err:
            if err.status != 404:
                raise
            body = self._body()
            body["metadata"]["ownerReferences"] = await self._owner()
            written = await self._written(
                self._leases.create_namespaced_lease, self.namespace, body
            )
            log.info("node_lease_created", node=self.node, lease=f"{self.namespace}/{self.name}")
        self._resource_version = written
        self.renewals += 1

    async def run(self) -> None:
        """Renew until cancelled; failures are logged once per outage and retried with
        back-off (at most every renewal period)."""
        backoff = 0.5
        failing = False
        while True:
            try:
                await self.renew()
                if failing:
                    log.info("node_lease_renewed", node=self.node)
                failing, backoff = False, 0.5
                delay = self.renew_s
            except (TimeoutError, ApiException, aiohttp.ClientError) as err:
                if self.on_failure is not None:
                    self.on_failure()
                if not failing:
                    log.warning(
                        "node_lease_renewal_failed",
                        node=self.node,
                        lease=f"{self.namespace}/{self.name}",
                        error=str(err).splitlines()[0] if str(err) else type(err).__name__,
                        retry="with back-off",
                    )
                failing = True
                delay, backoff = min(backoff, self.renew_s), min(backoff * 2, MAX_BACKOFF_S)
            await asyncio.sleep(delay)
