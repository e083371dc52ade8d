"""The single writer of every node's ResourceSlices.

`SlicePublisher` keeps the newest MigNode of each node and the devices the destroy protocol
withdrew (docs/destroy-protocol.md: they leave the slice before they leave `MigNode.spec`),
asks `migpart.slices.content.node_slices` (or, in offer mode, the `slices` function it is
given) what the node's pool must hold, and makes the cluster hold that. A pool is one slice
in reactive mode and several in offer mode; when any slice's digest differs from what the
cluster holds, or a slice is missing or left over, every slice of the pool is written at one
new generation (the pool's highest + 1, `spec.pool.resourceSliceCount` = their number), and
the slices no longer needed are deleted after that: a consumer sees either the old pool, or
the new one once all of its slices are there (an incomplete pool is not allocated from).
What the slices hold now comes from the operator's slice watch
(`migpart.kube.slice_watch.SliceView`) and from the responses to its own writes; a pool
created again continues its generations from the view's floor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.models import MigNode
from migpart.errors import StaleSnapshot
from migpart.kube.slice_watch import SliceState, SliceView
from migpart.slices.content import (
    SLICE_PLURAL,
    DeviceCache,
    SliceContent,
    node_slices,
    wanted_devices,
)
from migpart.slices.dra import RESOURCE_GROUP, RESOURCE_VERSION

log = structlog.get_logger(__name__)

# Called right before a slice write is sent; raises to stop it (None: no check).
Fence = Callable[[], None] | None
# What a node's pool must hold, from its MigNode, its withdrawn devices, whether it is
# available, and a device cache (`slices.content.node_slices` has this signature).
SlicesFn = Callable[[MigNode, frozenset[str], bool, DeviceCache], list[SliceContent]]


class _Changed(Exception):
    """A slice changed underneath a write (409 Conflict, or 404 on a replace): the view was
    read again, and the write starts over."""


def _generation(node: MigNode) -> int:
    return int(node.metadata.get("generation") or 0)


def _older(seen: MigNode, known: MigNode) -> bool:
    """Whether body `seen` is older than `known`, a body of the same MigNode.

    Resource versions are etcd revisions: compared as numbers where both are, they order
    every write, status writes included. A spec patch's response and the watch event of the
    agent's status write that followed it carry the same `generation`; only the revision
    tells that the response is the older one. Where a revision is missing or not a number,
    the generation decides (ties keep the body seen last)."""
    try:
        return int(seen.metadata["resourceVersion"]) < int(known.metadata["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return _generation(seen) < _generation(known)


@dataclass(frozen=True, slots=True)
class Published:
    """The outcome of one publish: the pool generation and whether it was written now."""

    node: str
    generation: int
    written: bool
    devices: frozenset[str]
    resource_version: str | None


@dataclass(frozen=True, slots=True)
class _Computed:
    """A node's slices as last computed, and what from: the MigNode body (compared by
    identity: a new event is a new body), the withdrawn devices and the availability."""

    node: MigNode
    withdrawn: frozenset[str]
    available: bool
    slices: list[SliceContent]

    def still(self, node: MigNode, withdrawn: frozenset[str], available: bool) -> bool:
        """Whether these slices hold for these inputs (then nothing needs computing)."""
        return self.node is node and self.available == available and self.withdrawn == withdrawn


@dataclass
class SlicePublisher:
    """Writes each node's slice; holds the devices withdrawn by the destroy protocol.

    Per node, publishing is serialised by a lock: the MigNode watch and the planner both
    publish, and two writers must not both bump the pool generation from the same value.
    The withdrawn sets live in memory only: after a restart, devices that the spec already
    dropped stay unpublished by `node_slices`, and a half-finished withdrawal is simply
    planned again.
    """

    api: ApiClient
    on_publish: list[Any] = field(default_factory=list)
    # node -> why it gets no devices now (None: publish them): its agent's Lease expired, or
    # kubelet has not registered the plugin
    gate: Callable[[str], str | None] | None = None
    # what our slices hold, kept by `kube.slice_watch.SliceWatch` and by our writes
    view: SliceView = field(default_factory=SliceView)
    _nodes: dict[str, MigNode] = field(default_factory=dict)
    _withdrawn: dict[str, set[str]] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # node -> its slices as last computed: the resync publishes every node every 30 s, and at
    # 1,000 nodes computing and hashing each one's devices again cost more than the whole
    # idle operator otherwise does
    _computed: dict[str, _Computed] = field(default_factory=dict)
    _devices: DeviceCache = field(default_factory=DeviceCache)
    # GETs done because the view was stale or missing (a metric and a test hook)
    reads: int = 0
    # what each node's pool holds (None: reactive mode's `node_slices`); offer mode passes
    # `migpart.offer.nodes.OfferingNodes.slices`, and calls `invalidate` when an input of it
    # that the publisher does not see (the node's policy, a device held outside its order)
    # changed
    slices: SlicesFn | None = None

    def observe(self, node: MigNode) -> None:
        """Remember the newest MigNode body; `publish` reads it.

        Bodies come from the watch and from the operator's own spec patches, and the two race:
        a watch event older than a patch already seen would bring back a spec that no longer
        holds, and a patch response older than a watch event already seen would hide the
        instances the agent reported since (no later event would show them again). The older
        body is ignored either way.
        """
        name = str(node.metadata.get("name", ""))
        if not name:
            return
        known = self._nodes.get(name)
        if known is not None and _older(node, known):
            return
        self._nodes[name] = node
        self.settle(node)

    def nodes(self) -> list[str]:
        """The nodes whose MigNode has been seen (and not deleted since)."""
        return sorted(self._nodes)

    def node(self, name: str) -> MigNode | None:
        """The newest MigNode seen for `name`."""
        return self._nodes.get(name)

    def invalidate(self, name: str) -> None:
        """Compute the node's slices again at its next publish."""
        self._computed.pop(name, None)

    def forget(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._computed.pop(name, None)
        self._withdrawn.pop(name, None)
        self.view.forget(name)

    def withdrawing(self) -> list[str]:
        """The nodes that have devices withdrawn."""
        return sorted(n for n, devices in self._withdrawn.items() if devices)

    def withdrawn(self, name: str) -> frozenset[str]:
        return frozenset(self._withdrawn.get(name, set()))

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def withdraw(self, name: str, devices: Iterable[str], fence: Fence = None) -> Published:
        """Destroy protocol step 1: republish the slice without `devices`."""
        self._withdrawn.setdefault(name, set()).update(devices)
        return await self.publish(name, fence)

    async def restore(self, name: str, devices: Iterable[str], fence: Fence = None) -> Published:
        """Undo a withdrawal (devices found allocated, or the plan kept them)."""
        self._withdrawn.setdefault(name, set()).difference_update(devices)
        return await self.publish(name, fence)

    def settle(self, node: MigNode) -> None:
        """Drop withdrawals that are complete: the instance left the status, or the spec no
        longer lists it (from then on `node_slices` leaves it out by itself)."""
        name = str(node.metadata.get("name", ""))
        pending = self._withdrawn.get(name)
        if not pending:
            return
        # A withdrawn device that the spec still lists is mid-protocol: keep it withdrawn.
        pending.intersection_update(wanted_devices(node))

    async def publish(self, name: str, fence: Fence = None) -> Published:
        """Write the slices of node `name` if their content changed (generation + 1). `fence`
        is called right before each request that writes, and raises to stop it (the
        operator's leadership: controller/core/effects.py)."""
        async with self._lock(name):
            node = self._nodes.get(name)
            if node is None:
                raise StaleSnapshot(f"no MigNode {name!r} seen yet")
            available = not self.gate(name) if self.gate is not None else True
            result = await self._write(name, self._content(name, node, available), fence)
        if result.written:
            log.info(
                "resource_slice_published",
                node=name,
                generation=result.generation,
                devices=len(result.devices),
            )
            for hook in self.on_publish:
                hook(result)
        return result

    def _content(self, name: str, node: MigNode, available: bool) -> list[SliceContent]:
        """The node's slices now, computed again only when an input changed."""
        withdrawn = frozenset(self._withdrawn.get(name, ()))
        known = self._computed.get(name)
        if known is not None and known.still(node, withdrawn, available):
            return known.slices
        if self.slices is not None:
            slices = self.slices(node, withdrawn, available, self._devices)
        else:
            slices = node_slices(node, withdrawn, available, self._devices)
        self._computed[name] = _Computed(node, withdrawn, available, slices)
        return slices

    async def _write(self, name: str, contents: list[SliceContent], fence: Fence) -> Published:
        """Make the node's pool hold `contents` (its slices, the first first); where the pool
        has no slice, create them only if `contents[0].create` (else leave it absent)."""
        names = frozenset().union(*(c.names for c in contents))
        first = contents[0]
        for _ in range(5):
            current = self.view.slices(name)
            if not current and not first.create:
                return Published(name, self.view.floor(name), False, frozenset(), None)
            if _holds(current, contents):  # the resync's usual case
                state = current[first.name]
                return Published(name, state.generation, False, names, state.resource_version)
            generation = self.view.generation(name) + 1
            try:
                for content in contents:
                    known = current.get(content.name)
                    if known is None and not content.create:
                        continue
                    if fence is not None:
                        fence()  # nothing awaited from here to the request
                    await self._put(name, content, generation, known)
                for extra in sorted(set(current) - {c.name for c in contents}):
                    if fence is not None:
                        fence()
                    await self._delete(name, extra)
            except _Changed:
                continue
            stored = self.view.get(name, first.name)
            version = stored.resource_version if stored is not None else None
            return Published(name, generation, True, names, version)
        raise StaleSnapshot(f"the ResourceSlices of node {name!r} kept changing underneath")

    async def _put(
        self,
        name: str,
        content: SliceContent,
        generation: int,
        known: SliceState | None,
    ) -> None:
        """Create the slice (`known` None) or replace it at `generation`; on a conflict, read
        it again and raise `_Changed`."""
        api = CustomObjectsApi(self.api)
        try:
            if known is None:
                body = content.body(generation)
                written = await api.create_cluster_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, body
                )
            else:
                body = content.body(generation, known.resource_version)
                written = await api.replace_cluster_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, content.name, body
                )
        except ApiException as e:
            # 409: there is one the watch has not shown yet, or it changed since we saw it;
            # 404: it was deleted
            if e.status == 409 or (known is not None and e.status == 404):
                await self._read(api, name, content.name)
                raise _Changed from e
            raise
        self._wrote(name, written)

    async def _delete(self, name: str, slice_name: str) -> None:
        """Delete a slice the pool no longer has (gone already: fine)."""
        self.view.removing(name, slice_name)
        try:
            await CustomObjectsApi(self.api).delete_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, slice_name
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def _wrote(self, name: str, body: dict[str, Any]) -> SliceState:
        state = SliceState.of(body)
        self.view.keep(name, state)
        return state

    async def _read(self, api: CustomObjectsApi, name: str, slice_name: str) -> None:
        """Replace our view of one of the node's slices by what the API server holds now."""
        self.reads += 1
        try:
            got: dict[str, Any] = await api.get_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, slice_name
            )
        except ApiException as e:
            if e.status == 404:
                self.view.drop(name, slice_name)
                return
            raise
        self.view.keep(name, SliceState.of(got))


def _holds(current: dict[str, SliceState], contents: list[SliceContent]) -> bool:
    """Whether the pool's slices are `contents` already: the same slices, each with its
    content's digest, all at one generation."""
    if set(current) != {c.name for c in contents}:
        return False
    if len({state.generation for state in current.values()}) != 1:
        return False
    return all(current[c.name].digest == c.digest for c in contents)
