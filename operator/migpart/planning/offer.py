"""Offer mode's steering: which placements of one node's GPUs to publish, and in which order.

In offer mode (Kubernetes 1.36+, partitionable devices) kube-scheduler allocates a claim at
once from the devices a node's ResourceSlice lists: existing MIG instances and placements not
created yet, all consuming the GPU's counters (memory and compute slices), the first that fits
in the published order. The planner steers by what it lists and in what order; this module is
that choice, pure and per node, so that the operator and `migpart simulate`'s `offer` policy
call the same function. It is a sort, not a search: O(placements) per node, cheap enough to
redo whenever the node changes.

The order, each step before the next:

1. `FREE`: every existing free instance (nothing to create: the pod starts at once), on the
   busiest GPU first, so that emptier GPUs keep draining.
2. `BESIDE_USED`: new placements in free space on GPUs with an instance in use.
3. `EMPTY`: new placements in free space on GPUs with none in use.
4. `DISPLACING`: new placements that need free instances destroyed first, fewest compute
   slices destroyed first; when the caller passes `waiting`, only of those profiles (the
   profiles of requests that wait, as the reactive planner repartitions free instances for a
   request, never for nothing; measured in docs/offer-mode.md, not the simulator's default).
   The device's counters overlap those of the instances it displaces, so the scheduler never
   gives both.

Within steps 2 to 4, GPUs go busiest first (best fit), and on a GPU the placement that loses
the least of its free capacity (`migpart.planning.cost.free_capacity`) first: small profiles
go where they cut the fewest large placements.

How many (`depth`): kube-scheduler evaluates the claim's CEL selectors on every listed device
it walks, on every node it tries, for every pod, and converts every device of the node's
slices each time (docs/offer-mode.md, "What a node's pool lists"); a pool of every placement
(200 devices on 8 H100s) made a burst cost it 8 times the control plane's own CPU. So at most
`depth` new placements of each profile are offered per node (`DEFAULT_DEPTH`: two, for a
request of two devices of one profile, on one GPU or not), except whole-GPU profiles: one per
GPU (a multi-GPU request asks for whole GPUs). Never more of a profile on one GPU than it
could hold (one `1g.10gb+me`, not seven). The best ones stay: the first in the order above;
when claims take them, the next ones are offered. Free instances are never capped (every one
is listed anyway: its counters must count).

Never offered: a profile the policy does not permit (an existing free one is still listed, as
the reactive planner may assign it); a placement that would displace an instance in use or a
spare (`Holdback.spares`: a spare is offered, never destroyed); and on a GPU held whole for a
multi-GPU request (`Holdback.whole`) anything but a whole-GPU device, free or new.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum

from migpart.mig import Instance, ModelTable, Occupancy, Profile
from migpart.planning.cost import free_capacity
from migpart.planning.model import InstanceState, PolicyView, Spare


class Step(IntEnum):
    """The four steps of an offer, in order (module docstring)."""

    FREE = 0
    BESIDE_USED = 1
    EMPTY = 2
    DISPLACING = 3


@dataclass(frozen=True, slots=True)
class OfferGpu:
    """One GPU of the node as the steering sees it: its table and its instances."""

    index: int
    table: ModelTable
    instances: tuple[InstanceState, ...] = ()


@dataclass(frozen=True, slots=True)
class Holdback:
    """What the policy keeps from the offer. `spares`: free instances kept as spares, by GPU
    index (offered, never displaced); `whole`: indices of GPUs held whole for a multi-GPU
    request (only whole-GPU devices offered there)."""

    spares: frozenset[tuple[int, Instance]] = frozenset()
    whole: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Offered:
    """One device of the offer: an existing free instance (`step` FREE) or a placement to
    create, destroying `displaces` (free instances of the same GPU) first."""

    gpu: int
    instance: Instance
    step: Step
    displaces: tuple[Instance, ...] = ()


# New placements offered per profile and node by default (module docstring, "How many").
DEFAULT_DEPTH = 2
# `waiting` for an offer with no displacing placements: the operator's, whose relay creates a
# placement only where nothing is (destroying a free instance is a planning round's).
NO_DISPLACING: frozenset[str] = frozenset()


def offer(
    gpus: Sequence[OfferGpu],
    policy: PolicyView,
    holdback: Holdback | None = None,
    waiting: Container[str] | None = None,
    depth: int | None = None,
) -> tuple[Offered, ...]:
    """The node's offer, in the order the scheduler should take it (module docstring).
    `waiting`: the profiles that displacing placements may have (None: every one). `depth`:
    at most this many new placements per profile, whole-GPU profiles at least one per GPU
    (None: every placement), and never more of a profile on one GPU than it could still hold."""
    held = holdback or Holdback()
    ranked: list[tuple[tuple[int, ...], Offered]] = []
    room: dict[tuple[int, str], int] = {}
    most: dict[str, int] = {}
    for gpu in gpus:
        ranked.extend(_gpu_offer(gpu, policy, held, waiting))
        if depth is not None:
            taken = Occupancy.of(gpu.table, [i.geometry for i in gpu.instances])
            largest = max(p.compute_slices for p in gpu.table.profiles)
            for prof in gpu.table.profiles:
                room[gpu.index, prof.name] = taken.fit(prof)
                whole = prof.compute_slices == largest
                most[prof.name] = max(depth, len(gpus)) if whole else depth
    ranked.sort(key=lambda r: r[0])
    offered = (o for _, o in ranked)
    return tuple(offered) if depth is None else tuple(_capped(offered, most, room))


def _capped(
    offered: Iterable[Offered], most: dict[str, int], room: dict[tuple[int, str], int]
) -> Iterator[Offered]:
    """`offered` with at most `most[profile]` new placements per profile, and on each GPU at
    most the `room` it has for the profile (how many more fit beside its instances:
    `Occupancy.fit`). Displacing placements count towards `most` only; free instances pass."""
    per_profile: dict[str, int] = {}
    per_gpu: dict[tuple[int, str], int] = {}
    for o in offered:
        if o.step == Step.FREE:
            yield o
            continue
        profile = o.instance.profile
        on_gpu = (o.gpu, profile)
        if per_profile.get(profile, 0) >= most.get(profile, 0):
            continue
        if o.step != Step.DISPLACING and per_gpu.get(on_gpu, 0) >= room.get(on_gpu, 0):
            continue
        per_profile[profile] = per_profile.get(profile, 0) + 1
        per_gpu[on_gpu] = per_gpu.get(on_gpu, 0) + 1
        yield o


def node_spares(
    gpus: Sequence[OfferGpu], spares: Iterable[Spare]
) -> frozenset[tuple[int, Instance]]:
    """The free instances of this node kept as `spares` (profile and count for the node): the
    first ones by GPU and placement."""
    kept: set[tuple[int, Instance]] = set()
    for spare in spares:
        free = [
            (gpu.index, i.geometry)
            for gpu in gpus
            for i in sorted(gpu.instances, key=lambda i: i.start)
            if not i.used and i.profile == spare.profile
        ]
        kept.update(free[: max(0, spare.count)])
    return frozenset(kept)


def _gpu_offer(
    gpu: OfferGpu, policy: PolicyView, held: Holdback, waiting: Container[str] | None
) -> list[tuple[tuple[int, ...], Offered]]:
    table = gpu.table
    whole_only = gpu.index in held.whole
    largest = max(p.compute_slices for p in table.profiles)
    used = [i.geometry for i in gpu.instances if i.used]
    free = [i.geometry for i in gpu.instances if not i.used]
    kept = {i for i in free if (gpu.index, i) in held.spares}
    taken = Occupancy.of(table, [*used, *free])
    in_use = Occupancy.of(table, used)
    busy, used_mask = in_use.compute, in_use.mask
    out: list[tuple[tuple[int, ...], Offered]] = []
    for inst in free:
        if whole_only and table.profile(inst.profile).compute_slices < largest:
            continue
        out.append(
            (
                (Step.FREE, -taken.compute, gpu.index, inst.start),
                Offered(gpu.index, inst, Step.FREE),
            )
        )
    beside = Step.BESIDE_USED if used else Step.EMPTY
    before = free_capacity(table, frozenset([*used, *free]))
    for prof in table.profiles:
        if not policy.permits(prof.name) or (whole_only and prof.compute_slices < largest):
            continue
        for start in prof.placements:
            mask = prof.mask(start)
            if not taken.mask & mask:
                if taken.headroom(prof) < 1:
                    continue
                inst = Instance(prof.name, start)
                lost = before - free_capacity(table, frozenset([*used, *free, inst]))
                out.append(
                    (
                        (beside, -taken.compute, gpu.index, lost, start),
                        Offered(gpu.index, inst, beside),
                    )
                )
                continue
            inst = Instance(prof.name, start)
            if inst in free or (waiting is not None and prof.name not in waiting):
                continue  # offered as it is, or not asked for
            displaced = _displaced(table, prof, start, used_mask, used, free, kept)
            if displaced is None:
                continue
            rest = [i for i in free if i not in displaced]
            lost = free_capacity(table, frozenset([*used, *rest])) - free_capacity(
                table, frozenset([*used, *rest, inst])
            )
            gone = sum(table.profile(i.profile).compute_slices for i in displaced)
            out.append(
                (
                    (Step.DISPLACING, gone, -busy, gpu.index, lost, start),
                    Offered(gpu.index, inst, Step.DISPLACING, displaced),
                )
            )
    return out


def _displaced(
    table: ModelTable,
    prof: Profile,
    start: int,
    used_mask: int,
    used: Sequence[Instance],
    free: Sequence[Instance],
    kept: set[Instance],
) -> tuple[Instance, ...] | None:
    """The free instances a placement overlaps, when destroying them makes room for it; None
    when it overlaps an instance in use or a spare, or still does not fit without them."""
    mask = prof.mask(start)
    if used_mask & mask:
        return None
    displaced = tuple(i for i in free if table.profile(i.profile).mask(i.start) & mask)
    if any(i in kept for i in displaced):
        return None
    rest = Occupancy.of(table, [*used, *(i for i in free if i not in displaced)])
    if rest.headroom(prof) < 1:
        return None
    return displaced
