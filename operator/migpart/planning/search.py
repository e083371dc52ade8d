"""Local search over which node serves which request, every node packed exactly.

For problems small enough (see `migpart.planning.planner`), the planner does not settle for its
greedy device-by-device placement. A solution here is only the answer to "which requests go to
which node"; what each node then looks like is the exact cheapest packing of its requests
(`migpart.planning.packing.pack`). A search starts from a greedy plan's assignment or from
nothing, inserts what is unplaced in a given order where it costs least, then repeats until
nothing improves or its allowance runs out:

- an unsatisfied request is inserted where it costs least; or in place of a satisfied request of
  no higher priority that moves to another node (directly, or displacing a third one that moves
  on) or, having a lower priority, gives way; or a node is rebuilt around it, moving any number
  of the node's requests elsewhere;
- an unsatisfied request replaces a satisfied one of the same priority when that costs less
  (fewer free instances destroyed for the same number of satisfied requests);
- a request moves to another node, two requests on different nodes swap, or two nodes are
  emptied and filled again, when that costs less;
- when nothing else helps, one satisfied request is given up to make room for several.

Satisfaction per priority never drops, and for equal satisfaction the total cost (destroyed,
GPUs changed, created, preference rank, capacity lost) never rises. The allowance counts the
node packer's steps (`migpart.planning.packing.Work`), never a clock, and cached packings are
free, so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from migpart.planning.cost import RANK
from migpart.planning.packer import Packed, Packer, Solution
from migpart.planning.packing import NodePacking, OutOfWork, Work

# Moves that only change the cost (not who is served) must gain at least one step of preference
# rank: chasing the capacity-lost tie-breaker across nodes costs far more than it is worth.
_STEP = 1 << RANK

# members, packings, costs, where, satisfied per level: a search state to restore.
_State = tuple[list[list[int]], list[NodePacking | None], list[int], dict[int, int], list[int]]
# a trial's key in `_keep_best`: a cost, or satisfied counts then a cost
_K = TypeVar("_K", int, tuple[tuple[int, ...], int])


class NodeSearch:
    """One search: the current solution and the moves that improve it."""

    def __init__(self, packer: Packer) -> None:
        self.packer = packer
        self.demand = packer.demand
        self.level = packer.level
        self.spaces = packer.spaces
        self.members: list[list[int]] = [[] for _ in self.spaces]
        self.packing: list[NodePacking | None] = [None] * len(self.spaces)
        self.cost: list[int] = list(packer.empty)
        self.where: dict[int, int] = {}
        self.satisfied = [0] * packer.n_levels
        self.position: dict[int, int] = {}

    def _pack(self, node: int, members: Sequence[int], limit: int | None = None) -> Packed | None:
        return self.packer.pack(node, members, limit)

    def _empty(self, node: int) -> int:
        return self.packer.empty[node]

    def _set(self, node: int, packed: Packed | None) -> None:
        if packed is None:
            self.packing[node] = None
            self.members[node] = []
            self.cost[node] = self._empty(node)
            return
        packing, order = packed
        self.packing[node] = packing
        self.members[node] = order
        self.cost[node] = packing.cost
        for i in order:
            self.where[i] = node

    def _without(self, node: int, gone: int) -> tuple[Packed | None, int]:
        """The node without request `gone` (None: nothing left on it), and its cost."""
        rest = [m for m in self.members[node] if m != gone]
        if not rest:
            return None, self._empty(node)
        found = self._pack(node, rest)
        # The layouts that served every member still serve the others.
        assert found is not None
        return found, found[0].cost

    def _drop(self, i: int) -> None:
        self.satisfied[self.level[i]] -= 1
        del self.where[i]

    def _add(self, i: int) -> None:
        self.satisfied[self.level[i]] += 1

    # --- the search -------------------------------------------------------------------------

    def run(
        self, order: Sequence[int], steps: int, seed: Mapping[int, int] | None = None
    ) -> Solution:
        """Search from `seed` (request -> node, e.g. a greedy plan's) or else from inserting
        the requests in `order`, spending at most `steps` steps of node packing (cached
        packings are free). Requests are tried in `order` throughout."""
        self.packer.work = Work(steps)
        self.position = {i: k for k, i in enumerate(order)}
        try:
            if seed:
                self._seed(seed)
            for i in order:
                if i not in self.where and self.demand[i]:
                    self._insert(i)
            changed = True
            while changed:
                changed = False
                for i in order:
                    if i not in self.where and self.demand[i]:
                        changed |= self._insert(i) or self._eject(i) or self._repack(i)
                for i in order:
                    if i not in self.where and self.demand[i]:
                        changed |= self._replace(i)
                changed |= self._relocate()
                changed |= self._swap()
                if not changed:
                    changed = self._rebuild_pairs()
                if not changed:
                    changed = self._refill(order)
        except OutOfWork:
            pass
        return self.solution()

    def solution(self) -> Solution:
        key = (tuple(-s for s in self.satisfied), sum(self.cost))
        return Solution(
            key,
            tuple(self.packing),
            tuple(tuple(m) for m in self.members),
        )

    def _seed(self, seed: Mapping[int, int]) -> None:
        """Start from a known assignment; a node it overfills (cannot happen for a valid plan)
        keeps what fits."""
        on: dict[int, list[int]] = {}
        for i in sorted(seed, key=lambda i: self.position.get(i, i)):
            if seed[i] in self.demand[i]:
                on.setdefault(seed[i], []).append(i)
        for node, members in sorted(on.items()):
            packed = self._pack(node, members)
            if packed is None:
                continue
            self._set(node, packed)
            for i in members:
                self._add(i)

    def _insert(self, i: int) -> bool:
        best = self._cheapest_addition(i)
        if best is None:
            return False
        self._set(*best)
        self._add(i)
        return True

    def _cheapest_addition(self, i: int, but: int | None = None) -> tuple[int, Packed] | None:
        """The node (other than `but`) where adding request i costs least (the first of equal
        costs) and its packing with i; None where no node fits it."""
        best: tuple[int, int, Packed] | None = None
        for node in self.demand[i]:
            if node == but:
                continue
            limit = None if best is None else self.cost[node] + best[0]
            packed = self._pack(node, [*self.members[node], i], limit)
            if packed is None:
                continue
            delta = packed[0].cost - self.cost[node]
            if best is None or (delta, node) < best[:2]:
                best = (delta, node, packed)
        return None if best is None else best[1:]

    def _eject(self, i: int) -> bool:
        """Put request i in place of a request e of no higher priority on some node; e moves to
        another node (directly, or displacing a third request f of no higher priority than i
        that moves on or, being of lower priority than i, gives way), or gives way itself when
        its priority is lower than i's. A move that drops nobody wins over one that drops a
        request; then the cheapest wins."""
        level = self.level[i]
        best: tuple[tuple[int, int], list[tuple[int, Packed]], list[int]]
        best = ((0, 0), [], [])
        found = False
        for node in self.demand[i]:
            for e in list(self.members[node]):
                if self.level[e] < level:
                    continue  # e has a higher priority
                rest = [m for m in self.members[node] if m != e]
                here = self._pack(node, [*rest, i])
                if here is None:
                    continue
                delta = here[0].cost - self.cost[node]
                # Lower-priority requests that are dropped count first (fewer is better).
                if self.level[e] > level:
                    cand = ((1, delta), [(node, here)], [e])
                    if not found or cand[0] < best[0]:
                        best, found = cand, True
                for other in self.demand[e]:
                    if other == node:
                        continue
                    moved = self._pack(other, [*self.members[other], e])
                    if moved is not None:
                        total = delta + moved[0].cost - self.cost[other]
                        cand = ((0, total), [(node, here), (other, moved)], [])
                        if not found or cand[0] < best[0]:
                            best, found = cand, True
                        continue
                    for f in self.members[other]:
                        if self.level[f] < level:
                            continue
                        rest_other = [m for m in self.members[other] if m != f]
                        there = self._pack(other, [*rest_other, e])
                        if there is None:
                            continue
                        total = delta + there[0].cost - self.cost[other]
                        if self.level[f] > level:
                            cand = ((1, total), [(node, here), (other, there)], [f])
                            if not found or cand[0] < best[0]:
                                best, found = cand, True
                        for third in self.demand[f]:
                            if third in (node, other):
                                continue
                            last = self._pack(third, [*self.members[third], f])
                            if last is None:
                                continue
                            grand = total + last[0].cost - self.cost[third]
                            cand = (
                                (0, grand),
                                [(node, here), (other, there), (third, last)],
                                [],
                            )
                            if not found or cand[0] < best[0]:
                                best, found = cand, True
        if not found:
            return False
        _, sets, dropped = best
        for e in dropped:
            self._drop(e)
        for node, packed in sets:
            self._set(node, packed)
        self._add(i)
        return True

    def _repack(self, i: int) -> bool:
        """Rebuild one node around request i: i first, then the node's requests (higher
        priority first, then in search order; or those that fewest other nodes could serve
        first) while they still fit; those that do not are
        inserted elsewhere or, having a lower priority than i, give way. Moves any number of
        requests at once, which `_eject` cannot. The best node wins."""
        level = self.level[i]

        def trials() -> Iterator[tuple[tuple[int, ...], int] | None]:
            for node in self.demand[i]:
                for flexible_last in (False, True):
                    if self._repack_on(i, node, level, flexible_last):
                        yield (tuple(-n for n in self.satisfied), sum(self.cost))
                    else:
                        yield None

        return self._keep_best(trials())

    def _repack_on(self, i: int, node: int, level: int, flexible_last: bool) -> bool:
        """One rebuild of `node` around i; with `flexible_last`, the requests that fewest other
        nodes could serve are kept first."""

        def keep_first(m: int) -> tuple[int, int, int]:
            return (len(self.demand[m]) if flexible_last else 0, self.level[m], self.position[m])

        order = sorted(self.members[node], key=keep_first)
        kept = self._pack(node, [i])
        if kept is None:
            return False
        displaced: list[int] = []
        for m in order:
            more = self._pack(node, [*kept[1], m])
            if more is None:
                displaced.append(m)
            else:
                kept = more
        if not displaced:
            return False  # then _insert would have placed i here
        for m in displaced:
            del self.where[m]
        self._set(node, kept)
        self._add(i)
        for m in displaced:
            best = self._cheapest_addition(m, but=node)
            if best is not None:
                self._set(*best)
            elif self.level[m] > level:
                self.satisfied[self.level[m]] -= 1
            else:
                return False
        return True

    def _refill(self, order: Sequence[int]) -> bool:
        """Give up one satisfied request e, fill the room with unsatisfied ones (and e again,
        last) by insertions and ejections; kept when more requests are satisfied (per priority)
        than before. Finds the trades of one request for two that single moves cannot."""
        start = self._state()
        before = tuple(-n for n in self.satisfied)
        try:
            for e in reversed(order):
                if e not in self.where:
                    continue
                node = self.where[e]
                left, _ = self._without(node, e)
                self._drop(e)
                self._set(node, left)
                for i in [*(i for i in order if i not in self.where and i != e), e]:
                    if i not in self.where and self.demand[i]:
                        _ = self._insert(i) or self._eject(i)
                if tuple(-n for n in self.satisfied) < before:
                    return True
                self._load(start)
        except OutOfWork:
            self._load(start)
            raise
        return False

    def _rebuild_pairs(self) -> bool:
        """Empty two nodes and insert their requests again, each where it costs less, in search
        order and then most devices first; kept when the two cost less than before. Finds the
        exchanges of several requests between two nodes that single moves cannot."""
        improved = False
        nodes = range(len(self.spaces))
        for a in nodes:
            for b in nodes:
                if b <= a or not (self.members[a] or self.members[b]):
                    continue
                if self._rebuild(a, b):
                    improved = True
        return improved

    def _rebuild(self, a: int, b: int) -> bool:
        both = [*self.members[a], *self.members[b]]
        if any(a not in self.demand[i] or b not in self.demand[i] for i in both):
            return False  # a request that only one of them can serve stays where it is
        before = self.cost[a] + self.cost[b]
        orders = [
            sorted(both, key=lambda i: self.position[i]),
            sorted(both, key=lambda i: (-self.demand[i][a].count, self.position[i])),
        ]

        def trials() -> Iterator[int | None]:
            for order in orders:
                self._set(a, None)
                self._set(b, None)
                placed = True
                for i in order:
                    options = []
                    for node in (a, b):
                        packed = self._pack(node, [*self.members[node], i])
                        if packed is not None:
                            options.append((packed[0].cost - self.cost[node], node, packed))
                    if not options:
                        placed = False
                        break
                    _, node, packed = min(options, key=lambda o: o[:2])
                    self._set(node, packed)
                after = self.cost[a] + self.cost[b]
                yield after if placed and after <= before - _STEP else None

        return self._keep_best(trials())

    def _keep_best(self, trials: Iterator[_K | None]) -> bool:
        """Run each trial from the state as it is now: a trial changes the state and yields
        its key (lower is better), or None where it found nothing; the state is put back
        after each. Then the best trial's state is loaded (the first of equal keys); False
        when no trial found anything. Out of work, the state is put back and that raised."""
        start = self._state()
        best: tuple[_K, _State] | None = None
        try:
            for key in trials:
                if key is not None and (best is None or key < best[0]):
                    best = (key, self._state())
                self._load(start)
        except OutOfWork:
            self._load(start)
            raise
        if best is None:
            return False
        self._load(best[1])
        return True

    def _state(self) -> _State:
        return (
            [list(m) for m in self.members],
            list(self.packing),
            list(self.cost),
            dict(self.where),
            list(self.satisfied),
        )

    def _load(self, state: _State) -> None:
        members, packing, cost, where, satisfied = state
        self.members = [list(m) for m in members]
        self.packing = list(packing)
        self.cost = list(cost)
        self.where = dict(where)
        self.satisfied = list(satisfied)

    def _replace(self, i: int) -> bool:
        """Serve unsatisfied i instead of satisfied e of the same priority when it costs less."""
        level = self.level[i]
        best: tuple[int, int, int, Packed] | None = None
        for node in self.demand[i]:
            for e in self.members[node]:
                if self.level[e] != level:
                    continue
                rest = [m for m in self.members[node] if m != e]
                packed = self._pack(node, [*rest, i], self.cost[node] - _STEP)
                if packed is None:
                    continue
                delta = packed[0].cost - self.cost[node]
                if delta <= -_STEP and (best is None or (delta, node, e) < best[:3]):
                    best = (delta, node, e, packed)
        if best is None:
            return False
        _, node, e, packed = best
        self._drop(e)
        self._set(node, packed)
        self._add(i)
        return True

    def _relocate(self) -> bool:
        """Move single requests to another node whenever that lowers the total cost."""
        improved = False
        for node, i in self._placed():
            left, cost_left = self._without(node, i)
            base = cost_left - self.cost[node]
            if base > -_STEP:
                continue  # adding i elsewhere never costs less than nothing
            best: tuple[int, int, Packed] | None = None
            for other in self.demand[i]:
                if other == node:
                    continue
                limit = self.cost[other] - base - _STEP
                if best is not None:
                    limit = min(limit, self.cost[other] - base + best[0])
                moved = self._pack(other, [*self.members[other], i], limit)
                if moved is None:
                    continue
                total = base + moved[0].cost - self.cost[other]
                if total <= -_STEP and (best is None or (total, other) < best[:2]):
                    best = (total, other, moved)
            if best is None:
                continue
            self._set(node, left)
            self._set(best[1], best[2])
            improved = True
        return improved

    def _swap(self) -> bool:
        """Swap two requests on different nodes whenever that lowers the total cost."""
        improved = False
        for node, i in self._placed():
            _, cost_i = self._without(node, i)
            for other in self.demand[i]:
                if other <= node or self.where.get(i) != node:
                    continue
                for j in list(self.members[other]):
                    if node not in self.demand[j] or self.demand[j][node] == self.demand[i][node]:
                        continue
                    _, cost_j = self._without(other, j)
                    both = self.cost[node] + self.cost[other]
                    # Adding never costs less than nothing: only a gain here can pay.
                    if cost_i + cost_j > both - _STEP:
                        continue
                    here_members = [m for m in self.members[node] if m != i] + [j]
                    here = self._pack(node, here_members, both - cost_j - _STEP)
                    if here is None:
                        continue
                    there_members = [m for m in self.members[other] if m != j] + [i]
                    there = self._pack(other, there_members, both - here[0].cost - _STEP)
                    if there is None:
                        continue
                    if here[0].cost + there[0].cost <= both - _STEP:
                        self._set(node, here)
                        self._set(other, there)
                        improved = True
                        break
        return improved

    def _placed(self) -> Iterator[tuple[int, int]]:
        """(node, request) for each request on each node, node by node, skipping one that a
        move made meanwhile took off the node it was listed on."""
        for node in range(len(self.spaces)):
            for i in list(self.members[node]):
                if self.where.get(i) == node:
                    yield node, i
