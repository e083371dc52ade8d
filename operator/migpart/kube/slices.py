"""The node's ResourceSlice: which MIG instances kube-scheduler may allocate.

The operator is the slice's single writer (one pool per node, pool name = node name). The pure
part (`slice_devices`, `devices_digest`, `slice_body`) turns a MigNode into the slice content;
`SlicePublisher` writes it and is where the destroy protocol withdraws devices before they
leave `MigNode.spec` (docs/destroy-protocol.md).

A device is published when the agent reports the instance created (status, so it exists on the
GPU), it is still wanted (present in `spec`, when the operator has written a plan for that
GPU), and the operator has not withdrawn it for destruction. Every change of the published
content writes the slice with `spec.pool.generation + 1`; the content is compared through a
digest kept in an annotation, because the API server canonicalises quantities and a
field-by-field comparison with what it stores would see changes that are none.

A node the operator takes as unavailable (`gate` gives a reason: its agent's Lease expired, or
kubelet has not registered the plugin) gets no device at all: its slice, if there is one, is
written empty (removing devices is always safe: allocated claims keep theirs), and a slice
that is gone (kubelet wipes a dead plugin's slices) is not created again until the node is
back.

A slice created again after it was deleted continues the pool's generations (the deleted
one's + 1), never restarting at 1: a scheduler that still holds the old slice in its cache
then takes the new one as the newer pool.

What the slice holds now (its generation, digest and resourceVersion) comes from the operator's
ResourceSlice watch (`observe_slice`) and from the responses to its own writes, not from a GET
before each write: at 1,000 nodes a periodic resync then costs no request at all when nothing
changed. A stale view only costs a retry: a write at an old resourceVersion gets 409 Conflict,
and then (only then) the slice is read.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi, ResourceV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.models import GpuStatus, MigInstanceStatus, MigNode
from migpart.dra import DRIVER, RESOURCE_GROUP, RESOURCE_VERSION, DeviceId
from migpart.errors import StaleSnapshot
from migpart.kube.watch import follow, label_selector
from migpart.mig import Instance, Profile
from migpart.slice_content import slice_device

log = structlog.get_logger(__name__)

SLICE_PLURAL = "resourceslices"
DIGEST_ANNOTATION = "migpart.io/devices-digest"
# on every slice we write; the operator's slice watch selects by it
SLICE_LABELS = {"app.kubernetes.io/managed-by": "migpart"}

Device = dict[str, Any]
# Called right before a slice write is sent; raises to stop it (None: no check).
Fence = Callable[[], None] | None


def slice_name(node: str) -> str:
    """One slice per node; the name is fixed so that a restart finds its own slice again."""
    return f"{node}-{DRIVER}"


def _instances(node: MigNode) -> Iterable[tuple[GpuStatus, MigInstanceStatus, DeviceId, bool]]:
    """Every instance the node's status reports, with its device and whether the spec still
    wants it (`MigNode.desired`: a GPU the spec wants nothing of keeps what it has)."""
    name = str(node.metadata.get("name", ""))
    desired = node.desired()
    for gpu in node.status.gpus if node.status else []:
        want = desired.get(gpu.index)
        for inst in gpu.instances:
            wanted = want is None or Instance(inst.profile, inst.start) in want
            yield gpu, inst, DeviceId.of(name, gpu.index, inst.profile, inst.start), wanted


def instance_device(gpu: GpuStatus, inst: MigInstanceStatus) -> Device:
    """The slice device of one created instance: `slice_device`, the one definition that
    claim selectors are also evaluated against (`cel.virtual_device`), so that what the
    planner expects to match is what the scheduler sees."""
    info = next((p for p in gpu.profiles if p.name == inst.profile), None)
    if info is None:
        # The agent reported an instance of a profile its table lacks: publish the attributes
        # (the scheduler can still match on the profile name), no capacity.
        unknown = Profile(inst.profile, 0, 0, (), 0, 0, 0)
        return {
            **slice_device(gpu.index, unknown, inst.start, gpu.model, gpu.uuid, inst.uuid),
            "capacity": {},
        }
    return slice_device(gpu.index, info.to_profile(), inst.start, gpu.model, gpu.uuid, inst.uuid)


def slice_devices(node: MigNode, withdrawn: Iterable[str] = ()) -> list[Device]:
    """The devices the node's slice must list, sorted by name.

    Created (in status) AND wanted (in spec, where the operator planned the GPU) AND not
    withdrawn. An instance that is prepared or busy stays published even when the spec dropped
    it: the agent will not destroy it, and its claim's allocation refers to it.
    """
    return [device for device, _ in _slice_entries(node, withdrawn, DeviceCache())]


def _slice_entries(
    node: MigNode, withdrawn: Iterable[str], cache: DeviceCache
) -> list[tuple[Device, str]]:
    """`slice_devices`, each with its canonical JSON (from `cache`)."""
    gone = set(withdrawn)
    entries: list[tuple[Device, str]] = []
    for gpu, inst, device, wanted in _instances(node):
        if not gpu.mig_enabled or device.device in gone:
            continue
        if wanted or inst.state != "Free":
            entries.append(cache.get(gpu, inst))
    return sorted(entries, key=lambda e: str(e[0]["name"]))


def devices_digest(devices: list[Device]) -> str:
    """A digest of the published content: equal digests mean no new pool generation."""
    return _digest([_canonical(d) for d in devices])


def _canonical(device: Device) -> str:
    return json.dumps(device, sort_keys=True, separators=(",", ":"))


def _digest(canonical: Iterable[str]) -> str:
    """`devices_digest` from each device's canonical JSON: the list's is theirs, joined."""
    text = "[" + ",".join(canonical) + "]"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class DeviceCache:
    """Each instance's slice device and its canonical JSON, by everything it is made from.

    A MigNode event brings a whole new status, but between two events of a node most of its
    instances are the ones it had: building their devices and JSON again cost more than the
    rest of the event (1.3 ms for 8 GPUs of 7 instances, against 0.2 ms to parse the status).
    Cleared when it reaches `limit` entries (instances that went stay until then).
    """

    limit: int = 100_000
    _entries: dict[tuple[Any, ...], tuple[Device, str]] = field(default_factory=dict)

    def get(self, gpu: GpuStatus, inst: MigInstanceStatus) -> tuple[Device, str]:
        info = next((p for p in gpu.profiles if p.name == inst.profile), None)
        described = (
            None
            if info is None
            else tuple(tuple(v) if isinstance(v, list) else v for v in info.__dict__.values())
        )
        key = (gpu.index, gpu.model, gpu.uuid, inst.profile, inst.start, inst.uuid, described)
        entry = self._entries.get(key)
        if entry is None:
            device = instance_device(gpu, inst)
            entry = (device, _canonical(device))
            if len(self._entries) >= self.limit:
                self._entries.clear()
            self._entries[key] = entry
        return entry


def device_names(devices: Iterable[Device]) -> set[str]:
    return {str(d["name"]) for d in devices}


def slice_body(
    node: str,
    devices: list[Device],
    generation: int,
    owner: dict[str, Any] | None = None,
    resource_version: str | None = None,
    digest: str | None = None,
) -> dict[str, Any]:
    """A complete resource.k8s.io/v1 ResourceSlice for `node` at pool `generation` (`digest`:
    `devices_digest(devices)`, when the caller has it already)."""
    metadata: dict[str, Any] = {
        "name": slice_name(node),
        "labels": dict(SLICE_LABELS),
        "annotations": {DIGEST_ANNOTATION: digest or devices_digest(devices)},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def mignode_owner(node: MigNode) -> dict[str, Any] | None:
    """An owner reference to the MigNode, so that the slice goes when the MigNode goes."""
    uid = node.metadata.get("uid")
    name = node.metadata.get("name")
    if not uid or not name:
        return None
    return {
        "apiVersion": node.api_version,
        "kind": node.kind,
        "name": name,
        "uid": uid,
        "controller": True,
    }


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
class SliceState:
    """What one of our slices holds, as the watch or a write response last showed it."""

    generation: int
    digest: str | None
    resource_version: str

    @staticmethod
    def of(body: dict[str, Any] | Any) -> SliceState:
        meta = body.get("metadata") or {}
        return SliceState(
            generation=int(((body.get("spec") or {}).get("pool") or {}).get("generation") or 0),
            digest=(meta.get("annotations") or {}).get(DIGEST_ANNOTATION),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def newer_than(self, other: SliceState) -> bool:
        """Resource versions are etcd revisions: compare them as numbers where they are."""
        try:
            return int(self.resource_version) > int(other.resource_version)
        except ValueError:
            return self.resource_version != other.resource_version


def slice_node(body: Any) -> str | None:
    """The node of one of our slices (None for a slice that is not ours)."""
    spec = body.get("spec") or {}
    node = spec.get("nodeName")
    meta = body.get("metadata") or {}
    if spec.get("driver") != DRIVER or not node or meta.get("name") != slice_name(str(node)):
        return None
    return str(node)


@dataclass(frozen=True, slots=True)
class SliceContent:
    """The devices one node's slice must list, with their digest and names, and what they were
    computed from: the MigNode body (compared by identity: a new event is a new body), the
    withdrawn devices and the gate's verdict."""

    node: MigNode
    withdrawn: frozenset[str]
    held: bool
    devices: list[Device]
    digest: str
    names: frozenset[str]

    @staticmethod
    def of(
        node: MigNode, withdrawn: frozenset[str], held: bool, cache: DeviceCache | None = None
    ) -> SliceContent:
        entries = [] if held else _slice_entries(node, withdrawn, cache or DeviceCache())
        devices = [device for device, _ in entries]
        return SliceContent(
            node,
            withdrawn,
            held,
            devices,
            _digest(text for _, text in entries),
            frozenset(device_names(devices)),
        )

    def still(self, node: MigNode, withdrawn: frozenset[str], held: bool) -> bool:
        """Whether this content holds for these inputs (then nothing needs computing)."""
        return self.node is node and self.held == held and self.withdrawn == withdrawn


@dataclass(frozen=True, slots=True)
class Published:
    """The outcome of one publish: the pool generation and whether it was written now."""

    node: str
    generation: int
    written: bool
    devices: frozenset[str]
    resource_version: str | None


@dataclass
class SlicePublisher:
    """Writes each node's slice; holds the devices withdrawn by the destroy protocol.

    Per node, publishing is serialised by a lock: the MigNode watch and the planner both
    publish, and two writers must not both bump the pool generation from the same value.
    The withdrawn sets live in memory only: after a restart, devices that the spec already
    dropped stay unpublished by `slice_devices`, and a half-finished withdrawal is simply
    planned again.
    """

    api: ApiClient
    on_publish: list[Any] = field(default_factory=list)
    # node -> why it gets no devices now (None: publish them); see the module docstring
    gate: Callable[[str], str | None] | None = None
    _nodes: dict[str, MigNode] = field(default_factory=dict)
    _withdrawn: dict[str, set[str]] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    # node -> its slice as last seen (watch or write response); absent: none seen
    _slices: dict[str, SliceState] = field(default_factory=dict)
    # node -> the highest pool generation seen, kept when its slice is deleted
    _floors: dict[str, int] = field(default_factory=dict)
    # node -> the deletion its slice last had (the DELETED event's state): a write response or
    # GET taken in after that event, but older than it, must not bring the slice back to
    # life in our view (the resync would then never write it again)
    _deleted: dict[str, SliceState] = field(default_factory=dict)
    # node -> its slice content as last computed: the resync publishes every node every 30 s,
    # and at 1,000 nodes computing and hashing each one's devices again cost more than the
    # whole idle operator otherwise does
    _contents: dict[str, SliceContent] = field(default_factory=dict)
    _devices: DeviceCache = field(default_factory=DeviceCache)
    # GETs done because the view above was stale or missing (a metric and a test hook)
    reads: int = 0

    def observe_slice(self, body: Any) -> str | None:
        """Take a watched slice in (kept only if newer than what we know); returns its node
        for our slices, None for others."""
        node = slice_node(body)
        if node is None:
            return None
        seen = SliceState.of(body)
        known = self._slices.get(node)
        if known is None or seen.newer_than(known):
            self._slices[node] = seen
        return node

    def slice_deleted(self, body: Any) -> str | None:
        """A watched DELETED event; returns the node whose slice went (None: not ours, or
        we already wrote a newer one)."""
        node = slice_node(body)
        if node is None:
            return None
        gone = SliceState.of(body)
        known = self._slices.get(node)
        if known is not None and known.newer_than(gone):
            return None
        self._floors[node] = max(self._floors.get(node, 0), gone.generation)
        self._deleted[node] = gone
        self._drop(node)
        return node

    def relisted(self, bodies: Iterable[Mapping[str, Any]]) -> list[str]:
        """A (re)list of our slices: take each in, and forget the slices we knew that it does
        not hold (deleted while the watch was down: no DELETED event will tell). Returns the
        nodes whose slice went."""
        listed = {node for body in bodies if (node := self.observe_slice(body)) is not None}
        gone = sorted(set(self._slices) - listed)
        for node in gone:
            self._drop(node)
        return gone

    def _drop(self, node: str) -> None:
        """Forget the node's slice (deleted), keeping its generation as the floor."""
        known = self._slices.pop(node, None)
        if known is not None:
            self._floors[node] = max(self._floors.get(node, 0), known.generation)

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

    def forget(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._contents.pop(name, None)
        self._withdrawn.pop(name, None)
        self._floors.pop(name, None)
        self._deleted.pop(name, None)

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
        longer lists it (from then on `slice_devices` leaves it out by itself)."""
        name = str(node.metadata.get("name", ""))
        pending = self._withdrawn.get(name)
        if not pending:
            return
        # A withdrawn device that the spec still lists is mid-protocol: keep it withdrawn.
        pending.intersection_update(
            device.device for _, _, device, wanted in _instances(node) if wanted
        )

    async def publish(self, name: str, fence: Fence = None) -> Published:
        """Write the slice of node `name` if its content changed (generation + 1). `fence` is
        called right before each request that writes, and raises to stop it (the operator's
        leadership: controller/effects.py)."""
        async with self._lock(name):
            node = self._nodes.get(name)
            if node is None:
                raise StaleSnapshot(f"no MigNode {name!r} seen yet")
            held = bool(self.gate(name)) if self.gate is not None else False
            content = self._content(name, node, held)
            owner = mignode_owner(node)
            result = await self._write(name, content, owner, create=not held, fence=fence)
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

    def _content(self, name: str, node: MigNode, held: bool) -> SliceContent:
        """The slice content for `node` now, computed again only when an input changed."""
        withdrawn = frozenset(self._withdrawn.get(name, ()))
        known = self._contents.get(name)
        if known is not None and known.still(node, withdrawn, held):
            return known
        content = SliceContent.of(node, withdrawn, held, self._devices)
        self._contents[name] = content
        return content

    async def _write(
        self,
        name: str,
        content: SliceContent,
        owner: dict[str, Any] | None,
        *,
        create: bool,
        fence: Fence,
    ) -> Published:
        """Write the content's devices if they differ from the slice's; `create`: also when
        there is no slice (else leave it absent)."""
        if not create and name not in self._slices:
            return Published(name, self._floors.get(name, 0), False, frozenset(), None)
        devices, digest, names = content.devices, content.digest, content.names
        for _ in range(5):
            current = self._slices.get(name)
            if current is not None and current.digest == digest:  # the resync's usual case
                return Published(name, current.generation, False, names, current.resource_version)
            if current is None and not create:
                return Published(name, self._floors.get(name, 0), False, frozenset(), None)
            if fence is not None:
                fence()  # nothing awaited from here to the request
            api = CustomObjectsApi(self.api)
            if current is None:
                generation = self._floors.get(name, 0) + 1
                body = slice_body(name, devices, generation, owner, digest=digest)
                try:
                    created = await api.create_cluster_custom_object(
                        RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, body
                    )
                except ApiException as e:
                    if e.status == 409:  # there is one the watch has not shown yet
                        await self._read(api, name)
                        continue
                    raise
                state = self._wrote(name, created)
                return Published(name, state.generation, True, names, state.resource_version)
            generation = current.generation + 1
            body = slice_body(name, devices, generation, owner, current.resource_version, digest)
            try:
                replaced = await api.replace_cluster_custom_object(
                    RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, slice_name(name), body
                )
            except ApiException as e:
                if e.status in (404, 409):  # deleted, or changed since we last saw it
                    await self._read(api, name)
                    continue
                raise
            state = self._wrote(name, replaced)
            return Published(name, state.generation, True, names, state.resource_version)
        raise StaleSnapshot(f"ResourceSlice {slice_name(name)!r} kept changing underneath")

    def _wrote(self, name: str, body: dict[str, Any]) -> SliceState:
        state = SliceState.of(body)
        self._keep(name, state)
        return state

    def _keep(self, name: str, state: SliceState) -> None:
        """Take in a slice from a write response or a GET, unless the watch already showed
        it deleted after that state (then it stays absent, and the next publish creates it)."""
        deleted = self._deleted.get(name)
        if deleted is not None and not state.newer_than(deleted):
            return
        self._deleted.pop(name, None)
        self._slices[name] = state

    async def _read(self, api: CustomObjectsApi, name: str) -> None:
        """Replace our view of the slice by what the API server holds now."""
        self.reads += 1
        try:
            got: dict[str, Any] = await api.get_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, slice_name(name)
            )
        except ApiException as e:
            if e.status == 404:
                self._drop(name)
                return
            raise
        self._keep(name, SliceState.of(got))


class SliceWatch:
    """`kube.watch.Sink` for migpart's slices: the publisher's view of them comes from here,
    not from GETs. A slice deleted under a known node (by hand, or by a kubelet wiping its
    node's slices) is handed to `rewrite`, which writes it again at once through the node's
    one write task (the MigNode watch's: coalesced with the writes its events ask for, under
    the same concurrency bound and error handling); if that write fails, the periodic resync
    writes it. `listed_once` is set at the first list: from then on the publisher knows every
    slice that exists."""

    def __init__(
        self, publisher: SlicePublisher, listed_once: asyncio.Event, rewrite: Callable[[str], None]
    ) -> None:
        self.publisher = publisher
        self.listed_once = listed_once
        self._rewrite = rewrite

    def listed(self, objects: Sequence[Mapping[str, Any]]) -> None:
        for node in self.publisher.relisted(objects):
            if self.publisher.node(node) is not None:
                log.info("resource_slice_deleted", node=node, seen="relist")
                self._rewrite(node)
        self.listed_once.set()

    def changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind != "DELETED":
            self.publisher.observe_slice(obj)
            return
        node = self.publisher.slice_deleted(obj)
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
        "resourceslices",
        label_selector=label_selector(SLICE_LABELS),
    )
