"""A GPU's reachable target layouts, one cheapest per supply: what the node packer chooses from.

A GPU's reachable targets are the valid layouts that contain its used instances
(`migpart.mig.enumerate_layouts`, a few hundred to a few thousand for a 7-slice GPU). What a
target supplies the demands is only its count of non-used instances per profile, so each GPU
reduces to one cheapest layout per supply vector, and an supply that another one covers at no
higher cost is dropped (a few dozen options per GPU). These tables depend only on the GPU's
state and the policy and are cached across calls (a bounded LRU); their projections onto the
profiles one packing asks for live as long as one planning run (`Memo`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import ge

from migpart.mig import Instance, ModelTable, Occupancy, enumerate_layouts
from migpart.planning.cost import cost_of, free_capacity
from migpart.planning.model import PolicyView


@dataclass(frozen=True, slots=True)
class GpuSpace:
    """One GPU as the packer sees it: what must stay, and what may be reused or destroyed."""

    table: ModelTable
    used: frozenset[Instance]
    free: frozenset[Instance]


@dataclass(frozen=True, slots=True)
class Target:
    """One reachable layout of a GPU with what it supplies and costs."""

    instances: frozenset[Instance]
    supply: tuple[tuple[str, int], ...]  # non-used instances per profile
    cost: int  # destroyed, changed, created, 0, lost


@lru_cache(maxsize=128)
def _targets(space: GpuSpace, policy: PolicyView) -> tuple[Target, ...]:
    """The cheapest layout per supply of a GPU, supplies covered by a cheaper one left out."""
    table = space.table
    used = space.used
    free = space.free
    original = used | free
    base = free_capacity(table, used)
    names = table.profile_names
    best: dict[tuple[int, ...], tuple[int, frozenset[Instance]]] = {}
    for layout in _around(table, used):
        created = 0
        counts = [0] * len(names)
        ok = True
        for inst in layout:
            if inst in used:
                continue
            if inst not in free:
                if not policy.permits(inst.profile):
                    ok = False
                    break
                created += 1
            counts[names.index(inst.profile)] += 1
        if not ok:
            continue
        kept = len(layout) - len(used) - created
        destroyed = len(free) - kept
        lost = base - free_capacity(table, layout)
        cost = cost_of(destroyed, layout != original, created, 0, lost)
        key = tuple(counts)
        old = best.get(key)
        if old is None or (cost, sorted(layout)) < (old[0], sorted(old[1])):
            best[key] = (cost, layout)
    ordered = sorted(best.items(), key=lambda kv: (kv[1][0], kv[0]))
    kept_targets: list[tuple[tuple[int, ...], int, frozenset[Instance]]] = []
    for supply, (cost, layout) in ordered:
        # Cheapest first: an earlier target that supplies at least as much dominates this one.
        if any(all(a >= b for a, b in zip(o, supply, strict=True)) for o, _, _ in kept_targets):
            continue
        kept_targets.append((supply, cost, layout))
    return tuple(
        Target(
            layout,
            tuple((names[k], n) for k, n in enumerate(supply) if n),
            cost,
        )
        for supply, cost, layout in kept_targets
    )


def _around(table: ModelTable, used: frozenset[Instance]) -> list[frozenset[Instance]]:
    """Every valid layout that contains `used`, from the model's layouts of an empty GPU.

    The same set as `enumerate_layouts(table, used)`, without caching one more enumeration per
    used set (the empty GPU's is cached once per model).
    """
    if not used:
        return list(enumerate_layouts(table, used))
    taken = Occupancy.of(table, used)
    return [used | extra for extra, occupancy in _empty_layouts(table) if taken.admits(occupancy)]


@lru_cache(maxsize=64)
def _empty_layouts(table: ModelTable) -> tuple[tuple[frozenset[Instance], Occupancy], ...]:
    """Every valid layout of an empty GPU of `table`, with its occupancy."""
    empty: frozenset[Instance] = frozenset()
    return tuple(
        (layout, Occupancy.of(table, layout)) for layout in enumerate_layouts(table, empty)
    )


class Memo:
    """Projections of GPU targets that one planning run reuses (dropped with it, so that a
    long-lived process does not keep them)."""

    def __init__(self) -> None:
        self.by_names: dict[
            tuple[GpuSpace, PolicyView, tuple[str, ...]],
            tuple[tuple[Target, tuple[int, ...]], ...],
        ] = {}
        self.projected: dict[
            tuple[GpuSpace, tuple[str, ...], tuple[int, ...]],
            tuple[tuple[Target, tuple[int, ...]], ...],
        ] = {}


def projected(
    space: GpuSpace,
    policy: PolicyView,
    names: tuple[str, ...],
    caps: tuple[int, ...],
    memo: Memo,
) -> tuple[tuple[Target, tuple[int, ...]], ...]:
    """The GPU's targets by what they supply of `names`, capped at `caps`; dominated ones out."""
    key = (space, names, caps)
    found = memo.projected.get(key)
    if found is None:
        named_key = (space, policy, names)
        named = memo.by_names.get(named_key)
        if named is None:
            named = _cheapest(
                (target, tuple(dict(target.supply).get(p, 0) for p in names))
                for target in _targets(space, policy)
            )
            memo.by_names[named_key] = named
        found = _cheapest((target, tuple(map(min, vec, caps))) for target, vec in named)
        memo.projected[key] = found
    return found


def _cheapest(
    supplies: Iterable[tuple[Target, tuple[int, ...]]],
) -> tuple[tuple[Target, tuple[int, ...]], ...]:
    """The cheapest target per supply, without supplies that a cheaper one covers."""
    best: dict[tuple[int, ...], Target] = {}
    for target, vec in supplies:
        old = best.get(vec)
        if old is None or target.cost < old.cost:
            best[vec] = target
    ordered = sorted(best.items(), key=lambda kv: (kv[1].cost, kv[0]))
    kept: list[tuple[Target, tuple[int, ...]]] = []
    for vec, target in ordered:
        if any(all(map(ge, v, vec)) for _, v in kept):
            continue
        kept.append((target, vec))
    return tuple(kept)


def most_supplied(options: Sequence[tuple[Target, tuple[int, ...]]]) -> tuple[int, ...]:
    """The most of each profile that any of a GPU's (projected) targets supplies."""
    return tuple(map(max, *(vec for _, vec in options))) if len(options) > 1 else options[0][1]
