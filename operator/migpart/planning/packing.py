"""Exact packing of one node: the cheapest target layouts of its GPUs that serve a set of demands.

The greedy planner adds one cheapest device at a time and can paint itself into a corner (a 1g
placed where a later 3g needed the room, a free instance destroyed that another GPU could have
spared). For problems small enough, the planner asks this module the exact question per node
instead: given the node's GPUs (used instances pinned, free instances reusable or destroyable)
and the demands placed on it, which target layouts serve every demand at the least cost
(`migpart.planning.cost`), or is it impossible?

Why it is exact and still small:

- Each GPU supplies a few dozen cheapest targets (`migpart.planning.targets`). Supplies are
  projected onto the profiles the demands can use and capped at what they could use; a
  dynamic program over the node's GPUs keeps the cheapest combination per capped supply.
- Whether an supply serves the demands is a transportation problem, checked by Hall's theorem
  and solved by a min-cost flow (`migpart.planning.transport`).
- Demands that need all their devices on one GPU (`same_gpu`) are hosted by one GPU each: the
  dynamic program's state also records which of them are hosted (with more than four on one
  node, a GPU hosts at most two of them, which may miss a packing but never makes a wrong one).

The work is counted in dynamic-programming steps (`Work`), so that callers can bound it without
a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from migpart.mig import Instance
from migpart.planning.cost import CREATED, RANK, cost_of, free_capacity
from migpart.planning.model import PolicyView
from migpart.planning.targets import GpuSpace, Memo, Target, most_supplied, projected
from migpart.planning.transport import Pref, assign, bits, covers, hall, host_options


@dataclass(frozen=True, slots=True)
class DeviceDemand:
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
    target: Target
    hosted: tuple[int, ...]
    take: tuple[tuple[int, ...], ...]


def pack(
    spaces: Sequence[GpuSpace],
    demands: Sequence[DeviceDemand],
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
    prefs: list[Pref] = [
        tuple((index[p], r) for r, p in enumerate(d.profiles) if p in index) for d in demands
    ]
    for demand, pref in zip(demands, prefs, strict=True):
        if demand.count > 0 and not pref:
            return None
    caps = [0] * len(names)
    for demand, pref in zip(demands, prefs, strict=True):
        for p, _ in pref:
            caps[p] += demand.count
    counts = [d.count for d in demands]
    same = [k for k, d in enumerate(demands) if d.same_gpu and d.count > 1]
    pooled = [k for k, d in enumerate(demands) if d.count > 0 and k not in same]
    checks = hall(
        [bits(p for p, _ in prefs[k]) for k in pooled], [demands[k].count for k in pooled]
    )
    key_names = tuple(names)
    # No GPU supplies more than its targets do: cap the counts at that, and give up at once when
    # even every GPU's most of every profile together falls short.
    most = [0] * len(names)
    for space in spaces:
        for p, n in enumerate(
            most_supplied(projected(space, policy, key_names, tuple(caps), memo))
        ):
            most[p] += n
    caps = [min(c, m, _FIELD_CAP) for c, m in zip(caps, most, strict=True)]
    if not covers(caps, checks):
        return None
    key_caps = tuple(caps)
    options = [projected(space, policy, key_names, key_caps, memo) for space in spaces]
    # Supplies are packed into ints, one 9-bit field per profile, so that adding two of them and
    # capping the sum at `caps` takes a handful of int operations (see `_sat_add`).
    cap_v = _encode(key_caps)
    reach = [0] * (len(spaces) + 1)
    for g in range(len(spaces) - 1, -1, -1):
        reach[g] = _sat_add(
            reach[g + 1], _encode(most_supplied(options[g])), cap_v, _guard(len(names))
        )
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
        encoded = [(target, _encode(supply), supply) for target, supply in options[g]]
        for key, (cost, back) in states.items():
            vec = key & vec_mask
            hosted = key >> shift
            for target, packed_supply, supply in encoded:
                ncost = cost + target.cost
                if limit is not None and ncost > limit:
                    break  # options come cheapest first
                if same:
                    hostings = hosting_cache.get((supply, hosted))
                    if hostings is None:
                        hostings = [
                            (extra, _encode(left), takes)
                            for extra, left, takes in host_options(
                                supply, hosted, same, prefs, counts
                            )
                        ]
                        hosting_cache[(supply, hosted)] = hostings
                        if work is not None:
                            work.spend(len(hostings))
                else:
                    hostings = [(0, packed_supply, ())]
                for extra, left, takes in hostings:
                    total = vec + left
                    over = ((((total | guard) - cap_v) & guard) >> (_WIDTH - 1)) * _FIELD_MAX
                    nkey = (total & ~over) | (cap_v & over) | ((hosted | extra) << shift)
                    old = fresh.get(nkey)
                    if old is None:
                        if nkey in hopeless:
                            continue
                        hope = _decode(_sat_add(nkey & vec_mask, later, cap_v, guard), len(names))
                        if not covers(hope, checks):
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
        supplied = _decode(key & vec_mask, len(names))
        if not covers(supplied, checks):
            continue
        if work is not None:
            work.spend(_ASSIGN)
        assigned = assign(supplied, pool_demands)
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
    """Field-wise min(a + b, caps) of packed supplies (fields of a and b at most `_FIELD_CAP`).

    Each field has a guard bit above its value bits: (sum | guard) - caps keeps the guard bit
    exactly where sum >= cap, without borrowing from the next field; that bit, spread over the
    value bits, selects the cap.
    """
    total = a + b
    over = ((((total | guard) - caps) & guard) >> (_WIDTH - 1)) * _FIELD_MAX
    return (total & ~over) | (caps & over)


def _hosted_rank(back: _Choice | None, prefs: Sequence[Pref]) -> int:
    rank = 0
    while back is not None:
        for k, take in zip(back.hosted, back.take, strict=True):
            ranks = dict(prefs[k])
            rank += sum(ranks[p] * n for p, n in enumerate(take) if n)
        back = back.previous
    return rank


def _realise(
    spaces: Sequence[GpuSpace],
    demands: Sequence[DeviceDemand],
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
    cost = cost_of(destroyed, changed, created, rank, lost)
    return NodePacking(
        cost,
        tuple(final),
        tuple(tuple(sorted(got, key=lambda d: (d[0], d[1].start))) for got in devices),
    )
