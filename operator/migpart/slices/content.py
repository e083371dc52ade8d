"""What a node's ResourceSlices list: one pure function from a MigNode to its slices.

The operator is the single writer of every node's slices (one pool per node, pool name = node
name). As NVIDIA's DRA driver does, the content is computed in one place and handed to one
publisher that reconciles it with the cluster (`migpart.kube.slice_publisher`): `node_slices`
takes the node's MigNode (as data), the devices the destroy protocol withdrew and whether the
node is available, and returns the list of slices the node's pool must hold: one in reactive
mode; offer mode's stable pool (`migpart.offer.pool.stable_pool`) has several, its counter sets
in their own slices, each slice named by `slice_name(node, index)`.

A device is published when the agent reports the instance created (status, so it exists on the
GPU), it is still wanted (present in `spec`, when the operator has written a plan for that
GPU), and the operator has not withdrawn it for destruction. An instance that is prepared or
busy stays published even when the spec dropped it: the agent will not destroy it, and its
claim's allocation refers to it. That rule ("wanted or not Free") is half of the destroy
protocol's safety (docs/destroy-protocol.md).

A node the operator takes as unavailable (its agent's Lease expired, or kubelet has not
registered the plugin) gets no device at all: its slice is written empty where it exists
(removing devices is always safe: allocated claims keep theirs), and not created where it is
gone (kubelet wipes a dead plugin's slices) until the node is back.

Each slice carries a digest of its devices in an annotation: the API server canonicalises
quantities, so a field-by-field comparison with what it stores would see changes that are none.
This module is pure: no client library, no logging, no clock (import-linter keeps it so).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from migpart.api.models import GpuStatus, MigInstanceStatus, MigNode
from migpart.mig import Instance, Profile
from migpart.mig.profiles import device_name
from migpart.slices.dra import DRIVER, RESOURCE_GROUP, RESOURCE_VERSION, DeviceId

SLICE_PLURAL = "resourceslices"
DIGEST_ANNOTATION = "migpart.io/devices-digest"
# on every slice we write; the operator's slice watch selects by it
SLICE_LABELS = {"app.kubernetes.io/managed-by": "migpart"}

Device = dict[str, Any]


def slice_name(node: str, index: int = 0) -> str:
    """The name of slice number `index` of the node's pool: `<node>-<driver>` for the first
    (reactive mode's only one), then `-01`, `-02`... Fixed, so that a restart finds its own
    slices again; two digits because kube-scheduler tries a pool's slices in name order (first
    fit), and `-10` would sort before `-2`."""
    return f"{node}-{DRIVER}" if index == 0 else f"{node}-{DRIVER}-{index:02d}"


def slice_index(name: str, node: str) -> int | None:
    """The inverse of `slice_name`: the index of slice `name` in `node`'s pool (None: a
    name `slice_name` never gives for that node)."""
    suffix = name.removeprefix(slice_name(node))
    if suffix == "" and name:
        return 0
    if not suffix.startswith("-") or not suffix[1:].isdigit():
        return None
    index = int(suffix[1:])
    return index if index > 0 and slice_name(node, index) == name else None


# Equal parts of devices, one object each (`interned`): at 1,000 offering nodes a pool lists
# 200,000 placements that differ across nodes only in `parentUUID`; one dict per capacity,
# attribute value and counter list each made them 1.2 GB of the operator's memory.
_INTERNED: dict[Hashable, Any] = {}
_INTERNED_LIMIT = 100_000


def interned(key: Hashable, build: Callable[[], Any]) -> Any:
    """The one object that devices share for `key` (which must name everything `build` makes
    it from). Shared parts are never changed in place: a device is built fresh around them
    and only read from then on."""
    known = _INTERNED.get(key)
    if known is None:
        if len(_INTERNED) >= _INTERNED_LIMIT:
            _INTERNED.clear()
        known = _INTERNED[key] = build()
    return known


def _value(kind: str, value: str | int | bool) -> dict[str, Any]:
    """An attribute's value, `{kind: value}`, shared."""
    return interned(("attribute", kind, type(value), value), lambda: {kind: value})  # type: ignore[no-any-return]


def _capacity(profile: Profile) -> dict[str, Any]:
    """A device's capacity: what its profile has (engines only where it has some, so that a
    selector on a missing one errors, in the planner as in the scheduler), shared."""

    def build() -> dict[str, Any]:
        engines = {
            "copyEngines": profile.copy_engines,
            "decoders": profile.decoders,
            "encoders": profile.encoders,
            "jpegs": profile.jpegs,
            "ofas": profile.ofas,
        }
        capacity = {
            "memory": {"value": str(profile.memory_mib * 1024 * 1024)},
            "multiprocessors": {"value": str(profile.multiprocessors)},
            "computeSlices": {"value": str(profile.compute_slices)},
            "memorySlices": {"value": str(profile.memory_slices)},
        }
        capacity.update({k: {"value": str(v)} for k, v in engines.items() if v > 0})
        return capacity

    return interned(("capacity", profile), build)  # type: ignore[no-any-return]


def slice_device(
    gpu_index: int,
    profile: Profile,
    start: int,
    product_name: str,
    parent_uuid: str = "",
    uuid: str = "",
    created: bool = True,
) -> Device:
    """The resource.k8s.io/v1 ResourceSlice device entry of one MIG instance (`created`: it
    exists on the GPU; offer mode also publishes placements not created yet, with False).

    The one definition of what a migpart device publishes: `instance_device` builds the
    published devices here, and `migpart.kube.cel.virtual_device` evaluates selectors against
    exactly this, so that what the planner expects to match is what the scheduler sees.
    """
    return {
        "name": device_name(gpu_index, profile.name, start),
        "attributes": {
            "profile": _value("string", profile.name),
            "productName": _value("string", product_name),
            "parentUUID": _value("string", parent_uuid),
            "uuid": {"string": uuid},  # one per instance: nothing to share
            "gpuIndex": _value("int", gpu_index),
            "placementStart": _value("int", start),
            "created": _value("bool", created),
        },
        "capacity": _capacity(profile),
    }


def instance_device(gpu: GpuStatus, inst: MigInstanceStatus) -> Device:
    """The slice device of one created instance (`slice_device`)."""
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


def canonical(device: Device) -> str:
    """A device's (or counter set's) JSON, the same for equal content (a digest's part)."""
    return json.dumps(device, sort_keys=True, separators=(",", ":"))


def digest(texts: Iterable[str]) -> str:
    """The digest of a slice's devices from each one's canonical JSON, in the slice's order:
    equal digests mean no new pool generation."""
    text = "[" + ",".join(texts) + "]"
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
        key = (gpu.index, gpu.model, gpu.uuid, inst.profile, inst.start, inst.uuid)
        return self.entry((*key, described(gpu, inst.profile)), lambda: instance_device(gpu, inst))

    def entry(self, key: tuple[Any, ...], build: Callable[[], Device]) -> tuple[Device, str]:
        """The device `build` makes and its canonical JSON, built once per `key` (which must
        name everything the device is made from)."""
        entry = self._entries.get(key)
        if entry is None:
            device = build()
            entry = (device, canonical(device))
            if len(self._entries) >= self.limit:
                self._entries.clear()
            self._entries[key] = entry
        return entry


def described(gpu: GpuStatus, profile: str) -> tuple[Any, ...] | None:
    """Everything the GPU's table says of `profile`, hashable (a cache key's part)."""
    info = next((p for p in gpu.profiles if p.name == profile), None)
    if info is None:
        return None
    return tuple(tuple(v) if isinstance(v, list) else v for v in info.__dict__.values())


def _instances(node: MigNode) -> Iterator[tuple[GpuStatus, MigInstanceStatus, DeviceId, bool]]:
    """Every instance the node's status reports, with its device and whether the spec still
    wants it (`MigNode.desired`: a GPU the spec wants nothing of keeps what it has)."""
    name = str(node.metadata.get("name", ""))
    desired = node.desired()
    for gpu in node.status.gpus if node.status else []:
        want = desired.get(gpu.index)
        for inst in gpu.instances:
            wanted = want is None or Instance(inst.profile, inst.start) in want
            yield gpu, inst, DeviceId.of(name, gpu.index, inst.profile, inst.start), wanted


def wanted_devices(node: MigNode) -> set[str]:
    """The devices of the node's instances that its spec still wants: a withdrawal of one of
    them is mid-protocol; of any other, complete (`node_slices` leaves it out by itself)."""
    return {device.device for _, _, device, wanted in _instances(node) if wanted}


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


@dataclass(frozen=True, slots=True)
class SliceContent:
    """One slice of a node's pool as it must be, but for what only the cluster knows: the pool
    generation and the stored slice's resourceVersion (`body` takes both)."""

    node: str
    devices: list[Device]
    digest: str
    # the devices' names
    names: frozenset[str]
    owner: dict[str, Any] | None
    # False: written only over a slice that exists (an unavailable node's, emptied), never
    # created
    create: bool
    # how many slices the node's pool has (`spec.pool.resourceSliceCount`)
    pool_slices: int = 1
    # this slice's place in the pool (`slice_name`)
    index: int = 0
    # offer mode: the slice holds these counter sets (`spec.sharedCounters`) and no devices
    counter_sets: list[dict[str, Any]] | None = None

    @property
    def name(self) -> str:
        return slice_name(self.node, self.index)

    def body(self, generation: int, resource_version: str | None = None) -> dict[str, Any]:
        """The complete resource.k8s.io/v1 ResourceSlice at pool `generation`."""
        metadata: dict[str, Any] = {
            "name": self.name,
            "labels": dict(SLICE_LABELS),
            "annotations": {DIGEST_ANNOTATION: self.digest},
        }
        if self.owner is not None:
            metadata["ownerReferences"] = [self.owner]
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        pool = {"name": self.node, "generation": generation, "resourceSliceCount": self.pool_slices}
        spec: dict[str, Any] = {"driver": DRIVER, "nodeName": self.node, "pool": pool}
        # the API server takes one or the other, never both (docs/offer-mode.md)
        if self.counter_sets is not None:
            spec["sharedCounters"] = self.counter_sets
        else:
            spec["devices"] = self.devices
        return {
            "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": spec,
        }


def node_slices(
    node: MigNode,
    withdrawn: Iterable[str] = (),
    available: bool = True,
    cache: DeviceCache | None = None,
) -> list[SliceContent]:
    """The slices of the node's pool: its devices (created AND wanted or not Free AND not
    withdrawn, sorted by name; none while the node is unavailable) in one slice. `cache`
    only saves work: the result is the same without it."""
    entries: list[tuple[Device, str]] = []
    if available:
        gone = set(withdrawn)
        devices = cache or DeviceCache()
        for gpu, inst, device, wanted in _instances(node):
            if not gpu.mig_enabled or device.device in gone:
                continue
            if wanted or inst.state != "Free":
                entries.append(devices.get(gpu, inst))
        entries.sort(key=lambda e: str(e[0]["name"]))
    published = [device for device, _ in entries]
    return [
        SliceContent(
            node=str(node.metadata.get("name", "")),
            devices=published,
            digest=digest(text for _, text in entries),
            names=frozenset(str(d["name"]) for d in published),
            owner=mignode_owner(node),
            create=available,
        )
    ]
