"""GPU classes: GPUs in the same state share one id, and what can be added to them is
computed once per class.

A class is a model table, the pinned instances (used, or already assigned by this plan), the
remaining free instances and whether the GPU has changed. A cluster of a thousand nodes holds
few distinct classes, so the cheapest way to add one device of a profile to a class
(`GpuClasses.best`, with the class it leads to) is computed once and cached, and so is the
*chain* of devices added one cheapest at a time (`GpuClasses.chain`). Evaluating a request on
a node then merges its GPUs' chains (`migpart.planning.evaluate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from migpart.mig import Instance, ModelTable, Occupancy
from migpart.planning.cost import RANK, cost_of, free_capacity
from migpart.planning.model import PolicyView

# Devices added to a GPU: ((GPU position, instance), ...), in the order they are added.
Steps = tuple[tuple[int, Instance], ...]


@dataclass(frozen=True, slots=True)
class Option:
    """The cheapest way to add one device of a profile to a GPU class."""

    cost: int
    instance: Instance
    to_class: int


# One device added to a GPU: cost with the preference rank, the instance, the class after,
# and the cost of the chain up to and including it.
Link = tuple[int, Instance, int, int]


@dataclass(slots=True)
class _Chain:
    links: list[Link]
    ended: bool  # no further device fits


class GpuClasses:
    """Interned GPU states and their cached options. Ids index the parallel lists."""

    def __init__(self, policy: PolicyView) -> None:
        self.policy = policy
        self.ids: dict[tuple[ModelTable, frozenset[Instance], frozenset[Instance], bool], int] = {}
        self.table: list[ModelTable] = []
        self.pinned: list[frozenset[Instance]] = []
        self.free: list[frozenset[Instance]] = []
        self.changed: list[bool] = []
        self._taken: dict[int, Occupancy] = {}
        self._best: dict[tuple[int, str], Option | None] = {}
        self._capacity: dict[tuple[ModelTable, frozenset[Instance]], int] = {}
        self._room: dict[tuple[int, str], int] = {}
        self._chains: dict[tuple[int, tuple[str, ...]], _Chain] = {}

    def intern(
        self,
        table: ModelTable,
        pinned: frozenset[Instance],
        free: frozenset[Instance],
        changed: bool,
    ) -> int:
        key = (table, pinned, free, changed)
        cid = self.ids.get(key)
        if cid is None:
            cid = len(self.table)
            self.ids[key] = cid
            self.table.append(table)
            self.pinned.append(pinned)
            self.free.append(free)
            self.changed.append(changed)
        return cid

    def taken(self, cid: int) -> Occupancy:
        """What the pinned instances of class `cid` occupy of the GPU."""
        occupancy = self._taken.get(cid)
        if occupancy is None:
            occupancy = self._taken[cid] = Occupancy.of(self.table[cid], self.pinned[cid])
        return occupancy

    def capacity(self, table: ModelTable, pinned: frozenset[Instance]) -> int:
        """`free_capacity` beside the pinned instances, cached for the plan."""
        key = (table, pinned)
        cached = self._capacity.get(key)
        if cached is None:
            cached = self._capacity[key] = free_capacity(table, pinned)
        return cached

    def room(self, cid: int, profile: str) -> int:
        """An upper bound of the devices of `profile` this class can still provide: its free
        instances of the profile, or as many new ones as fit beside the pinned instances."""
        key = (cid, profile)
        cached = self._room.get(key)
        if cached is not None:
            return cached
        table = self.table[cid]
        result = 0
        if table.has(profile):
            result = sum(1 for f in self.free[cid] if f.profile == profile)
            if self.policy.permits(profile):
                fit = self.taken(cid).fit(table.profile(profile))
                result = max(fit, result)
        self._room[key] = result
        return result

    def chain(self, cid: int, profiles: tuple[str, ...], length: int) -> list[Link]:
        """Devices of `profiles` added to class `cid` one cheapest at a time (the cost counts
        the profile's preference rank), at least `length` of them where the GPU has room.

        A node's cheapest devices are these chains of its GPUs merged, so evaluating a node
        costs a merge of cached chains, however many nodes share its GPUs' classes.
        """
        key = (cid, profiles)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = _Chain([], False)
        links = chain.links
        while len(links) < length and not chain.ended:
            current, before = (links[-1][2], links[-1][3]) if links else (cid, 0)
            link: Link | None = None
            for rank, profile in enumerate(profiles):
                option = self.best(current, profile)
                if option is not None:
                    cost = option.cost + (rank << RANK)
                    if link is None or cost < link[0]:
                        link = (cost, option.instance, option.to_class, before + cost)
            if link is None:
                chain.ended = True
            else:
                links.append(link)
        return links

    def best(self, cid: int, profile: str) -> Option | None:
        """The cheapest single device of `profile` on class `cid` (None: impossible)."""
        key = (cid, profile)
        if key in self._best:
            return self._best[key]
        option = self._compute_best(cid, profile)
        self._best[key] = option
        return option

    def best_create(self, cid: int, profile: str) -> Option | None:
        """The cheapest new instance of `profile` on class `cid`, never a reuse (for spares)."""
        return self._compute_best(cid, profile, reuse=False)

    def _compute_best(self, cid: int, profile: str, reuse: bool = True) -> Option | None:
        """A free instance of the profile when there is one (best fit among them); else a new
        one at the placement that costs least, destroying the free instances in its way and
        those that would break the compute budget or the instance limit."""
        table = self.table[cid]
        if not table.has(profile):
            return None
        prof = table.profile(profile)
        pinned = self.pinned[cid]
        free = self.free[cid]
        changed = self.changed[cid]
        before = self.capacity(table, pinned)
        best: tuple[int, int, Instance, frozenset[Instance], frozenset[Instance], bool] | None
        best = None
        # Reuse: an existing free instance of the profile, nothing is created or destroyed.
        for inst in free:
            if inst.profile != profile or not reuse:
                continue
            new_pinned = pinned | {inst}
            cost = cost_of(0, 0, 0, 0, before - self.capacity(table, new_pinned))
            cand = (cost, inst.start, inst, new_pinned, free - {inst}, changed)
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best is not None or not self.policy.permits(profile):
            # Reusing is always preferred to creating (created is a cost field above lost).
            return self._finish(table, best)
        taken = self.taken(cid)
        if taken.headroom(prof) < 1:
            return None
        for start in prof.placements:
            m = prof.mask(start)
            if taken.mask & m:
                continue
            victims = [f for f in free if table.profile(f.profile).mask(f.start) & m]
            rest = sorted(
                (f for f in free if not table.profile(f.profile).mask(f.start) & m),
                key=lambda f: (-table.profile(f.profile).compute_slices, -f.start),
            )
            total = taken.compute + prof.compute_slices
            total += sum(table.profile(f.profile).compute_slices for f in rest)
            same = taken.count(profile) + 1 + sum(1 for f in rest if f.profile == profile)
            # Free instances that would break the compute budget or the instance limit go too.
            while rest and (total > table.compute_slices or same > prof.max_instances):
                if same > prof.max_instances:
                    victim = next(f for f in rest if f.profile == profile)
                else:
                    victim = rest[0]
                rest.remove(victim)
                victims.append(victim)
                total -= table.profile(victim.profile).compute_slices
                same -= victim.profile == profile
            inst = Instance(profile, start)
            new_pinned = pinned | {inst}
            cost = cost_of(
                len(victims),
                0 if changed else 1,
                1,
                0,
                before - self.capacity(table, new_pinned),
            )
            cand = (cost, start, inst, new_pinned, frozenset(rest), True)
            if best is None or cand[:2] < best[:2]:
                best = cand
        return self._finish(table, best)

    def _finish(
        self,
        table: ModelTable,
        best: tuple[int, int, Instance, frozenset[Instance], frozenset[Instance], bool] | None,
    ) -> Option | None:
        if best is None:
            return None
        cost, _, inst, new_pinned, new_free, changed = best
        return Option(cost, inst, self.intern(table, new_pinned, new_free, changed))

    def advance(self, cids: list[int], steps: Steps) -> None:
        """Move the GPUs' classes `cids` past the devices `steps` adds."""
        for pos, inst in steps:
            option = self.best(cids[pos], inst.profile)
            if option is None or option.instance != inst:
                # Steps are evaluated on this exact state, so the cached option matches.
                raise AssertionError("planner state out of sync")
            cids[pos] = option.to_class
