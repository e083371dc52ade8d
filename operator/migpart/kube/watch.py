"""A plain-JSON list+watch of one resource kind, and the index it keeps.

kopf runs every watch event through its handler machinery, about a millisecond each. That is
fine for migpart's own objects, but pods, ResourceClaims and the agents' Leases are the kinds
with the most objects and events: a burst of 2,000 pods at 1,000 nodes is over 10,000 pod and
claim events, and 1,000 agents renew a Lease every 10 s. The operator follows those kinds
itself, as plain JSON (one parse per event, no models, no copies). So does it for the kinds it
reads in rounds (Nodes, DeviceClasses, policies): kopf's indexes keep, after a relist, the
objects deleted while its watch was down (a deleted policy would go on owning its nodes),
while a list here replaces everything:

- `follow` lists (in pages) and watches from the list's resourceVersion, with bookmarks, and
  watches again from the last version it saw when a watch ends. It lists again only when the
  API server says that version is gone (410) or the watch failed. A failure is logged once
  per outage, and retried with back-off; nothing ends it but cancellation.
- `Index` is what a kopf index is (key -> the values of the objects that gave that key),
  kept by `follow`: each object's entry is recomputed on each of its events, and a new list
  replaces everything (objects deleted while the watch was down drop out).

Server-side selectors keep the volume down where the kind allows it: the operator watches only
pods that no node holds yet (`spec.nodeName=`), so a cluster's running pods cost it nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence, ValuesView
from typing import Any, Protocol

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.types import Body

log = structlog.get_logger(__name__)

ListCall = Callable[..., Awaitable[Any]]

WATCH_TIMEOUT_S = 300
READ_MARGIN_S = 30
PAGE_SIZE = 500
MAX_BACKOFF_S = 30.0


class Sink(Protocol):
    """Where `follow` delivers."""

    def listed(self, objects: Sequence[Body]) -> None:
        """Every object, at each (re)list: what is not in it is gone."""
        ...

    def changed(self, kind: str, obj: Body) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        ...

    def broken(self) -> None:
        """The watch failed: changes are not seen until the next list."""
        ...


class Gone(Exception):
    """The API server no longer has the version asked for (410): list again."""


async def follow(list_call: ListCall, sink: Sink, what: str, **selectors: str) -> None:
    """List and watch with `list_call` (a kubernetes-asyncio list method, e.g.
    `CoreV1Api.list_pod_for_all_namespaces`, with its positional arguments bound) until
    cancelled. `selectors`: `label_selector`, `field_selector`. `what` names it in logs."""
    backoff = 0.5
    failing = False
    while True:
        try:
            objects, listed_at = await _list(list_call, selectors)
            sink.listed(objects)
            if failing:
                log.info("watch_restored", what=what)
            failing, backoff = False, 0.5
            version: str | None = listed_at
            while version is not None:
                version = await _watch(list_call, version, sink, selectors)
            continue  # the watch said its version is gone: list again
        except Gone:
            continue  # list again, at once: nothing failed
        except (TimeoutError, ApiException, aiohttp.ClientError, ValueError) as err:
            if not failing:
                log.warning(
                    "watch_failed",
                    what=what,
                    error=str(err).splitlines()[0] if str(err) else type(err).__name__,
                    retry="with back-off",
                )
        # a dead watch would freeze the operator's view for good: a bug must not end it either
        except Exception:
            log.exception("watch_crashed", what=what)
        sink.broken()
        failing = True
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


async def _call(list_call: ListCall, **kwargs: Any) -> Any:
    response = await list_call(_preload_content=False, **kwargs)
    if response.status == 410:
        response.release()
        raise Gone()
    if not 200 <= response.status <= 299:
        body = await response.read()
        response.release()
        raise ApiException(status=response.status, reason=body.decode(errors="replace")[:500])
    return response


async def _list(list_call: ListCall, selectors: Mapping[str, str]) -> tuple[list[Body], str]:
    """Every object (in pages of PAGE_SIZE) and the list's resourceVersion."""
    objects: list[Body] = []
    token: str | None = None
    while True:
        paging = {"_continue": token} if token else {}
        response = await _call(list_call, limit=PAGE_SIZE, **paging, **selectors)
        try:
            page = json.loads(await response.read())
        finally:
            response.release()
        objects.extend(page.get("items") or [])
        meta = page.get("metadata") or {}
        token = meta.get("continue")
        if not token:
            return objects, str(meta.get("resourceVersion") or "")


async def _watch(
    list_call: ListCall, version: str, sink: Sink, selectors: Mapping[str, str]
) -> str | None:
    """Deliver events from `version` until the watch ends; returns the version to watch from
    next, or None to list again. Lines are split here, not by aiohttp, whose line reader
    refuses lines over 64 KiB (a large pod is one line)."""
    response = await _call(
        list_call,
        watch=True,
        resource_version=version,
        allow_watch_bookmarks=True,
        timeout_seconds=WATCH_TIMEOUT_S,
        # the server ends the watch after WATCH_TIMEOUT_S: a read that waits longer than that
        # is a dead connection (no FIN), which would otherwise freeze the index for good
        _request_timeout=aiohttp.ClientTimeout(sock_read=WATCH_TIMEOUT_S + READ_MARGIN_S),
        **selectors,
    )
    pending = b""
    try:
        async for chunk in response.content.iter_any():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return None  # e.g. 410: this version is gone
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    sink.changed(kind, obj)
    finally:
        response.release()
    return version


def label_selector(labels: Mapping[str, str]) -> str:
    """A label selector matching exactly `labels`."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def all_pods(api: ApiClient) -> ListCall:
    return CoreV1Api(api).list_pod_for_all_namespaces


def all_claims(api: ApiClient) -> ListCall:
    return ResourceV1Api(api).list_resource_claim_for_all_namespaces


def all_nodes(api: ApiClient) -> ListCall:
    return CoreV1Api(api).list_node


def all_device_classes(api: ApiClient) -> ListCall:
    return ResourceV1Api(api).list_device_class


def object_id(obj: Body) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class Index(Mapping[str, ValuesView[Any]]):
    """key -> the values of the objects that gave that key, as a kopf index holds them.

    `entry(body)` says what one object contributes (`{key: value}`, or None for nothing);
    `on_change()` is called after every list and event. `synced` is set once the first list
    is in: until then the index is not the cluster's, and no planning round may read it.
    """

    def __init__(
        self,
        entry: Callable[[Body], Mapping[str, Any] | None],
        on_change: Callable[[], None] = lambda: None,
        *,
        quiet_when_same: bool = False,
    ) -> None:
        self._entry = entry
        self._on_change = on_change
        # an event that leaves the object's entry as it was does not call on_change (for
        # kinds whose entry keeps little of a busy object, e.g. a Node's labels and taints)
        self._quiet_when_same = quiet_when_same
        self._of: dict[str, tuple[str, ...]] = {}  # object -> the keys it gave
        self._by_key: dict[str, dict[str, Any]] = {}  # key -> object -> value
        self.synced = asyncio.Event()

    # ---------------------------------------------------------------- Sink

    def listed(self, objects: Sequence[Body]) -> None:
        seen: set[str] = set()
        for obj in objects:
            seen.add(self._put(obj))
        for gone in set(self._of) - seen:
            self._drop(gone)
        self.synced.set()
        self._on_change()

    def changed(self, kind: str, obj: Body) -> None:
        if kind == "DELETED":
            self._drop(object_id(obj))
        elif self._quiet_when_same:
            before = self._entry_of(object_id(obj))
            if self._entry_of(self._put(obj)) == before:
                return
        else:
            self._put(obj)
        self._on_change()

    def broken(self) -> None:
        """Keep the last known state: what the watch misses, the next list brings."""

    # ---------------------------------------------------------------- upkeep

    def _put(self, obj: Body) -> str:
        oid = object_id(obj)
        self._drop(oid)
        entry = self._entry(obj)
        if entry:
            for key, value in entry.items():
                self._by_key.setdefault(key, {})[oid] = value
            self._of[oid] = tuple(entry)
        return oid

    def _entry_of(self, oid: str) -> dict[str, Any]:
        return {key: self._by_key[key][oid] for key in self._of.get(oid, ())}

    def _drop(self, oid: str) -> None:
        for key in self._of.pop(oid, ()):
            values = self._by_key.get(key)
            if values is not None:
                values.pop(oid, None)
                if not values:
                    del self._by_key[key]

    # ---------------------------------------------------------------- Mapping

    def __getitem__(self, key: str) -> ValuesView[Any]:
        return self._by_key[key].values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)
