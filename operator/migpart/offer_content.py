"""What a node's pool lists in offer mode: placements as partitionable devices (KEP-4815).

In offer mode (docs/offer-mode.md) migpart publishes, per GPU, the placements it is willing to
offer before they exist: kube-scheduler allocates one at once and the instance is created
after. What keeps two overlapping placements from both being allocated is the pool's shared
counters: one counter set per GPU, holding one counter of capacity 1 per memory slice, one for
the compute slices, and one per profile whose instance limit is below its placement count (the
media-extension profiles: at most one `+me` instance however many places it could go). Each
device consumes what its placement occupies, so the scheduler never allocates devices whose
counters add up to more than the GPU has.

That holds only if every device that takes counters is published: `offer_slices` lists the
offered placements in the planner's order (the scheduler tries devices in slice order), then
every existing instance of the node, free or used, and every device an allocated claim names,
whether offered now or not. A free instance on its way out (withdrawn by the destroy protocol,
or no longer in the spec) stays listed, with the NoSchedule taint `WITHDRAWN_TAINT`, so that
its counters keep counting until the agent destroys it. A placement not created yet carries
the binding conditions of `migpart.dra.placement_device_fields` (the pod binds once the
instance exists); one whose creation failed is never offered, and while a claim still holds it
it is listed with the NoSchedule taint `FAILED_TAINT`, so that the scheduler, which sends the
pod back when the failure condition is set, does not allocate it again.

The API server takes counter sets and devices in separate slices of one pool, and a limited
number of each per slice (`MAX_*`, measured by hack/slice_limits.py): the pool is split across
slices named by `slice_name(node, index)`, counter sets first.

Each change of a device rewrites every slice of the pool at a new generation (the ResourcePool
rules), and most changes an allocation brings are of no use to the scheduler until a claim
lets go: `scheduler_needs` tells the ones it can act on now from the others (the order of the
offer, a placement becoming the instance a claim already holds), which the publisher may hold
back for a while (`migpart.kube.slice_publisher`).

This module is pure: no client library, no logging, no clock (import-linter keeps it so).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from migpart.api.models import GpuStatus, MigInstanceStatus, MigNode
from migpart.dra import DRIVER, placement_device_fields
from migpart.mig import Instance, Profile
from migpart.mig.profiles import ModelTable, device_name
from migpart.slice_content import (
    Device,
    DeviceCache,
    SliceContent,
    canonical,
    described,
    digest,
    mignode_owner,
    node_slices,
    slice_device,
)

# The API server's limits on one resource.k8s.io/v1 ResourceSlice (Kubernetes 1.36+, measured
# by hack/slice_limits.py; docs/offer-mode.md "API server limits"):
# devices in a slice where any device consumes counters or has a taint (128 otherwise)
MAX_DEVICES_PER_SLICE = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
# counters one device may consume from one counter set
MAX_COUNTERS_PER_CONSUMPTION = 32

# Counter set and counter names must be DNS labels.
MEMORY_COUNTER_PREFIX = "memory-slice-"
COMPUTE_COUNTER = "compute-slices"
INSTANCES_COUNTER_PREFIX = "instances-"
# A device attribute: True for an existing instance, False for a placement not created yet.
CREATED_ATTRIBUTE = "created"
# On a free instance that is leaving: not allocatable, but its counters still count.
WITHDRAWN_TAINT = {"key": f"{DRIVER}/withdrawn", "effect": "NoSchedule"}
# On a placement whose creation failed (refused, NVML error, conflict): not allocatable again.
FAILED_TAINT = {"key": f"{DRIVER}/failed", "effect": "NoSchedule"}


def counter_set_name(gpu_index: int) -> str:
    """The counter set of GPU `gpu_index` of the node (unique in the node's pool)."""
    return f"gpu-{gpu_index}"


def memory_counter(memory_slice: int) -> str:
    return f"{MEMORY_COUNTER_PREFIX}{memory_slice}"


def instances_counter(profile: str) -> str:
    """The counter of a profile's instance limit (`1g.10gb+me` -> `instances-1g10gbme`)."""
    return INSTANCES_COUNTER_PREFIX + profile.replace(".", "").replace("+", "")


def _limited(table: ModelTable) -> list[Profile]:
    """The profiles whose instance limit is below their placement count: memory and compute
    alone would let more of them coexist than NVML creates."""
    return [p for p in table.profiles if p.max_instances < len(p.placements)]


def gpu_counters(table: ModelTable) -> dict[str, int]:
    """The counters of one GPU of `table`'s model and their capacities."""
    counters = {memory_counter(k): 1 for k in range(table.memory_slices)}
    counters[COMPUTE_COUNTER] = table.compute_slices
    counters.update({instances_counter(p.name): p.max_instances for p in _limited(table)})
    return counters


def consumed_counters(profile: Profile, start: int) -> dict[str, int]:
    """What an instance of `profile` at `start` takes of its GPU's counters: the memory slices
    it spans, its compute slices, and one instance of its profile where that is limited."""
    consumed = {memory_counter(start + k): 1 for k in range(profile.memory_slices)}
    if profile.compute_slices:
        consumed[COMPUTE_COUNTER] = profile.compute_slices
    if profile.max_instances < len(profile.placements):
        consumed[instances_counter(profile.name)] = 1
    return consumed


def counter_set(gpu_index: int, table: ModelTable) -> dict[str, Any]:
    """The resource.k8s.io/v1 `sharedCounters` entry of one GPU."""
    counters = gpu_counters(table)
    return {
        "name": counter_set_name(gpu_index),
        "counters": {name: {"value": str(n)} for name, n in sorted(counters.items())},
    }


def placement_device(
    gpu: GpuStatus,
    profile: Profile,
    start: int,
    uuid: str = "",
    created: bool = False,
    withdrawn: bool = False,
    failed: bool = False,
) -> Device:
    """The device of one placement of `profile` on `gpu` (an existing instance when
    `created`, with its `uuid`): `slice_device` plus the counters it consumes, the binding
    conditions where it is not created yet, and the withdrawn taint where it is leaving (the
    failed taint where its creation failed)."""
    device = slice_device(
        gpu.index, profile, start, gpu.model, gpu.uuid, uuid=uuid, created=created
    )
    consumed = consumed_counters(profile, start)
    device["consumesCounters"] = [
        {
            "counterSet": counter_set_name(gpu.index),
            "counters": {name: {"value": str(n)} for name, n in sorted(consumed.items())},
        }
    ]
    if not created:
        device.update(placement_device_fields())
    taints = [dict(WITHDRAWN_TAINT)] if withdrawn else []
    if failed and not created:
        taints.append(dict(FAILED_TAINT))
    if taints:
        device["taints"] = taints
    return device


@dataclass(frozen=True, slots=True)
class _Gpu:
    """One MIG-enabled GPU of the node: its status, profile table and placements by name."""

    status: GpuStatus
    table: ModelTable
    # device name -> (profile, start), for every placement of every profile
    placements: dict[str, tuple[Profile, int]]
    # device name -> instance, for every existing instance
    instances: dict[str, MigInstanceStatus]
    # profile name -> everything the table says of it (`slice_content.described`)
    described: dict[str, tuple[Any, ...] | None]

    @staticmethod
    def of(gpu: GpuStatus) -> _Gpu:
        table = gpu.table()
        return _Gpu(
            gpu,
            table,
            {
                device_name(gpu.index, p.name, start): (p, start)
                for p in table.profiles
                for start in p.placements
            },
            {device_name(gpu.index, i.profile, i.start): i for i in gpu.instances},
            {p.name: described(gpu, p.name) for p in table.profiles},
        )


def _leaving(node: MigNode, withdrawn: Iterable[str]) -> set[str]:
    """The node's instances on their way out: withdrawn, or free and no longer in the spec
    (reactive mode unpublishes those; here they stay, tainted, until the agent destroys
    them)."""
    leaving = set(withdrawn)
    desired = node.desired()
    for gpu in node.status.gpus if node.status else []:
        want = desired.get(gpu.index)
        for inst in gpu.instances:
            dropped = want is not None and Instance(inst.profile, inst.start) not in want
            if dropped and inst.state == "Free":
                leaving.add(device_name(gpu.index, inst.profile, inst.start))
    return leaving


def offer_slices(
    node: MigNode,
    offer: Sequence[tuple[int, Instance]],
    withdrawn: Iterable[str] = (),
    available: bool = True,
    allocated: Iterable[str] = (),
    cache: DeviceCache | None = None,
    failed: Iterable[str] = (),
) -> list[SliceContent]:
    """The slices of the node's pool in offer mode.

    `offer`: the placements to offer, (GPU index, instance), best first (the planner's
    order: `migpart.planning.offer`); placements its GPU's table lacks, or of a GPU without
    MIG, are left out. `withdrawn`: devices the destroy protocol withdrew (published tainted).
    `allocated`: the device names allocated claims hold on this node (published whether
    offered or not). `failed`: placements whose creation failed or was refused: never offered,
    and tainted `FAILED_TAINT` where a claim still holds one. An unavailable node gets reactive
    mode's answer: one empty slice, never created. `cache` only saves work: the result is the
    same without it.
    """
    if not available:
        return node_slices(node, withdrawn, available=False)
    devices = cache or DeviceCache()
    gpus = {g.index: _Gpu.of(g) for g in (node.status.gpus if node.status else []) if g.mig_enabled}
    leaving = _leaving(node, withdrawn)
    refused = set(failed)
    entries: dict[str, tuple[Device, str]] = {}

    def add(gpu: _Gpu, name: str) -> None:
        if name in entries:
            return
        inst = gpu.instances.get(name)
        known = gpu.placements.get(name)
        if inst is not None and known is None:
            # an instance of a profile the table lacks: no counters to consume
            entries[name] = devices.get(gpu.status, inst)
            return
        if known is None:
            return
        profile, start = known
        uuid = inst.uuid if inst is not None else ""
        tainted = inst is not None and name in leaving
        lost = inst is None and name in refused
        key = ("offer", gpu.status.index, gpu.status.model, gpu.status.uuid, name, uuid)
        entries[name] = devices.entry(
            (*key, inst is not None, tainted, lost, gpu.described[profile.name]),
            lambda: placement_device(
                gpu.status,
                profile,
                start,
                uuid,
                created=inst is not None,
                withdrawn=tainted,
                failed=lost,
            ),
        )

    for index, inst in offer:
        name = device_name(index, inst.profile, inst.start)
        if name in refused:
            continue
        if (gpu := gpus.get(index)) is not None:
            add(gpu, name)
    held = set(allocated)
    for gpu in sorted(gpus.values(), key=lambda g: g.status.index):
        for name in sorted(set(gpu.instances) | (held & gpu.placements.keys())):
            add(gpu, name)
    counter_sets = [counter_set(i, gpus[i].table) for i in sorted(gpus)]
    return _pool(node, counter_sets, list(entries.values()))


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for k in range(0, len(items), size):
        yield items[k : k + size]


def _pool(
    node: MigNode, counter_sets: list[dict[str, Any]], entries: list[tuple[Device, str]]
) -> list[SliceContent]:
    """The pool's slices: the counter sets, then the devices in their order, each slice as
    full as the API server allows; at least one slice (empty)."""
    name = str(node.metadata.get("name", ""))
    owner = mignode_owner(node)
    parts: list[tuple[list[dict[str, Any]] | None, list[tuple[Device, str]]]] = [
        (sets, []) for sets in _chunks(counter_sets, MAX_COUNTER_SETS_PER_SLICE)
    ]
    parts += [(None, chunk) for chunk in _chunks(entries, MAX_DEVICES_PER_SLICE)]
    if not parts:
        parts = [(None, [])]
    return [
        SliceContent(
            node=name,
            devices=[device for device, _ in chunk],
            digest=digest(
                ["sharedCounters", *map(canonical, sets)]
                if sets is not None
                else [t for _, t in chunk]
            ),
            names=frozenset(str(device["name"]) for device, _ in chunk),
            owner=owner,
            create=True,
            pool_slices=len(parts),
            index=index,
            counter_sets=sets,
        )
        for index, (sets, chunk) in enumerate(parts)
    ]


# ---------------------------------------------------------------- what the scheduler needs now


def _devices(pool: Sequence[SliceContent]) -> dict[str, Device]:
    return {str(d["name"]): d for content in pool for d in content.devices}


def _counter_sets(pool: Sequence[SliceContent]) -> list[dict[str, Any]]:
    return [s for content in pool for s in content.counter_sets or []]


def _amounts(counters: Mapping[str, Any]) -> dict[str, int]:
    return {name: int(str(value["value"])) for name, value in counters.items()}


def _consumes(device: Device) -> list[tuple[str, dict[str, int]]]:
    return [
        (str(c["counterSet"]), _amounts(c.get("counters") or {}))
        for c in device.get("consumesCounters") or []
    ]


def _left(
    counter_sets: list[dict[str, Any]], allocated: Iterable[Device]
) -> dict[str, dict[str, int]]:
    """What each counter set has left once the `allocated` devices took theirs (what
    kube-scheduler's `checkAvailableCounters` counts for the devices listed and allocated)."""
    left = {str(s["name"]): _amounts(s.get("counters") or {}) for s in counter_sets}
    for device in allocated:
        for name, amounts in _consumes(device):
            have = left.setdefault(name, {})
            for counter, n in amounts.items():
                have[counter] = have.get(counter, 0) - n
    return left


def _fits(device: Device, left: Mapping[str, Mapping[str, int]]) -> bool:
    """Whether the device's counters fit in what is `left`. A counter the pool does not
    declare counts as fitting: the device then counts as one the scheduler may take."""
    for name, amounts in _consumes(device):
        have = left.get(name, {})
        if any(counter in have and n > have[counter] for counter, n in amounts.items()):
            return False
    return True


def _created(device: Device) -> bool:
    return bool(((device.get("attributes") or {}).get(CREATED_ATTRIBUTE) or {}).get("bool"))


def _instance_behind_a_placement(
    pool: Sequence[SliceContent], allocatable: Mapping[str, Device]
) -> bool:
    """Whether the pool lists an instance the scheduler may take after a placement it may
    take: a pod would get a new instance made where one is free (first fit)."""
    placement_seen = False
    for content in pool:
        for device in content.devices:
            if str(device["name"]) not in allocatable or device.get("taints"):
                continue
            if not _created(device):
                placement_seen = True
            elif placement_seen:
                return True
    return False


def scheduler_needs(
    published: Sequence[SliceContent],
    wanted: Sequence[SliceContent],
    allocated: Collection[str],
    unusable: Collection[str] = (),
) -> bool:
    """Whether writing the pool `wanted` over the pool `published` (both `offer_slices`)
    changes anything kube-scheduler can act on while the devices `allocated` (claims hold
    them) stay allocated.

    It can act on: the counter sets; each allocated device's being listed, with its counters
    and taints (its counters must go on counting); every other device that the allocated
    ones' counters leave room for, in full (it may be allocated); and free instances listed
    before placements (first fit takes a free instance before it has one made). It cannot act
    on, until a claim lets go (which changes `allocated`): the other fields of an allocated
    device (a placement that became the instance its claim holds: a device goes to one claim
    at a time), and a device that the allocated ones' counters leave no room for (the
    placements overlapping an allocation). Nor does the order of the devices otherwise change
    what may be allocated, only which device first fit takes (the steering of
    `migpart.planning.offer`): that may wait a while. Counters are compared as they are, so a
    pool this lets stand never lets two placements that NVML cannot hold both be allocated,
    and every device a claim holds stays listed.

    Which placements are offered is steering too, within limits (`_offer_needed`): a
    placement that leaves the offer may stay listed a while (its counters are listed, and the
    relay serves a claim that gets it) while the offer goes on listing its profile, unless it
    is `unusable` (its creation failed or was refused); one that joins it may wait while the
    offer already lists a device of its profile that fits (the offer's `depth` brings the next
    placement in as a claim takes one). An instance that joins or leaves, a profile that
    joins or leaves, or any change to a device listed before and after, is written at once.
    """
    counter_sets = _counter_sets(published)
    if counter_sets != _counter_sets(wanted):
        return True
    before, after = _devices(published), _devices(wanted)
    held = set(allocated)
    for name in held & (before.keys() | after.keys()):
        was, now = before.get(name), after.get(name)
        if was is None or now is None:
            return True
        if (was.get("consumesCounters"), was.get("taints")) != (
            now.get("consumesCounters"),
            now.get("taints"),
        ):
            return True
    left = _left(counter_sets, (before[name] for name in held if name in before))
    free_before = {n: d for n, d in before.items() if n not in held and _fits(d, left)}
    free_after = {n: d for n, d in after.items() if n not in held and _fits(d, left)}
    return _offer_needed(free_before, free_after, unusable) or _instance_behind_a_placement(
        published, free_before
    )


def _profile(device: Device) -> str:
    return str(((device.get("attributes") or {}).get("profile") or {}).get("string", ""))


def _offer_needed(
    before: Mapping[str, Device], after: Mapping[str, Device], unusable: Collection[str]
) -> bool:
    """Whether the allocatable devices going from `before` to `after` is a change the
    scheduler must see now (`scheduler_needs`)."""
    if any(before[name] != after[name] for name in before.keys() & after.keys()):
        return True

    def profiles(devices: Mapping[str, Device]) -> set[str]:
        return {_profile(d) for d in devices.values() if not d.get("taints")}

    def steering(name: str, device: Device, offered: set[str]) -> bool:
        """Whether `device` joining or leaving the offer is steering only: a placement (no
        instance, no taint, not unusable) of a profile the other side offers too."""
        return (
            not _created(device)
            and not device.get("taints")
            and name not in unusable
            and _profile(device) in offered
        )

    still, had = profiles(after), profiles(before)
    gone = all(steering(n, before[n], still) for n in before.keys() - after.keys())
    joined = all(steering(n, after[n], had) for n in after.keys() - before.keys())
    return not (gone and joined)
