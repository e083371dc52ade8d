"""GPU layouts: which MIG instances can coexist on one GPU, and which layouts are reachable.

A layout is valid when (1) every start is an allowed placement of its profile, (2) the memory
ranges `[start, start + memory_slices)` do not overlap, (3) the compute slices add up to at most
the model's compute slices and (4) no profile exceeds its instance limit. These are the rules
NVML enforces when it creates GPU instances at explicit placements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from migpart.mig.occupancy import Occupancy
from migpart.mig.profiles import ModelTable


@dataclass(frozen=True, order=True, slots=True)
class Instance:
    """A MIG GPU instance by geometry: profile name and memory-slice start."""

    profile: str
    start: int


def layout_problems(table: ModelTable, instances: Iterable[Instance]) -> list[str]:
    """Every reason the instances cannot coexist on one GPU of `table`; empty when valid.

    Each message starts with `instances[i]` (the position in the given order).
    """
    problems: list[str] = []
    used_mask = 0
    compute = 0
    counts: Counter[str] = Counter()
    owner: dict[int, int] = {}
    for i, inst in enumerate(instances):
        if not table.has(inst.profile):
            problems.append(
                f"instances[{i}].profile: {inst.profile!r} is not offered by {table.model}"
            )
            continue
        prof = table.profile(inst.profile)
        if inst.start not in prof.placements:
            allowed = ", ".join(map(str, prof.placements))
            problems.append(
                f"instances[{i}].start: {inst.profile} cannot start at {inst.start} "
                f"(allowed: {allowed})"
            )
            continue
        mask = prof.mask(inst.start)
        if used_mask & mask:
            other = next(j for bit, j in owner.items() if bit & mask)
            problems.append(
                f"instances[{i}]: {inst.profile}@{inst.start} overlaps instances[{other}] "
                "in memory slices"
            )
            continue
        used_mask |= mask
        owner[mask] = i
        compute += prof.compute_slices
        counts[inst.profile] += 1
        if counts[inst.profile] > prof.max_instances:
            problems.append(
                f"instances[{i}]: more than {prof.max_instances} instance(s) of {inst.profile}"
            )
    if compute > table.compute_slices:
        problems.append(
            f"instances: {compute} compute slices exceed the {table.compute_slices} of "
            f"{table.model}"
        )
    return problems


def addable_placements(table: ModelTable, instances: Iterable[Instance]) -> list[Instance]:
    """Every single instance that could be added to a valid layout keeping it valid."""
    taken = Occupancy.of(table, instances)
    out: list[Instance] = []
    for prof in table.profiles:
        if taken.headroom(prof) < 1:
            continue
        out.extend(
            Instance(prof.name, start)
            for start in prof.placements
            if not taken.mask & prof.mask(start)
        )
    return out


def enumerate_layouts(
    table: ModelTable, kept: frozenset[Instance]
) -> tuple[frozenset[Instance], ...]:
    """Every valid layout that contains all of `kept` (itself valid), smallest first.

    These are the layouts reachable from any current layout whose non-kept instances may be
    destroyed: used instances stay exactly where they are. Results are cached per table.
    """
    return _enumerate(table, kept)


@lru_cache(maxsize=4096)
def _enumerate(table: ModelTable, kept: frozenset[Instance]) -> tuple[frozenset[Instance], ...]:
    base = Occupancy.of(table, kept)
    candidates = sorted(
        (Instance(p.name, s), p.mask(s), p.compute_slices, p.max_instances)
        for p in table.profiles
        for s in p.placements
    )
    results: list[frozenset[Instance]] = []

    def walk(i: int, chosen: list[Instance], mask: int, compute: int, counts: Counter[str]) -> None:
        results.append(kept.union(chosen))
        for j in range(i, len(candidates)):
            inst, m, c, limit = candidates[j]
            if mask & m or compute + c > table.compute_slices or counts[inst.profile] >= limit:
                continue
            chosen.append(inst)
            counts[inst.profile] += 1
            walk(j + 1, chosen, mask | m, compute + c, counts)
            counts[inst.profile] -= 1
            chosen.pop()

    walk(0, [], base.mask, base.compute, Counter(base.counts))
    results.sort(key=lambda layout: (len(layout), sorted(layout)))
    return tuple(results)
