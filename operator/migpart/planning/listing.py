"""The order an offering node's pool lists its placements in: the order they are handed out.

In offer mode a node publishes one stable pool: every placement (a profile at a start on a
GPU) its policy allows, as partitionable devices with counters (`migpart.offer.pool`).
kube-scheduler's structured allocator walks pools, slices and devices in listing order and
takes the first device whose counters are free; it does not score devices. So the order is a
placement policy, fixed by the GPU model and the policy, not by the moment: the pool is not
rewritten when a claim comes or goes. A claim names one profile, so only the order of one
profile's placements matters; the profiles are taken in turn (`_interleaved`), so that
kube-scheduler finds a profile's first free placement near the top of the list.

`planner_order` is migpart's order, chosen with `migpart simulate` against `name_order` and
three other candidates (docs/offer-simulation.md gives the numbers): the GPUs in a fixed
order, the whole-GPU profiles walking them from the last GPU and every other profile from the
first, each GPU's placements by start. Pods smaller than a GPU pack the low GPUs and whole-GPU
pods the high ones, so the two meet only on a full node: a whole GPU freed at the high end is
the next whole-GPU pod's, its instance still there, and a small pod does not cut it while a
low GPU has room. Under first fit in a fixed order a departing pod's successor of the same
profile finds the placement the pod left first, so it lands on the instance left there.
(Starts from the high end, which keeps the `4g`'s only start free longest, measured no
better: the replay set is mostly whole GPUs.)

`name_order` is NVIDIA's DRA driver's (feature gate `DynamicMIG`): devices by name, i.e. GPU
by GPU, starts ascending; what `migpart simulate`'s `first-fit` policy walks.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from migpart.mig import ModelTable
from migpart.planning.model import DeviceRef, PolicyView

# A node's GPUs by index, each with its model's profile table.
NodeGpus = Mapping[int, ModelTable]


def planner_order(gpus: NodeGpus, policy: PolicyView) -> tuple[DeviceRef, ...]:
    """Every placement `policy` allows on the node's GPUs, each once, in migpart's order."""
    return _listed(gpus, policy, whole_from_last=True)


def name_order(gpus: NodeGpus, policy: PolicyView) -> tuple[DeviceRef, ...]:
    """Every placement `policy` allows on the node's GPUs, each once, in NVIDIA's name order
    (GPU by GPU, starts ascending), the profiles taken in turn as `planner_order` takes them."""
    return _listed(gpus, policy, whole_from_last=False)


def _listed(gpus: NodeGpus, policy: PolicyView, *, whole_from_last: bool) -> tuple[DeviceRef, ...]:
    by_profile: list[list[DeviceRef]] = []
    for name in _profiles(gpus, policy):
        whole = whole_from_last and all(_whole(t, name) for t in gpus.values() if t.has(name))
        listed: list[DeviceRef] = []
        for index in sorted(gpus, reverse=whole):
            if gpus[index].has(name):
                starts = sorted(gpus[index].profile(name).placements)
                listed.extend(DeviceRef(index, name, start) for start in starts)
        by_profile.append(listed)
    return _interleaved(by_profile)


def _interleaved(by_profile: list[list[DeviceRef]]) -> tuple[DeviceRef, ...]:
    """Each profile's placements in their order, the profiles taken in turn: the first
    placement of every profile, then the second of every profile, and so on.

    kube-scheduler evaluates the request's CEL selectors on every device it walks past, on
    every node it tries, until one fits. Listed one profile after another, a claim for the
    last profile would walk every placement of the others first (on an H100 node, 192 of
    200 devices); taken in turn, a profile's k-th placement is at most k times the number of
    profiles down the list. A claim names one profile, so the order between profiles decides
    nothing about which placement it gets."""
    out: list[DeviceRef] = []
    for rank in range(max((len(refs) for refs in by_profile), default=0)):
        out.extend(refs[rank] for refs in by_profile if rank < len(refs))
    return tuple(out)


def _profiles(gpus: NodeGpus, policy: PolicyView) -> list[str]:
    """The allowed profiles of the node's models, in table order, each once."""
    seen: dict[str, None] = {}
    for index in sorted(gpus):
        for prof in gpus[index].profiles:
            if policy.permits(prof.name):
                seen.setdefault(prof.name, None)
    return list(seen)


def _whole(table: ModelTable, name: str) -> bool:
    """Whether an instance of `name` takes the whole GPU."""
    return table.profile(name).memory_slices == table.memory_slices
