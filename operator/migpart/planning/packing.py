"""Exact packing of one node: the cheapest target layouts of its GPUs that serve a set of demands.

The greedy planner adds one cheapest device at a time and can paint itself into a corner (a 1g
placed where a later 3g needed the room, a free instance destroyed that another GPU could have
spared). For problems small enough, the planner asks this module the exact question per node
instead: given the node's GPUs (used instances pinned, free instances reusable or destroyable)
and the demands placed on it, which target layouts serve every demand at the least cost
(destroyed, GPUs changed, created, preference rank, capacity lost), or is it impossible?

Why it is exact and still small:

- A GPU's reachable targets are the valid layouts that contain its used instances
  (`migpart.mig.enumerate_layouts`, a few hundred to a few thousand for a 7-slice GPU). What a
  target offers the demands is only its count of non-used instances per profile, so each GPU
  reduces to one cheapest layout per offer vector, and an offer that another one covers at no
  higher cost is dropped (a few dozen options per GPU). These tables depend only on the GPU's
  state and are cached across calls (a bounded LRU); their projections below live as long as
  one planning run (`Memo`).
- Offers are projected onto the profiles the demands can use and capped at what they could use;
  a dynamic program over the node's GPUs keeps the cheapest combination per capped offer.
- Whether an offer serves the demands is a transportation problem; by Hall's theorem it is
  feasible exactly when, for every union X of the demands' profile sets, the devices of profiles
  in X cover the demands whose profiles all lie in X.
- Demands that need all their devices on one GPU (`same_gpu`) are hosted by one GPU each: the
  dynamic program's state also records which of them are hosted (with more than four on one
  node, a GPU hosts at most two of them, which may miss a packing but never makes a wrong one).

The work is counted in dynamic-programming steps (`Work`), so that callers can bound it without
a clock.

Costs are packed into one int (24-bit fields, most significant first) so that they add and
compare as vectors in lexicographic order, as in `migpart.planning.planner`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from operator import ge

from migpart.mig import Instance, ModelTable, enumerate_layouts
from migpart.planning.model import PolicyView

FIELD = 24
DESTROYED = 4 * FIELD
CHANGED = 3 * FIELD
CREATED = 2 * FIELD
RANK = FIELD
_LOW = (1 << FIELD) - 1
# With more same-GPU demands than this on one node, a GPU hosts at most two of them.
_SAME_GPU_SUBSETS = 4


def pack_cost(destroyed: int, changed: int, created: int, rank: int, lost: int) -> int:
    return (
        (destroyed << DESTROYED)
        | (changed << CHANGED)
        | (created << CREATED)
        | (rank << RANK)
        | lost
    )


def unpack_cost(cost: int) -> tuple[int, int, int, int, int]:
    return (
        cost >> DESTROYED,
        (cost >> CHANGED) & _LOW,
        (cost >> CREATED) & _LOW,
        (cost >> RANK) & _LOW,
        cost & _LOW,
    )


@dataclass(frozen=True, slots=True)
class GpuSpace:
    """One GPU as the packer sees it: what must stay, and what may be reused or destroyed."""

    table: ModelTable
    used: frozenset[Instance]
    free: frozenset[Instance]


@dataclass(frozen=True, slots=True)
class Demand:
    """`count` devices, each of any profile in `profiles` (preference order)."""

    profiles: tuple[str, ...]
    count: int
    same_gpu: bool = False


@dataclass(frozen=True, slots=True)
class NodePacking:
    """The answer for one node: the cost, every GPU's target layout and, per demand (in the
    order given), its devices as (GPU position, instance)."""

    cost: int
    layouts: tuple[frozenset[Instance], ...]
    devices: tuple[tuple[tuple[int, Instance], ...], ...]


@dataclass(frozen=True, slots=True)
class _Target:
    """One reachable layout of a GPU with what it offers and costs."""

    instances: frozenset[Instance]
    offer: tuple[tuple[str, int], ...]  # non-used instances per profile
    cost: int  # destroyed, changed, created, 0, lost


def _occupancy(table: ModelTable, instances: Iterable[Instance]) -> tuple[int, int, dict[str, int]]:
    """What `instances` take of a GPU: memory-slice mask, compute slices, count per profile."""
    mask = 0
    compute = 0
    counts: dict[str, int] = {}
    for inst in instances:
        prof = table.profile(inst.profile)
        mask |= prof.mask(inst.start)
        compute += prof.compute_slices
        counts[inst.profile] = counts.get(inst.profile, 0) + 1
    return mask, compute, counts


@lru_cache(maxsize=8192)
def free_capacity(table: ModelTable, taken: frozenset[Instance]) -> int:
    """How much the space beside `taken` can still host, weighted by compute slices.

    For every profile (media-extension variants aside) the most instances that fit, ignoring the
    other profiles; earliest placement first is optimal for equal-length ranges. Less of it lost
    means the free space stays in larger blocks.
    """
    mask, compute, counts = _occupancy(table, taken)
    total = 0
    room = table.compute_slices - compute
    for prof in table.profiles:
        if "+" in prof.name:
            continue
        limit = min(prof.max_instances - counts.get(prof.name, 0), room // prof.compute_slices)
        fit = 0
        occupied = mask
        for start in prof.placements:
            if fit >= limit:
                break
            m = prof.mask(start)
            if not occupied & m:
                occupied |= m
                fit += 1
        total += fit * prof.compute_slices
    return total


@lru_cache(maxsize=128)
def _targets(
    space: GpuSpace, allowed: frozenset[str] | None, denied: frozenset[str]
) -> tuple[_Target, ...]:
    """The cheapest layout per offer of a GPU, offers covered by a cheaper one left out."""
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
                if not _creatable(inst, allowed, denied):
                    ok = False
                    break
                created += 1
            counts[names.index(inst.profile)] += 1
        if not ok:
            continue
        kept = len(layout) - len(used) - created
        destroyed = len(free) - kept
        lost = base - free_capacity(table, layout)
        cost = pack_cost(destroyed, layout != original, created, 0, lost)
        key = tuple(counts)
        old = best.get(key)
        if old is None or (cost, sorted(layout)) < (old[0], sorted(old[1])):
            best[key] = (cost, layout)
    ordered = sorted(best.items(), key=lambda kv: (kv[1][0], kv[0]))
    kept_targets: list[tuple[tuple[int, ...], int, frozenset[Instance]]] = []
    for offer, (cost, layout) in ordered:
        # Cheapest first: an earlier target that offers at least as much dominates this one.
        if any(all(a >= b for a, b in zip(o, offer, strict=True)) for o, _, _ in kept_targets):
            continue
        kept_targets.append((offer, cost, layout))
    return tuple(
        _Target(
            layout,
            tuple((names[k], n) for k, n in enumerate(offer) if n),
            cost,
        )
        for offer, cost, layout in kept_targets
    )


def _creatable(inst: Instance, allowed: frozenset[str] | None, denied: frozenset[str]) -> bool:
    return inst.profile not in denied and (allowed is None or inst.profile in allowed)


def _around(table: ModelTable, used: frozenset[Instance]) -> list[frozenset[Instance]]:
    """Every valid layout that contains `used`, from the model's layouts of an empty GPU.

    The same set as `enumerate_layouts(table, used)`, without caching one more enumeration per
    used set (the empty GPU's is cached once per model).
    """
    mask, compute, counts = _occupancy(table, used)
    if not used:
        return list(enumerate_layouts(table, used))
    out: list[frozenset[Instance]] = []
    for extra in enumerate_layouts(table, frozenset()):
        fits = True
        extra_compute = 0
        extra_counts: dict[str, int] = {}
        for inst in extra:
            prof = table.profile(inst.profile)
            if mask & prof.mask(inst.start):
                fits = False
                break
            extra_compute += prof.compute_slices
            extra_counts[inst.profile] = extra_counts.get(inst.profile, 0) + 1
        if not fits or compute + extra_compute > table.compute_slices:
            continue
        if any(
            counts.get(p, 0) + n > table.profile(p).max_instances for p, n in extra_counts.items()
        ):
            continue
        out.append(used | extra)
    return out


# --- transportation: Hall checks and the cheapest assignment ------------------------------------


# A demand's usable profiles on a node: (profile index, rank in the demand's own list), ...
_Pref = tuple[tuple[int, int], ...]


def _hall(sets: Sequence[int], needs: Sequence[int]) -> tuple[tuple[tuple[int, ...], int], ...]:
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

    def disjoint(space: int) -> int:
        """The most that pairwise disjoint checks inside `space` need together."""
        if space in packed:
            return packed[space]
        most = 0
        for u in ordered:
            if u & ~space == 0:
                most = max(most, need[u] + disjoint(space & ~u))
        packed[space] = most
        return most

    checks = []
    for u in ordered:
        # Implied when smaller disjoint checks inside u already need as much (e.g. the union
        # of two single-profile demands).
        inside = max(
            (need[v] + disjoint(u & ~v) for v in ordered if v != u and v & ~u == 0), default=0
        )
        if need[u] > inside:
            checks.append((tuple(i for i in range(u.bit_length()) if u >> i & 1), need[u]))
    checks.sort(key=lambda c: (len(c[0]), c[0]))
    return tuple(checks)


def _covers(offer: Sequence[int], checks: Sequence[tuple[tuple[int, ...], int]]) -> bool:
    for indices, need in checks:
        have = 0
        for i in indices:
            have += offer[i]
        if have < need:
            return False
    return True


def _most(options: Sequence[tuple[_Target, tuple[int, ...]]]) -> tuple[int, ...]:
    """The most of each profile that any of a GPU's (projected) targets offers."""
    return tuple(map(max, *(vec for _, vec in options))) if len(options) > 1 else options[0][1]


def _assign(
    offer: Sequence[int], demands: Sequence[tuple[_Pref, int]]
) -> tuple[int, list[list[int]]] | None:
    """The cheapest assignment of devices to demands (cost: preference rank), or None.

    `demands[d]` is ((profile index, rank), ...) and a count; the result is the total rank and,
    per demand, how many devices of each profile index it gets. Successive shortest paths on the
    small bipartite graph demands -> profiles.
    """
    n_profiles = len(offer)
    take = [[0] * n_profiles for _ in demands]
    left = [c for _, c in demands]
    room = list(offer)
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


# --- the node oracle --------------------------------------------------------------------------


class OutOfWork(Exception):
    """A `Work` allowance ran out."""


class Work:
    """An allowance of dynamic-programming steps (states x options), counted, never timed, so
    that bounded planning stays deterministic."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self, steps: int) -> None:
        if steps > self.left:
            self.left = 0
            raise OutOfWork
        self.left -= steps


@dataclass(frozen=True, slots=True)
class _Choice:
    """A back pointer of the dynamic program: GPU `gpu` takes `target` and hosts the same-GPU
    demands in `hosted` with `take[k][p]` devices of profile p each."""

    previous: _Choice | None
    gpu: int
    target: _Target
    hosted: tuple[int, ...]
    take: tuple[tuple[int, ...], ...]


def pack(
    spaces: Sequence[GpuSpace],
    demands: Sequence[Demand],
    policy: PolicyView,
    limit: int | None = None,
    work: Work | None = None,
    memo: Memo | None = None,
) -> NodePacking | None:
    """The cheapest way for the GPUs `spaces` of one node to serve every demand, or None.

    With a `limit`, None also when every way costs more than that (the search only asks what
    could improve on what it has, and a bound prunes most of the work). `work` bounds the
    effort (`OutOfWork` when it runs out); `memo` keeps projections between calls.
    """
    memo = memo or Memo()
    names: list[str] = []
    for demand in demands:
        for name in demand.profiles:
            if name not in names and any(s.table.has(name) for s in spaces):
                names.append(name)
    index = {p: k for k, p in enumerate(names)}
    prefs: list[_Pref] = [
        tuple((index[p], r) for r, p in enumerate(d.profiles) if p in index) for d in demands
    ]
    for demand, pref in zip(demands, prefs, strict=True):
        if demand.count > 0 and not pref:
            return None
    caps = [0] * len(names)
    for demand, pref in zip(demands, prefs, strict=True):
        for p, _ in pref:
            caps[p] += demand.count
    same = [k for k, d in enumerate(demands) if d.same_gpu and d.count > 1]
    pooled = [k for k, d in enumerate(demands) if d.count > 0 and k not in same]
    checks = _hall(
        [_bits(p for p, _ in prefs[k]) for k in pooled], [demands[k].count for k in pooled]
    )
    key_names = tuple(names)
    # No GPU offers more than its targets do: cap the counts at that, and give up at once when
    # even every GPU's most of every profile together falls short.
    most = [0] * len(names)
    for space in spaces:
        for p, n in enumerate(_most(_projected(space, policy, key_names, tuple(caps), memo))):
            most[p] += n
    caps = [min(c, m, _FIELD_CAP) for c, m in zip(caps, most, strict=True)]
    if not _covers(caps, checks):
        return None
    key_caps = tuple(caps)
    options = [_projected(space, policy, key_names, key_caps, memo) for space in spaces]
    # Offers are packed into ints, one 9-bit field per profile, so that adding two of them and
    # capping the sum at `caps` takes a handful of int operations (see `_sat_add`).
    cap_v = _encode(key_caps)
    reach = [0] * (len(spaces) + 1)
    for g in range(len(spaces) - 1, -1, -1):
        reach[g] = _sat_add(reach[g + 1], _encode(_most(options[g])), cap_v, _guard(len(names)))
    shift = _WIDTH * len(names)
    vec_mask = (1 << shift) - 1
    guard = _guard(len(names))
    full_mask = (1 << len(same)) - 1
    states: dict[int, tuple[int, _Choice | None]] = {0: (0, None)}
    hosting_cache: dict[
        tuple[tuple[int, ...], int], list[tuple[int, int, tuple[tuple[int, ...], ...]]]
    ] = {}
    for g in range(len(spaces)):
        if work is not None:
            work.spend(len(states) * len(options[g]))
        fresh: dict[int, tuple[int, _Choice | None]] = {}
        hopeless: set[int] = set()
        later = reach[g + 1]
        encoded = [(target, _encode(offer), offer) for target, offer in options[g]]
        for key, (cost, back) in states.items():
            vec = key & vec_mask
            hosted = key >> shift
            for target, packed_offer, offer in encoded:
                ncost = cost + target.cost
                if limit is not None and ncost > limit:
                    break  # options come cheapest first
                if same:
                    hostings = hosting_cache.get((offer, hosted))
                    if hostings is None:
                        hostings = [
                            (extra, _encode(left), takes)
                            for extra, left, takes in _hostings(offer, hosted, same, prefs, demands)
                        ]
                        hosting_cache[(offer, hosted)] = hostings
                        if work is not None:
                            work.spend(len(hostings))
                else:
                    hostings = [(0, packed_offer, ())]
                for extra, left, takes in hostings:
                    total = vec + left
                    over = ((((total | guard) - cap_v) & guard) >> (_WIDTH - 1)) * _FIELD_MAX
                    nkey = (total & ~over) | (cap_v & over) | ((hosted | extra) << shift)
                    old = fresh.get(nkey)
                    if old is None:
                        if nkey in hopeless:
                            continue
                        hope = _decode(_sat_add(nkey & vec_mask, later, cap_v, guard), len(names))
                        if not _covers(hope, checks):
                            hopeless.add(nkey)
                            continue
                    if old is None or ncost < old[0]:
                        hosts = tuple(k for j, k in enumerate(same) if extra >> j & 1)
                        fresh[nkey] = (ncost, _Choice(back, g, target, hosts, takes))
        states = fresh
    best: tuple[int, int, _Choice | None, list[list[int]]] | None = None
    pool_demands = [(prefs[k], demands[k].count) for k in pooled]
    for key, (cost, back) in sorted(states.items(), key=lambda kv: kv[1][0]):
        if key >> shift != full_mask:
            continue
        if best is not None and (cost >> CREATED) > (best[0] >> CREATED):
            break  # rank and lost only break ties of destroyed, changed, created
        offered = _decode(key & vec_mask, len(names))
        if not _covers(offered, checks):
            continue
        if work is not None:
            work.spend(_ASSIGN)
        assigned = _assign(offered, pool_demands)
        if assigned is None:
            continue
        rank, take = assigned
        total_cost = cost + ((rank + _hosted_rank(back, prefs)) << RANK)
        if limit is not None and total_cost > limit:
            continue
        if best is None or (total_cost, cost) < best[:2]:
            best = (total_cost, cost, back, take)
    if best is None:
        return None
    return _realise(spaces, demands, names, pooled, best[2], best[3])


# What one cheapest assignment of devices to demands costs in steps of `Work`.
_ASSIGN = 20
_WIDTH = 9
_FIELD_MAX = (1 << (_WIDTH - 1)) - 1  # 255: a field's value bits
_FIELD_CAP = _FIELD_MAX // 2  # 127: two capped values add up without overflow


def _guard(dims: int) -> int:
    """The guard bit of each of `dims` fields."""
    return sum(1 << (_WIDTH * k + _WIDTH - 1) for k in range(dims))


def _encode(vec: Sequence[int]) -> int:
    packed = 0
    for k, n in enumerate(vec):
        packed |= n << (_WIDTH * k)
    return packed


def _decode(packed: int, dims: int) -> tuple[int, ...]:
    return tuple((packed >> (_WIDTH * k)) & _FIELD_MAX for k in range(dims))


def _sat_add(a: int, b: int, caps: int, guard: int) -> int:
    """Field-wise min(a + b, caps) of packed offers (fields of a and b at most `_FIELD_CAP`).

    Each field has a guard bit above its value bits: (sum | guard) - caps keeps the guard bit
    exactly where sum >= cap, without borrowing from the next field; that bit, spread over the
    value bits, selects the cap.
    """
    total = a + b
    over = ((((total | guard) - caps) & guard) >> (_WIDTH - 1)) * _FIELD_MAX
    return (total & ~over) | (caps & over)


def _bits(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


def _hosted_rank(back: _Choice | None, prefs: Sequence[_Pref]) -> int:
    rank = 0
    while back is not None:
        for k, take in zip(back.hosted, back.take, strict=True):
            ranks = dict(prefs[k])
            rank += sum(ranks[p] * n for p, n in enumerate(take) if n)
        back = back.previous
    return rank


class Memo:
    """Projections of GPU targets that one planning run reuses (dropped with it, so that a
    long-lived process does not keep them)."""

    def __init__(self) -> None:
        self.by_names: dict[
            tuple[GpuSpace, frozenset[str] | None, frozenset[str], tuple[str, ...]],
            tuple[tuple[_Target, tuple[int, ...]], ...],
        ] = {}
        self.projected: dict[
            tuple[GpuSpace, tuple[str, ...], tuple[int, ...]],
            tuple[tuple[_Target, tuple[int, ...]], ...],
        ] = {}


def _cheapest(
    offers: Iterable[tuple[_Target, tuple[int, ...]]],
) -> tuple[tuple[_Target, tuple[int, ...]], ...]:
    """The cheapest target per offer, without offers that a cheaper one covers."""
    best: dict[tuple[int, ...], _Target] = {}
    for target, vec in offers:
        old = best.get(vec)
        if old is None or target.cost < old.cost:
            best[vec] = target
    ordered = sorted(best.items(), key=lambda kv: (kv[1].cost, kv[0]))
    kept: list[tuple[_Target, tuple[int, ...]]] = []
    for vec, target in ordered:
        if any(all(map(ge, v, vec)) for _, v in kept):
            continue
        kept.append((target, vec))
    return tuple(kept)


def _projected(
    space: GpuSpace,
    policy: PolicyView,
    names: tuple[str, ...],
    caps: tuple[int, ...],
    memo: Memo,
) -> tuple[tuple[_Target, tuple[int, ...]], ...]:
    """The GPU's targets by what they offer of `names`, capped at `caps`; dominated ones out."""
    key = (space, names, caps)
    found = memo.projected.get(key)
    if found is None:
        named_key = (space, policy.allowed, policy.denied, names)
        named = memo.by_names.get(named_key)
        if named is None:
            named = _cheapest(
                (target, tuple(dict(target.offer).get(p, 0) for p in names))
                for target in _targets(space, policy.allowed, policy.denied)
            )
            memo.by_names[named_key] = named
        found = _cheapest((target, tuple(map(min, vec, caps))) for target, vec in named)
        memo.projected[key] = found
    return found


def _hostings(
    offer: tuple[int, ...],
    hosted: int,
    same: Sequence[int],
    prefs: Sequence[_Pref],
    demands: Sequence[Demand],
) -> list[tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]]:
    """Ways one GPU with `offer` can host not yet hosted same-GPU demands: (demands hosted as a
    mask over `same`, offer left for the pool, devices taken per hosted demand)."""
    out: list[tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]] = [(0, offer, ())]
    if not same:
        return out
    open_ = [j for j in range(len(same)) if not hosted >> j & 1]
    largest = len(open_) if len(same) <= _SAME_GPU_SUBSETS else min(2, len(open_))
    for size in range(1, largest + 1):
        for group in combinations(open_, size):
            wanted = [(prefs[same[j]], demands[same[j]].count) for j in group]
            if sum(c for _, c in wanted) > sum(offer):
                continue
            # Every way to take the devices, the cheapest (by rank) per offer left: which one
            # leaves the right devices for the pool depends on the other demands.
            for left, (_, takes) in sorted(_takings(list(offer), wanted).items()):
                out.append((_bits(group), left, takes))
    return out


def _takings(
    offer: list[int], wanted: Sequence[tuple[_Pref, int]]
) -> dict[tuple[int, ...], tuple[int, tuple[tuple[int, ...], ...]]]:
    """Offer left -> (rank, devices per profile per demand) of the cheapest way to serve
    `wanted` from `offer` that leaves exactly that."""
    out: dict[tuple[int, ...], tuple[int, tuple[tuple[int, ...], ...]]] = {}
    rows: list[tuple[int, ...]] = []

    def demand(k: int, rank: int) -> None:
        if k == len(wanted):
            left = tuple(offer)
            old = out.get(left)
            if old is None or rank < old[0]:
                out[left] = (rank, tuple(rows))
            return
        pref, count = wanted[k]
        row = [0] * len(offer)

        def device(j: int, need: int, rank: int) -> None:
            if need == 0:
                rows.append(tuple(row))
                demand(k + 1, rank)
                rows.pop()
                return
            if j == len(pref):
                return
            p, r = pref[j]
            for n in range(min(need, offer[p]), -1, -1):
                offer[p] -= n
                row[p] += n
                device(j + 1, need - n, rank + n * r)
                offer[p] += n
                row[p] -= n

        device(0, count, rank)

    demand(0, 0)
    return out


def _realise(
    spaces: Sequence[GpuSpace],
    demands: Sequence[Demand],
    names: Sequence[str],
    pooled: Sequence[int],
    back: _Choice | None,
    take: list[list[int]],
) -> NodePacking:
    """Concrete devices for the chosen targets; created instances nobody gets are left out."""
    targets: list[frozenset[Instance]] = [s.used | s.free for s in spaces]
    hosts: list[tuple[int, tuple[int, ...], tuple[tuple[int, ...], ...]]] = []
    while back is not None:
        targets[back.gpu] = back.target.instances
        hosts.append((back.gpu, back.hosted, back.take))
        back = back.previous
    # Per profile the instances that can be handed out: created ones first (they exist only for
    # these demands), then kept free ones, each by GPU and start.
    available: dict[str, list[tuple[int, Instance]]] = {}
    for key in sorted(
        (inst in space.free, g, inst.start, inst.profile)
        for g, (space, target) in enumerate(zip(spaces, targets, strict=True))
        for inst in target - space.used
    ):
        available.setdefault(key[3], []).append((key[1], Instance(key[3], key[2])))
    devices: list[list[tuple[int, Instance]]] = [[] for _ in demands]
    for gpu, hosted, takes in hosts:
        for k, row in zip(hosted, takes, strict=True):
            for p, n in enumerate(row):
                if not n:
                    continue
                pick = [d for d in available[names[p]] if d[0] == gpu][:n]
                for d in pick:
                    available[names[p]].remove(d)
                devices[k].extend(pick)
    for k, counts in zip(pooled, take, strict=True):
        for p, n in enumerate(counts):
            if not n:
                continue
            devices[k].extend(available[names[p]][:n])
            del available[names[p]][:n]
    unused = {d for left in available.values() for d in left}
    destroyed = changed = created = lost = rank = 0
    final: list[frozenset[Instance]] = []
    for g, (space, target) in enumerate(zip(spaces, targets, strict=True)):
        layout = frozenset(i for i in target if i in space.free or (g, i) not in unused)
        original = space.used | space.free
        destroyed += len(space.free - layout)
        created += len(layout - original)
        changed += layout != original
        lost += free_capacity(space.table, space.used) - free_capacity(space.table, layout)
        final.append(layout)
    for k, got in enumerate(devices):
        rank += sum(demands[k].profiles.index(inst.profile) for _, inst in got)
    cost = pack_cost(destroyed, changed, created, rank, lost)
    return NodePacking(
        cost,
        tuple(final),
        tuple(tuple(sorted(got, key=lambda d: (d[0], d[1].start))) for got in devices),
    )
