"""The operator's view of its own ResourceSlices, kept by a watch instead of GETs.

A node's pool is one slice in reactive mode and several in offer mode (`slice_name(node, i)`):
the view keeps each slice's state, and one generation floor per pool. What each slice holds now
(its generation, digest and resourceVersion) comes from the operator's ResourceSlice watch
(`SliceWatch`, a `kube.watch.Sink`) and from the responses to its own writes
(`SliceView.keep`), not from a GET before each write: at 1,000 nodes a periodic resync then
costs no request at all when nothing changed. A stale view only costs a retry: a write at an
old resourceVersion gets 409 Conflict, and then (only then) the slice is read.

Two things outlive a deleted slice:

- its tombstone (the DELETED event's state): a write response or GET taken in after that
  event, but older than it, must not bring the slice back to life in the view (the resync
  would then never write it again);
- the pool's generation floor (the highest generation seen): a slice created again continues
  the pool's generations (the deleted one's + 1), never restarting at 1, so that a scheduler
  that still holds the old slice in its cache takes the new one as the newer pool. The writer
  (`migpart.kube.slice_publisher`) creates at the floor + 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from kubernetes_asyncio.client import ApiClient, ResourceV1Api

from migpart.api.models import MigNode
from migpart.kube.watch import follow, label_selector
from migpart.slices.content import (
    DIGEST_ANNOTATION,
    SLICE_LABELS,
    SLICE_PLURAL,
    slice_index,
    slice_name,
)
from migpart.slices.dra import DRIVER

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class SliceState:
    """What one of our slices holds, as the watch or a write response last showed it."""

    generation: int
    digest: str | None
    resource_version: str
    name: str = ""

    @staticmethod
    def of(body: dict[str, Any] | Any) -> SliceState:
        meta = body.get("metadata") or {}
        return SliceState(
            generation=int(((body.get("spec") or {}).get("pool") or {}).get("generation") or 0),
            digest=(meta.get("annotations") or {}).get(DIGEST_ANNOTATION),
            resource_version=str(meta.get("resourceVersion") or ""),
            name=str(meta.get("name") or ""),
        )

    def newer_than(self, other: SliceState) -> bool:
        """Resource versions are etcd revisions: compare them as numbers where they are."""
        try:
            return int(self.resource_version) > int(other.resource_version)
        except ValueError:
            return self.resource_version != other.resource_version


def slice_node(body: Any) -> str | None:
    """The node of one of our slices (None for a slice that is not ours): any slice of the
    node's pool, named by `slice_name`."""
    spec = body.get("spec") or {}
    node = spec.get("nodeName")
    meta = body.get("metadata") or {}
    if spec.get("driver") != DRIVER or not node:
        return None
    if slice_index(str(meta.get("name") or ""), str(node)) is None:
        return None
    return str(node)


@dataclass
class SliceView:
    """Each node's slices as last seen, with the tombstones of deleted ones and the generation
    floor of each node's pool (see the module docstring). A pool has one slice in reactive
    mode, several in offer mode: states are kept per slice, floors per pool."""

    # node -> slice name -> its state as last seen (watch or write response); absent: none
    _slices: dict[str, dict[str, SliceState]] = field(default_factory=dict)
    # node -> the highest pool generation seen, kept when its slices are deleted
    _floors: dict[str, int] = field(default_factory=dict)
    # node -> slice name -> the deletion it last had (the DELETED event's state)
    _deleted: dict[str, dict[str, SliceState]] = field(default_factory=dict)
    # node -> the slices the publisher deleted itself (their DELETED event asks no rewrite)
    _removing: dict[str, set[str]] = field(default_factory=dict)

    def get(self, node: str, name: str | None = None) -> SliceState | None:
        """Slice `name` of the node's pool (default: its first, `slice_name(node)`)."""
        return self._slices.get(node, {}).get(name or slice_name(node))

    def slices(self, node: str) -> dict[str, SliceState]:
        """Every slice of the node's pool that is known to exist, by name."""
        return dict(self._slices.get(node, {}))

    def floor(self, node: str) -> int:
        """The pool's highest generation known to be gone (0: none)."""
        return self._floors.get(node, 0)

    def generation(self, node: str) -> int:
        """The pool's highest generation seen, of a slice that exists or one that went."""
        return max([self.floor(node), *(s.generation for s in self.slices(node).values())])

    def observe(self, body: Any) -> str | None:
        """Take a watched slice in (kept only if newer than what we know); returns its node
        for our slices, None for others."""
        node = slice_node(body)
        if node is None:
            return None
        seen = SliceState.of(body)
        if seen.name in self._removing.get(node, ()):
            return node  # a late event of a slice we are deleting: it is no part of the pool
        pool = self._slices.setdefault(node, {})
        known = pool.get(seen.name)
        if known is None or seen.newer_than(known):
            pool[seen.name] = seen
        return node

    def deleted(self, body: Any) -> str | None:
        """A watched DELETED event; returns the node whose slice went (None: not ours, we
        deleted it ourselves, or we already wrote a newer one)."""
        node = slice_node(body)
        if node is None:
            return None
        gone = SliceState.of(body)
        known = self._slices.get(node, {}).get(gone.name)
        if known is not None and known.newer_than(gone):
            return None
        self._floors[node] = max(self._floors.get(node, 0), gone.generation)
        self._deleted.setdefault(node, {})[gone.name] = gone
        self.drop(node, gone.name)
        removing = self._removing.get(node, set())
        if gone.name in removing:
            removing.discard(gone.name)
            return None
        return node

    def removing(self, node: str, name: str) -> None:
        """The publisher deletes slice `name` (no longer part of the pool): forget it now,
        and take its DELETED event as expected."""
        self._removing.setdefault(node, set()).add(name)
        self.drop(node, name)

    def relisted(self, bodies: Iterable[Mapping[str, Any]]) -> list[str]:
        """A (re)list of our slices: take each in, and forget the slices we knew that it does
        not hold (deleted while the watch was down: no DELETED event will tell). Returns the
        nodes that lost a slice."""
        listed: set[tuple[str, str]] = set()
        for body in bodies:
            node = self.observe(body)
            if node is not None:
                listed.add((node, str((body.get("metadata") or {}).get("name") or "")))
        gone = {
            (node, name)
            for node, pool in self._slices.items()
            for name in pool
            if (node, name) not in listed
        }
        for node, name in gone:
            self.drop(node, name)
        self._removing.clear()  # their deletions are done or will show in a later relist
        return sorted({node for node, _ in gone})

    def drop(self, node: str, name: str | None = None) -> None:
        """Forget the node's slice `name` (deleted; default: all of them), keeping its
        generation as the pool's floor."""
        pool = self._slices.get(node, {})
        for known in [pool.pop(name, None)] if name is not None else list(pool.values()):
            if known is not None:
                self._floors[node] = max(self._floors.get(node, 0), known.generation)
        if name is None or not pool:
            self._slices.pop(node, None)

    def keep(self, node: str, state: SliceState) -> None:
        """Take in a slice from a write response or a GET, unless the watch already showed
        it deleted after that state (then it stays absent, and the next publish creates it)."""
        tombstones = self._deleted.get(node, {})
        deleted = tombstones.get(state.name)
        if deleted is not None and not state.newer_than(deleted):
            return
        tombstones.pop(state.name, None)
        if not tombstones:
            self._deleted.pop(node, None)
        self._removing.get(node, set()).discard(state.name)  # written again since
        self._slices.setdefault(node, {})[state.name] = state

    def forget(self, node: str) -> None:
        """The node's MigNode went: a new one starts afresh (generation floor and tombstones)."""
        self._floors.pop(node, None)
        self._deleted.pop(node, None)
        self._removing.pop(node, None)


class Publisher(Protocol):
    """What `SliceWatch` needs of the slice publisher."""

    @property
    def view(self) -> SliceView: ...

    def node(self, name: str) -> MigNode | None: ...


class SliceWatch:
    """`kube.watch.Sink` for migpart's slices: the publisher's view of them comes from here,
    not from GETs. A slice deleted under a known node (by hand, or by a kubelet wiping its
    node's slices) is handed to `rewrite`, which writes it again at once through the node's
    one write task (the MigNode watch's: coalesced with the writes its events ask for, under
    the same concurrency bound and error handling); if that write fails, the periodic resync
    writes it. `listed_once` is set at the first list: from then on the publisher knows every
    slice that exists."""

    def __init__(
        self, publisher: Publisher, listed_once: asyncio.Event, rewrite: Callable[[str], None]
    ) -> None:
        self.publisher = publisher
        self.listed_once = listed_once
        self._rewrite = rewrite

    def listed(self, objects: Sequence[Mapping[str, Any]]) -> None:
        for node in self.publisher.view.relisted(objects):
            if self.publisher.node(node) is not None:
                log.info("resource_slice_deleted", node=node, seen="relist")
                self._rewrite(node)
        self.listed_once.set()

    def changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind != "DELETED":
            self.publisher.view.observe(obj)
            return
        node = self.publisher.view.deleted(obj)
        if node is not None and self.publisher.node(node) is not None:
            log.info("resource_slice_deleted", node=node)
            self._rewrite(node)

    def broken(self) -> None:
        """Deletions are not seen meanwhile: the relist that follows finds them."""


async def watch_slices(api: ApiClient, sink: SliceWatch) -> None:
    """Follow migpart's ResourceSlices (`SLICE_LABELS`) into `sink` until cancelled."""
    slices: Any = ResourceV1Api(api)
    await follow(
        slices.list_resource_slice,
        sink,
        SLICE_PLURAL,
        label_selector=label_selector(SLICE_LABELS),
    )
