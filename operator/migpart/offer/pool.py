"""What an offering node's pool lists: placements as partitionable devices (KEP-4815).

An offering node publishes, per GPU, every placement its policy allows, whether an instance
is there or not: kube-scheduler allocates one, and the agent makes its instance when kubelet
prepares the claim (destroying a free instance in the way first). What keeps two overlapping
placements from both being allocated is the pool's shared counters: one counter set per GPU,
holding one counter of capacity 1 per memory slice, one for the compute slices, and one per
profile whose instance limit is below its placement count (the media-extension profiles: at
most one `+me` instance however many places it could go). Each device consumes what its
placement occupies, so the scheduler never allocates devices whose counters add up to more
than the GPU has.

kube-scheduler counts the counters of allocated devices only as the pool lists them: every
device a claim holds is listed, whatever the policy says now (`held`). The devices carry
nothing that changes with an allocation (no instance UUID, no "created" attribute, no binding
condition), so the pool is a function of the node's GPUs, the policy's order, the held
devices outside it and the unusable placements: allocating and releasing a device of the
order rewrites nothing. A placement the agent reports it cannot make (`unusable`:
`MigNode.status.failedInstances`) carries the NoExecute taint `UNUSABLE_TAINT`: it is not
allocated again, and a pod that holds it is evicted so that its controller schedules it
elsewhere (kube-controller-manager's device taint eviction). Where the API server does not
serve device taints (`taints=False`), an unusable placement no claim holds is left out instead.

The API server takes counter sets and devices in separate slices of one pool, and a limited
number of each per slice (`MAX_*`, measured by hack/slice_limits.py): the pool is split across
slices named by `slice_name(node, index)`, counter sets first.

Pure: no client library, no logging, no clock (import-linter keeps it so).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from migpart.api.models import GpuStatus, MigNode
from migpart.mig import Profile
from migpart.mig.profiles import ModelTable, device_name
from migpart.planning.model import DeviceRef
from migpart.slices.content import (
    Device,
    DeviceCache,
    SliceContent,
    canonical,
    described,
    digest,
    interned,
    mignode_owner,
    node_slices,
    slice_device,
)
from migpart.slices.dra import DRIVER

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
# On a placement the agent cannot make: not allocated again, and its pod is evicted.
UNUSABLE_TAINT = {"key": f"{DRIVER}/unusable", "effect": "NoExecute"}
# Attributes of an instance that a placement does not have before it is made: left out, so
# that the device does not change when the instance is made or destroyed.
_INSTANCE_ATTRIBUTES = ("uuid", "created")


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
    gpu: GpuStatus, profile: Profile, start: int, unusable: bool = False
) -> Device:
    """The device of one placement of `profile` on `gpu`: `slice_device` without what only an
    instance has, plus the counters it consumes, tainted `UNUSABLE_TAINT` where the agent
    cannot make it."""
    device = slice_device(gpu.index, profile, start, gpu.model, gpu.uuid)
    for attribute in _INSTANCE_ATTRIBUTES:
        del device["attributes"][attribute]
    device["consumesCounters"] = interned(
        ("consumesCounters", gpu.index, profile, start),
        lambda: [
            {
                "counterSet": counter_set_name(gpu.index),
                "counters": {
                    name: {"value": str(n)}
                    for name, n in sorted(consumed_counters(profile, start).items())
                },
            }
        ],
    )
    if unusable:
        device["taints"] = [dict(UNUSABLE_TAINT)]
    return device


@dataclass(frozen=True, slots=True)
class _Gpu:
    """One MIG-enabled GPU of the node: its status, profile table and placements by name."""

    status: GpuStatus
    table: ModelTable
    # device name -> (profile, start), for every placement of every profile
    placements: dict[str, tuple[Profile, int]]

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
        )


def node_gpus(node: MigNode) -> dict[int, ModelTable]:
    """The node's MIG GPUs that report a profile table, by index: what the order is made of
    (`migpart.planning.listing`)."""
    gpus = node.status.gpus if node.status else []
    return {g.index: g.table() for g in gpus if g.mig_enabled and g.profiles}


def unusable_placements(node: MigNode) -> frozenset[str]:
    """The placements the agent reports it cannot make (`status.failedInstances`)."""
    failures = node.status.failed_instances if node.status else []
    return frozenset(device_name(f.gpu, f.profile, f.start) for f in failures)


def stable_pool(
    node: MigNode,
    order: Sequence[DeviceRef],
    held: Iterable[str] = (),
    available: bool = True,
    cache: DeviceCache | None = None,
    taints: bool = True,
) -> list[SliceContent]:
    """The slices of an offering node's pool.

    `order`: the placements to list, best first (`migpart.planning.listing.planner_order` of
    the node's GPUs under its policy); placements of a GPU the node does not report with MIG
    on, or that its table lacks, are left out. `held`: the device names claims hold on the
    node, listed after the order where the order lacks them. Placements the agent reports it
    cannot make are tainted (`unusable_placements`; without `taints`, left out unless held).
    An unavailable node gets reactive mode's answer: one empty slice, never created. `cache`
    only saves work: the result is the same without it.
    """
    if not available:
        return node_slices(node, available=False)
    devices = cache or DeviceCache()
    gpus = {
        g.index: _Gpu.of(g)
        for g in (node.status.gpus if node.status else [])
        if g.mig_enabled and g.profiles
    }
    unusable = unusable_placements(node)
    entries: dict[str, tuple[Device, str]] = {}

    def add(gpu: _Gpu, name: str) -> None:
        known = gpu.placements.get(name)
        if known is None or name in entries:
            return
        profile, start = known
        status = gpu.status
        failed = name in unusable
        key = ("placement", status.index, status.model, status.uuid, name, failed)
        entries[name] = devices.entry(
            (*key, described(status, profile.name)),
            lambda: placement_device(status, profile, start, failed),
        )

    holding = set(held)
    for ref in order:
        name = device_name(ref.gpu, ref.profile, ref.start)
        if not taints and name in unusable and name not in holding:
            continue
        if (gpu := gpus.get(ref.gpu)) is not None:
            add(gpu, name)
    for name in sorted(holding - entries.keys()):
        for gpu in gpus.values():
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
