"""Which devices serve which demands: Hall checks, the cheapest assignment, same-GPU hosting.

Once the node packer (`migpart.planning.packing`) has chosen what each GPU supplies, serving the
demands from those supplies is a transportation problem. By Hall's theorem it is feasible exactly
when, for every union X of the demands' profile sets, the devices of profiles in X cover the
demands whose profiles all lie in X (`hall`, `covers`); the cheapest assignment by preference
rank is a min-cost flow on the small bipartite graph demands -> profiles (`assign`). Demands
that need all their devices on one GPU are hosted by one GPU's supply each (`host_options`).

Profiles are indices into the packing's list of profile names; a demand's profile set is a bit
mask over them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import combinations

# With more same-GPU demands than this on one node, a GPU hosts at most two of them.
_SAME_GPU_SUBSETS = 4

# A demand's usable profiles on a node: (profile index, rank in the demand's own list), ...
Pref = tuple[tuple[int, int], ...]


def hall(sets: Sequence[int], needs: Sequence[int]) -> tuple[tuple[tuple[int, ...], int], ...]:
    """(profiles X, devices needed) for every union X of the demand sets whose check is not
    implied by the others, the tightest first."""
    merged: dict[int, int] = {}
    for x, n in zip(sets, needs, strict=True):
        if x and n:
            merged[x] = merged.get(x, 0) + n
    return _hall_merged(tuple(sorted(merged.items())))


@lru_cache(maxsize=1024)
def _hall_merged(demand: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, ...], int], ...]:
    unions = {x for x, _ in demand}
    frontier = set(unions)
    while frontier:
        grown = {a | b for a in frontier for b in unions} - unions
        unions |= grown
        frontier = grown
    need = {u: sum(n for x, n in demand if x & ~u == 0) for u in unions}
    ordered = sorted(unions)
    packed: dict[int, int] = {}
    checks = []
    for u in ordered:
        # Implied when smaller disjoint checks inside u already need as much (e.g. the union
        # of two single-profile demands).
        inside = max(
            (
                need[v] + _disjoint(u & ~v, ordered, need, packed)
                for v in ordered
                if v != u and v & ~u == 0
            ),
            default=0,
        )
        if need[u] > inside:
            checks.append((tuple(i for i in range(u.bit_length()) if u >> i & 1), need[u]))
    checks.sort(key=lambda c: (len(c[0]), c[0]))
    return tuple(checks)


def _disjoint(space: int, ordered: list[int], need: dict[int, int], packed: dict[int, int]) -> int:
    """The most that pairwise disjoint checks inside `space` need together (`packed` holds
    the answers so far)."""
    if space in packed:
        return packed[space]
    most = 0
    for u in ordered:
        if u & ~space == 0:
            most = max(most, need[u] + _disjoint(space & ~u, ordered, need, packed))
    packed[space] = most
    return most


def covers(supply: Sequence[int], checks: Sequence[tuple[tuple[int, ...], int]]) -> bool:
    for indices, need in checks:
        have = 0
        for i in indices:
            have += supply[i]
        if have < need:
            return False
    return True


def assign(
    supply: Sequence[int], demands: Sequence[tuple[Pref, int]]
) -> tuple[int, list[list[int]]] | None:
    """The cheapest assignment of devices to demands (cost: preference rank), or None.

    `demands[d]` is ((profile index, rank), ...) and a count; the result is the total rank and,
    per demand, how many devices of each profile index it gets. Successive shortest paths on the
    small bipartite graph demands -> profiles.
    """
    n_profiles = len(supply)
    take = [[0] * n_profiles for _ in demands]
    left = [c for _, c in demands]
    room = list(supply)
    total = 0
    while True:
        # Bellman-Ford over residual graph: demand d -> profile p (cost rank), profile p -> demand
        # d where take[d][p] > 0 (cost -rank). Sources: demands with left > 0; sinks: profiles
        # with room > 0.
        inf = 1 << 60
        dist_d = [0 if left[d] > 0 else inf for d in range(len(demands))]
        dist_p = [inf] * n_profiles
        via_p = [-1] * n_profiles
        via_d = [-1] * len(demands)
        for _ in range(len(demands) + n_profiles + 1):
            changed = False
            for d, (pref, _) in enumerate(demands):
                if dist_d[d] >= inf:
                    continue
                for p, rank in pref:
                    cand = dist_d[d] + rank
                    if cand < dist_p[p]:
                        dist_p[p] = cand
                        via_p[p] = d
                        changed = True
            for d, (pref, _) in enumerate(demands):
                for p, rank in pref:
                    if take[d][p] > 0 and dist_p[p] < inf:
                        cand = dist_p[p] - rank
                        if cand < dist_d[d]:
                            dist_d[d] = cand
                            via_d[d] = p
                            changed = True
            if not changed:
                break
        sink = -1
        for p in range(n_profiles):
            if room[p] > 0 and dist_p[p] < inf and (sink < 0 or dist_p[p] < dist_p[sink]):
                sink = p
        if sink < 0:
            return None if any(left) else (total, take)
        # Walk back and push one unit.
        p = sink
        room[p] -= 1
        total += dist_p[p]
        while True:
            d = via_p[p]
            take[d][p] += 1
            back = via_d[d]
            if back < 0:
                left[d] -= 1
                break
            take[d][back] -= 1
            p = back
        if not any(left):
            return total, take


def host_options(
    supply: tuple[int, ...],
    hosted: int,
    same: Sequence[int],
    prefs: Sequence[Pref],
    counts: Sequence[int],
) -> list[tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]]:
    """Ways one GPU with `supply` can host not yet hosted same-GPU demands (`same` indexes
    `prefs` and `counts`): (demands hosted as a mask over `same`, supply left for the pool,
    devices taken per hosted demand)."""
    out: list[tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]] = [(0, supply, ())]
    if not same:
        return out
    open_ = [j for j in range(len(same)) if not hosted >> j & 1]
    largest = len(open_) if len(same) <= _SAME_GPU_SUBSETS else min(2, len(open_))
    for size in range(1, largest + 1):
        for group in combinations(open_, size):
            wanted = [(prefs[same[j]], counts[same[j]]) for j in group]
            if sum(c for _, c in wanted) > sum(supply):
                continue
            # Every way to take the devices, the cheapest (by rank) per supply left: which one
            # leaves the right devices for the pool depends on the other demands.
            for left, (_, takes) in sorted(_takings(list(supply), wanted).items()):
                out.append((bits(group), left, takes))
    return out


def _takings(
    supply: list[int], wanted: Sequence[tuple[Pref, int]]
) -> dict[tuple[int, ...], tuple[int, tuple[tuple[int, ...], ...]]]:
    """Supply left -> (rank, devices per profile per demand) of the cheapest way to serve
    `wanted` from `supply` that leaves exactly that."""
    search = _Takings(supply, wanted)
    search.demand(0, 0)
    return search.out


class _Takings:
    """Every way to serve `wanted` from `supply`: demand by demand, each one's devices profile
    by profile, most of the first profile first. A class rather than nested functions, which
    would make reference cycles (see `migpart.planning.planner.collector_paused`)."""

    def __init__(self, supply: list[int], wanted: Sequence[tuple[Pref, int]]) -> None:
        self.supply = supply
        self.wanted = wanted
        self.out: dict[tuple[int, ...], tuple[int, tuple[tuple[int, ...], ...]]] = {}
        self.rows: list[tuple[int, ...]] = []

    def demand(self, k: int, rank: int) -> None:
        if k == len(self.wanted):
            left = tuple(self.supply)
            old = self.out.get(left)
            if old is None or rank < old[0]:
                self.out[left] = (rank, tuple(self.rows))
            return
        pref, count = self.wanted[k]
        self.device(k, pref, [0] * len(self.supply), 0, count, rank)

    def device(self, k: int, pref: Pref, row: list[int], j: int, need: int, rank: int) -> None:
        if need == 0:
            self.rows.append(tuple(row))
            self.demand(k + 1, rank)
            self.rows.pop()
            return
        if j == len(pref):
            return
        supply = self.supply
        p, r = pref[j]
        for n in range(min(need, supply[p]), -1, -1):
            supply[p] -= n
            row[p] += n
            self.device(k, pref, row, j + 1, need - n, rank + n * r)
            supply[p] += n
            row[p] -= n


def bits(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask
