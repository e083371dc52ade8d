"""The agent's only contact with the API server besides claim lookups: its own MigNode.

`MigNodeStore` is what the agent loop needs (make sure the object exists, follow its spec,
write its status); `KubeMigNodes` implements it with kubernetes_asyncio, and
`migpart.testing.mignodes.InMemoryMigNodes` is the twin for tests of the loop. Status goes
through the status subresource as a JSON merge patch: the agent owns `status` and nothing else.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import structlog
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.models import (
    API_VERSION,
    GROUP,
    MIGNODE_KIND,
    MIGNODE_PLURAL,
    VERSION,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.errors import ResourceNotServed
from migpart.slices.dra import now_iso

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kubernetes_asyncio.client import ApiClient

log = structlog.get_logger("migpart.agent.kube")

MERGE_PATCH = "application/merge-patch+json"
MIGNODE_RESOURCE = f"{MIGNODE_PLURAL}.{GROUP}/{VERSION}"
WATCH_TIMEOUT_S = 300


class MigNodeStore(Protocol):
    # how many MigNodes this store has created: one created again (deleted under the agent)
    # has no status, whatever the agent wrote to the one before
    created: int
    # status.leaderTerm as `ensure` read it: the highest fencing token an earlier run applied
    leader_term: int | None

    async def ensure(self) -> MigNodeSpec | None:
        """Create the node's MigNode if missing; return its current spec. Raises
        `ResourceNotServed` while the MigNode CRD is not served."""
        ...

    def specs(self) -> AsyncIterator[MigNodeSpec | None]:
        """Every spec the MigNode takes from now on (may repeat; level-triggered)."""
        ...

    async def write_status(self, status: MigNodeStatus) -> None: ...

    async def warn(self, reason: str, message: str) -> None:
        """Post a Warning Event about the MigNode."""
        ...


def status_patch(status: MigNodeStatus) -> dict[str, Any]:
    """The merge patch replacing the whole status (null clears a vanished observedPlanId, and
    a kubeletPlugin an earlier run reported: an agent that does not report it must not leave
    an old verdict behind)."""
    body = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    body.setdefault("observedPlanId", None)
    body.setdefault("kubeletPlugin", None)
    return {"status": body}


def spec_of(obj: dict[str, Any]) -> MigNodeSpec | None:
    raw = obj.get("spec")
    return MigNodeSpec.model_validate(raw) if raw is not None else None


def leader_term_of(obj: dict[str, Any]) -> int | None:
    term = (obj.get("status") or {}).get("leaderTerm")
    return int(term) if isinstance(term, int) else None


def warning_event(node: str, uid: str, reason: str, message: str, now: str) -> dict[str, Any]:
    """A core/v1 Warning Event about MigNode `node` (cluster-scoped: in `default`)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": MIGNODE_KIND,
            "name": node,
            "uid": uid,
        },
        "type": "Warning",
        "reason": reason,
        "message": message[:1000],
        "source": {"component": "migpart-agent", "host": node},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class KubeMigNodes:
    """`MigNodeStore` on the API server, for the MigNode named after `node`."""

    def __init__(self, api: ApiClient, node: str, *, retry_s: float = 2.0) -> None:
        self.node = node
        self.retry_s = retry_s
        # Typed as Any: the generated client takes `_content_type` through **kwargs.
        self._objects: Any = CustomObjectsApi(api)
        self._core: Any = CoreV1Api(api)
        self.created = 0
        self.leader_term: int | None = None
        self._uid = ""

    def _seen(self, obj: dict[str, Any]) -> MigNodeSpec | None:
        self._uid = str((obj.get("metadata") or {}).get("uid") or "")
        self.leader_term = leader_term_of(obj)
        return spec_of(obj)

    async def _owner(self) -> list[dict[str, Any]]:
        """An ownerReference to our Node, so that deleting the Node deletes its MigNode."""
        try:
            node = await self._core.read_node(self.node)
        except ApiException as err:
            if err.status == 404:
                log.warning("node_not_found", node=self.node)
                return []
            raise
        return [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node.metadata.uid}]

    async def ensure(self) -> MigNodeSpec | None:
        try:
            obj = await self._objects.get_cluster_custom_object(
                GROUP, VERSION, MIGNODE_PLURAL, self.node
            )
            return self._seen(obj)
        except ApiException as err:
            if err.status != 404:
                raise
        body = {
            "apiVersion": API_VERSION,
            "kind": MIGNODE_KIND,
            "metadata": {"name": self.node, "ownerReferences": await self._owner()},
        }
        try:
            obj = await self._objects.create_cluster_custom_object(
                GROUP, VERSION, MIGNODE_PLURAL, body
            )
            self.created += 1
            log.info("mignode_created", node=self.node)
        except ApiException as err:
            # A create answered 404 means the collection itself is missing: the GET's 404
            # could have been the object's, this one cannot.
            if err.status == 404:
                raise ResourceNotServed(MIGNODE_RESOURCE) from err
            if err.status != 409:  # created by someone else meanwhile: fine
                raise
            obj = await self._objects.get_cluster_custom_object(
                GROUP, VERSION, MIGNODE_PLURAL, self.node
            )
        return self._seen(obj)

    async def specs(self) -> AsyncIterator[MigNodeSpec | None]:
        """Follow the MigNode with a watch, reconnecting (and re-listing) after any break."""
        while True:
            try:
                w = watch.Watch()
                async with w.stream(
                    self._objects.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    MIGNODE_PLURAL,
                    field_selector=f"metadata.name={self.node}",
                    timeout_seconds=WATCH_TIMEOUT_S,
                ) as stream:
                    async for event in stream:
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._uid = str(event["object"]["metadata"].get("uid") or "")
                            yield spec_of(event["object"])
                        elif event["type"] == "DELETED":
                            yield None
                            await self.ensure()  # the agent's MigNode must exist
            # ResourceNotServed: the CRD went with the MigNode; this task must not end
            except (TimeoutError, ApiException, aiohttp.ClientError, ResourceNotServed) as err:
                log.warning("mignode_watch_broken", node=self.node, error=str(err))
                await asyncio.sleep(self.retry_s)

    async def write_status(self, status: MigNodeStatus) -> None:
        try:
            await self._objects.patch_cluster_custom_object_status(
                GROUP,
                VERSION,
                MIGNODE_PLURAL,
                self.node,
                status_patch(status),
                _content_type=MERGE_PATCH,
            )
        except ApiException as err:
            if err.status != 404:
                raise
            # deleted under us: recreate it; `created` tells the loop to write status again
            await self.ensure()

    async def warn(self, reason: str, message: str) -> None:
        body = warning_event(self.node, self._uid, reason, message, now_iso())
        await self._core.create_namespaced_event("default", body)
