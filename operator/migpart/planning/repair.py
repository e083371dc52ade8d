"""The greedy's repair pass: a request left unsatisfied gets a node re-packed around it.

The greedy places one request at a time and can leave one unsatisfied that a different packing
of some node would have served. After each priority level, every unsatisfied request of the
level is tried on the nodes that could hold it from their snapshot state: the node goes back
to that state (used instances only pinned), the request is placed first, then the node's
earlier requests are placed again in their order; any that no longer fit there are placed
elsewhere. The move is kept only when every request that was satisfied still is, so
satisfaction strictly improves. Trials are bounded by a count (not a clock) so that the result
stays deterministic and the cost bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from migpart.planning.classes import Steps
from migpart.planning.index import NodeIndex, Placed
from migpart.planning.model import Request

# Re-pack attempts of the repair pass over a whole plan.
_REPAIR_TRIALS = 500


class Repair:
    """The repair pass of one greedy run; `assigned` and `on_node` are the run's own."""

    def __init__(
        self,
        requests: Sequence[Request],
        index: NodeIndex,
        assigned: dict[int, Placed],
        on_node: list[list[int]],
    ) -> None:
        """Made before anything is placed: the nodes' current state is the snapshot's."""
        self.requests = requests
        self.index = index
        self.classes = index.classes
        self.assigned = assigned
        self.on_node = on_node
        self.start = [tuple(cids) for cids in index.cids]
        self.budget = _REPAIR_TRIALS
        self.start_room: dict[tuple[str, ...], list[int]] = {}

    def run(self, order: list[int], place: Callable[[Request], Placed | None]) -> None:
        """Retry each unsatisfied request of `order` by re-packing one node with it first.

        `place` puts a request displaced by a re-pack on its cheapest node, as the greedy
        does (None: no node can take it). It is passed per call, not kept, so that the
        greedy and its repair make no reference cycle (see `planner.collector_paused`).
        """
        # (profiles, count, node set) -> nodes that could hold the request from their snapshot
        # state; one list per shape, so unsatisfied requests never rescan every node.
        candidates: dict[tuple[tuple[str, ...], int, frozenset[str] | None], list[int]] = {}
        for i in order:
            request = self.requests[i]
            if i in self.assigned or request.count <= 0 or not request.profiles:
                continue
            if self.budget <= 0:
                return
            profiles = tuple(dict.fromkeys(request.profiles))
            key = (profiles, request.count, request.nodes)
            nodes = candidates.get(key)
            if nodes is None:
                scope: Sequence[int] = range(len(self.start))
                if request.nodes is not None:
                    scope = self.index.scope(request.nodes)
                rooms = self._start_rooms(profiles)
                nodes = candidates[key] = [n for n in scope if rooms[n] >= request.count]
            for node in nodes:
                if self.budget <= 0:
                    return
                self.budget -= 1
                if self._repack(i, node, profiles, place):
                    break

    def _start_rooms(self, profiles: tuple[str, ...]) -> list[int]:
        """Per node, an upper bound of the devices of `profiles` its snapshot state holds."""
        rooms = self.start_room.get(profiles)
        if rooms is None:
            room = self.classes.room
            rooms = self.start_room[profiles] = [
                sum(room(cid, p) for cid in cids for p in profiles) for cids in self.start
            ]
        return rooms

    def _repack(
        self,
        first: int,
        node: int,
        profiles: tuple[str, ...],
        place: Callable[[Request], Placed | None],
    ) -> bool:
        evaluate = self.index.evaluator.evaluate
        saved = list(self.index.cids[node])
        state = list(self.start[node])
        request = self.requests[first]
        found = evaluate(tuple(state), profiles, request.count, request.same_gpu)
        if found is None:
            return False
        self.classes.advance(state, found[1])
        kept: list[tuple[int, Steps]] = [(first, found[1])]
        displaced: list[int] = []
        for i in self.on_node[node]:
            other = self.requests[i]
            again = evaluate(
                tuple(state), tuple(dict.fromkeys(other.profiles)), other.count, other.same_gpu
            )
            if again is None:
                displaced.append(i)
            else:
                self.classes.advance(state, again[1])
                kept.append((i, again[1]))
        if len(displaced) > 1:
            return False  # moving one request elsewhere is enough for a repair step
        self.index.reset(node, state)
        moved: list[tuple[int, Placed]] = []
        for i in displaced:
            target = place(self.requests[i])
            if target is None:
                self.index.reset(node, saved)
                return False
            moved.append((i, target))
        self.on_node[node] = [i for i, _ in kept]
        for i, steps in kept:
            self.assigned[i] = (node, steps)
        for i, target in moved:
            self.assigned[i] = target
            self.on_node[target[0]].append(i)
        return True
