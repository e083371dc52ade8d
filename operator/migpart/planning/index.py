"""Which node a request costs least on, without evaluating every node for every request.

`NodeIndex` holds the nodes' current state (the class of each GPU, see
`migpart.planning.classes`) during one greedy run, and heaps over it:

- Every profile that requests ask for has a heap of nodes keyed by the cheapest single device
  of that profile the node can offer. A node that changes pushes fresh entries (stale ones are
  dropped when they surface, by a version per node), so single-device requests take
  O(log nodes). Restricted ones walk the same heaps past the nodes outside their set.
- Every other shape of request (profiles, count, same GPU, node set) has a heap of its own,
  keyed by its full cost on each node of its set: built by its first request, and refreshed
  before each later one with the nodes changed since (a log of changed nodes), so a shape
  costs one pass over its nodes plus one evaluation per node changed between its requests.
  A restricted single-device request whose set is small, or lies deep in the profile heaps,
  uses one too.

Every choice is exact: the node (cheapest, then first) that a scan of every node of the
request's set would choose, which `scan=True` does instead, for tests and the benchmark.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from migpart.planning.classes import GpuClasses, Steps
from migpart.planning.cost import RANK
from migpart.planning.evaluate import Evaluator

# A single-device request restricted to a node set passes over at most this many heap entries
# of other nodes before it builds a heap of its own.
_PASSED = 32

# A placement: cost, node index, devices.
Found = tuple[int, int, Steps]
# Where a request went: node index, devices.
Placed = tuple[int, Steps]


@dataclass(frozen=True, slots=True)
class Shape:
    """What a request needs, without its name: the cache and memo key."""

    profiles: tuple[str, ...]
    count: int
    nodes: frozenset[str] | None
    same_gpu: bool = False


@dataclass(slots=True)
class _Heap:
    """(cost, node, node version) entries, and how much of the change log they reflect."""

    entries: list[tuple[int, int, int]]
    read: int


class NodeIndex:
    """The nodes' GPU classes in one greedy run, and the heaps that find a request's node."""

    def __init__(
        self,
        names: Sequence[str],
        cids: list[list[int]],
        classes: GpuClasses,
        evaluator: Evaluator,
        scan: bool = False,
    ) -> None:
        """`cids`: per node, the class of each GPU (the index changes it in place).

        `scan`: requests restricted to a node set evaluate every node of the set on every
        placement instead of keeping a heap; the same plans, slower.
        """
        self.names = list(names)
        self.positions = {name: i for i, name in enumerate(self.names)}
        self.cids = cids
        self.classes = classes
        self.evaluator = evaluator
        self.scan = scan
        self.version = [0] * len(cids)
        # Nodes in the order they changed, read by the shape heaps to refresh themselves.
        self.changes: list[int] = []
        self.heaps: dict[str, list[tuple[int, int, int]]] = {}
        self.shape_heaps: dict[tuple[tuple[str, ...], int, bool, frozenset[str] | None], _Heap]
        self.shape_heaps = {}
        # node set -> indices of its snapshot nodes, ascending
        self.scopes: dict[frozenset[str], list[int]] = {}

    def cheapest(self, shape: Shape) -> Found | None:
        """The node where the request costs least (the first on ties), with its cost and
        devices; None when it fits on no node it may use."""
        if shape.nodes is not None and self.scan:
            return self._scan(shape)
        if shape.count == 1:
            if shape.nodes is None:
                return self._single(shape)
            return self._single_in(shape)
        return self._by_shape(shape)

    def evaluate(
        self, node: int, profiles: tuple[str, ...], count: int, same_gpu: bool = False
    ) -> tuple[int, Steps] | None:
        """Cost and devices of `count` devices on `node` as it is now."""
        return self.evaluator.evaluate(tuple(self.cids[node]), profiles, count, same_gpu)

    def fit(self, node: int, shape: Shape) -> tuple[int, Steps] | None:
        """Cost and devices of the request on `node` as it is now (None: it does not fit)."""
        cids = tuple(self.cids[node])
        return self.evaluator.evaluate(cids, shape.profiles, shape.count, shape.same_gpu)

    def apply(self, node: int, steps: Steps) -> None:
        """Add the devices `steps` to `node`."""
        self.classes.advance(self.cids[node], steps)
        self.touch(node)

    def reset(self, node: int, cids: list[int]) -> None:
        """Give `node` the GPU classes `cids`."""
        self.cids[node] = cids
        self.touch(node)

    # --- the profile heaps ----------------------------------------------------------------

    def _node_best(self, node: int, profile: str) -> int | None:
        best: int | None = None
        for cid in self.cids[node]:
            option = self.classes.best(cid, profile)
            if option is not None and (best is None or option.cost < best):
                best = option.cost
        return best

    def _heap(self, profile: str) -> list[tuple[int, int, int]]:
        heap = self.heaps.get(profile)
        if heap is None:
            heap = []
            for node in range(len(self.cids)):
                cost = self._node_best(node, profile)
                if cost is not None:
                    heap.append((cost, node, self.version[node]))
            heapq.heapify(heap)
            self.heaps[profile] = heap
        return heap

    def _top(self, profile: str) -> tuple[int, int, int] | None:
        heap = self._heap(profile)
        while heap and heap[0][2] != self.version[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def touch(self, node: int) -> None:
        """Invalidate the node's heap entries and push fresh ones to the profile heaps (the
        shape heaps read `changes` when they are next used)."""
        self.version[node] += 1
        self.changes.append(node)
        for profile in self.heaps:
            cost = self._node_best(node, profile)
            if cost is not None:
                heapq.heappush(self.heaps[profile], (cost, node, self.version[node]))

    # --- requests -------------------------------------------------------------------------

    def scope(self, nodes: frozenset[str]) -> list[int]:
        """Indices of the snapshot nodes in `nodes`, ascending (names not in it are ignored)."""
        scope = self.scopes.get(nodes)
        if scope is None:
            index = self.positions
            scope = self.scopes[nodes] = sorted(index[n] for n in nodes if n in index)
        return scope

    def _scan(self, shape: Shape) -> Found | None:
        """Every node of the request's set, each evaluated in full (exact)."""
        assert shape.nodes is not None
        best: Found | None = None
        for node in self.scope(shape.nodes):
            found = self.fit(node, shape)
            if found is not None and (best is None or (found[0], node) < best[:2]):
                best = (found[0], node, found[1])
        return best

    def _single(self, shape: Shape) -> Found | None:
        best: tuple[int, int] | None = None
        for rank, profile in enumerate(shape.profiles):
            top = self._top(profile)
            if top is not None:
                cand = (top[0] + (rank << RANK), top[1])
                if best is None or cand < best:
                    best = cand
        return self._found(shape, best)

    def _found(self, shape: Shape, best: tuple[int, int] | None) -> Found | None:
        """The single device on node `best[1]` that a heap walk chose (None: no node)."""
        if best is None:
            return None
        found = self.evaluate(best[1], shape.profiles, 1)
        if found is None:  # cannot happen: the heap entry is fresh
            return None
        return (found[0], best[1], found[1])

    def _single_in(self, shape: Shape) -> Found | None:
        """A single device on a node of the request's set: the profiles' heaps walked past
        nodes outside the set (exact, as the scan: the same (cost, node) order).

        When the set is small or its nodes lie deeper than _PASSED entries, the shape's own
        heap answers.
        """
        inside = shape.nodes
        assert inside is not None
        if len(self.scope(inside)) <= _PASSED:
            return self._by_shape(shape)
        names = self.names
        passed: list[tuple[str, tuple[int, int, int]]] = []
        best: tuple[int, int] | None = None
        deep = False
        for rank, profile in enumerate(shape.profiles):
            heap = self._heap(profile)
            top = self._top(profile)
            while top is not None and names[top[1]] not in inside:
                if len(passed) == _PASSED:
                    deep = True
                    break
                passed.append((profile, heapq.heappop(heap)))
                top = self._top(profile)
            if deep:
                break
            if top is not None:
                cand = (top[0] + (rank << RANK), top[1])
                if best is None or cand < best:
                    best = cand
        for profile, entry in passed:
            heapq.heappush(self.heaps[profile], entry)
        if deep:
            return self._by_shape(shape)
        return self._found(shape, best)

    def _by_shape(self, shape: Shape) -> Found | None:
        """The cheapest node from the shape's own heap of full costs (exact, as the scan).

        The heap is built on the shape's first request from every node it may use, and
        before each read takes in the nodes changed since the last one, so a shape costs
        one scan plus one evaluation per node that changed between its requests.
        """
        key = (shape.profiles, shape.count, shape.same_gpu, shape.nodes)
        heap = self.shape_heaps.get(key)
        if heap is None:
            scope: Sequence[int] = range(len(self.cids))
            if shape.nodes is not None:
                scope = self.scope(shape.nodes)
            heap = self.shape_heaps[key] = _Heap([], len(self.changes))
            for node in scope:
                found = self.fit(node, shape)
                if found is not None:
                    heap.entries.append((found[0], node, self.version[node]))
            heapq.heapify(heap.entries)
        elif heap.read < len(self.changes):
            changed = set(self.changes[heap.read :])
            heap.read = len(self.changes)
            inside = shape.nodes
            for node in sorted(changed):
                if inside is not None and self.names[node] not in inside:
                    continue
                found = self.fit(node, shape)
                if found is not None:
                    heapq.heappush(heap.entries, (found[0], node, self.version[node]))
        entries = heap.entries
        while entries and entries[0][2] != self.version[entries[0][1]]:
            heapq.heappop(entries)
        if not entries:
            return None
        cost, node, _ = entries[0]
        found = self.fit(node, shape)
        if found is None:  # cannot happen: the entry is fresh
            return None
        return (cost, node, found[1])
