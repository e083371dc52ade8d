"""The planner: which MIG layout each GPU should have so that pending requests get devices.

`plan(snapshot, requests, policy)` is pure and deterministic (no I/O, no clock, no randomness):
the operator calls it on every reconcile and `migpart plan` calls it offline, and both must
agree.

Objective, lexicographic:

1. satisfy requests, higher priority strictly first (one request of priority 2 outweighs any
   number of priority 1), then as many requests as possible within a priority;
2. destroy as few free instances as possible, then change as few GPUs as possible, then create
   as few instances as possible (an existing free instance of a wanted profile is reused before
   anything is created);
3. keep free space in large blocks (best fit: the placement that loses the least of the GPU's
   remaining capacity wins), honouring the request's profile preference order on ties.

Used instances are never moved, destroyed or handed out. Profiles that the policy does not
permit are never created; an existing free instance of such a profile may still be assigned,
because it is already published in the ResourceSlice and the scheduler could allocate it anyway.

How it stays fast. The operator restricts every request to the nodes of its policy, and some
further to the nodes a pod's selector allows, so restricted requests must be as fast as the
rest. Measured by `bench/planner.py` on one core of a shared machine: 1,000 nodes x 8 GPUs
with 2,000 trace-shaped requests in about 0.25 s; the operator's shape (that cluster as two
policies of 500 nodes, one `plan()` each, every request restricted, a fifth to half the
policy's nodes, 30 % multi-device or same-GPU) in about 0.3 s for both, where scanning each
restricted request's nodes took about 3 s before (0.65 s with today's evaluation of a node),
for the same plans.

- GPUs in the same state (model table, pinned instances, remaining free instances, changed or
  not) share one interned *class*; the best way to add one device of a profile to a class is
  computed once and cached, together with the class it leads to, and so is the *chain* of
  devices added one cheapest at a time. Pinned means used or already assigned by this plan.
  Evaluating a request on a node merges its GPUs' chains, and one evaluation serves every
  count of the same profiles.
- A node set that holds every node of the snapshot is no restriction, and `plan` drops it.
- Every profile that requests ask for has a heap of nodes keyed by the cheapest single device of
  that profile the node can offer. A node that changes pushes fresh entries (stale ones are
  dropped when they surface), so single-device requests take O(log nodes). Restricted ones
  walk the same heaps past the nodes outside their set.
- Every other shape of request (profiles, count, same GPU, node set) has a heap of its own,
  keyed by its full cost on each node of its set: built by its first request, and refreshed
  before each later one with the nodes changed since (a log of changed nodes), so a shape
  costs one pass over its nodes plus one evaluation per node changed between its requests.
  A restricted single-device request whose set is small, or lies deep in the profile heaps,
  uses one too. Every choice is exact: the node a scan of every node would choose.
- Capacity only shrinks while planning, so a request shape that found no node is remembered and
  later requests of the same shape that are at least as large fail in O(1).
- Planning allocates many objects that live until it returns; Python's cyclic collector is
  paused meanwhile, since its full passes over the process heap cost as much as the plan.

Requests are placed greedily: priority descending, then smallest (compute slices x count) first,
which maximises the number of satisfied requests for a given capacity; each goes to the node
whose cost vector (destroyed, GPUs newly changed, created, preference rank, capacity lost) is
smallest, the first such node on ties. After every request has been tried, a repair pass retries
each unsatisfied request with an exact per-node search that may re-place the free (not used)
part of the node's assignments made by this plan. Spares come last: free instances of the spare
profile are counted, and missing ones are created in free space only (nothing is destroyed for a
spare), on GPUs that are already changing first. A request with `same_gpu` gets all its devices
on one GPU (the cheapest GPU of the node that can hold them all).

Small problems (up to 64 GPUs and 64 requests) get more than the greedy: the greedy runs in
four request orders, and then `migpart.planning.search` improves the best greedy plan (and
plans from scratch in each order) with a local search in which every node is packed exactly by
`migpart.planning.packing` (a dynamic program over the node's GPUs and their reachable
layouts). That search is bounded by a count of packing steps, so it stays deterministic and
takes at most about a second on one core; the best plan by the objective wins.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from migpart.mig import Instance, ModelTable, layout_problems
from migpart.planning.model import (
    Assignment,
    DeviceRef,
    GpuPlan,
    InstanceState,
    Plan,
    PlanStats,
    PolicyView,
    Request,
    Snapshot,
)
from migpart.planning.packing import free_capacity
from migpart.planning.search import NodeSearch, Packer, Solution

# A cost is one int holding five unsigned fields of 24 bits each, so that costs add and
# compare as vectors in lexicographic order: destroyed, GPUs newly changed, created,
# preference rank, capacity lost.
_FIELD = 24
# Re-pack attempts of the repair pass (a count, not a clock, so plans stay deterministic).
_REPAIR_TRIALS = 500
# Problems up to this many GPUs x requests are also planned with the other request orders.
_RESTART_SIZE = 20_000
_STRATEGIES = 4
# Problems up to this size are also planned by the local search over exactly packed nodes:
# from the best greedy plan with up to _SEARCH_STEPS packing steps, then from scratch in each
# request order with up to _RESTART_STEPS each (a step is about a microsecond).
_SEARCH_GPUS = 64
_SEARCH_REQUESTS = 64
_SEARCH_STEPS = 400_000
_RESTART_STEPS = 100_000
# A single-device request restricted to a node set passes over at most this many heap entries
# of other nodes before it builds a heap of its own.
_PASSED = 32
_DESTROYED = 4 * _FIELD
_CHANGED = 3 * _FIELD
_CREATED = 2 * _FIELD
_RANK = _FIELD


def _cost(destroyed: int, changed: int, created: int, rank: int, lost: int) -> int:
    return (
        (destroyed << _DESTROYED)
        | (changed << _CHANGED)
        | (created << _CREATED)
        | (rank << _RANK)
        | lost
    )


@dataclass(frozen=True, slots=True)
class _Option:
    """The cheapest way to add one device of a profile to a GPU class."""

    cost: int
    instance: Instance
    to_class: int


# One device added to a GPU: cost with the preference rank, the instance, the class after,
# and the cost of the chain up to and including it.
_Link = tuple[int, Instance, int, int]


@dataclass(slots=True)
class _Chain:
    links: list[_Link]
    ended: bool  # no further device fits


class _Classes:
    """Interned GPU states and their cached options. Ids index the parallel lists."""

    def __init__(self, policy: PolicyView) -> None:
        self.policy = policy
        self.ids: dict[tuple[ModelTable, frozenset[Instance], frozenset[Instance], bool], int] = {}
        self.table: list[ModelTable] = []
        self.pinned: list[frozenset[Instance]] = []
        self.free: list[frozenset[Instance]] = []
        self.changed: list[bool] = []
        self._best: dict[tuple[int, str], _Option | None] = {}
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

    def capacity(self, table: ModelTable, pinned: frozenset[Instance]) -> int:
        """How much the non-pinned space can still host, weighted by compute slices.

        For every profile (media-extension variants aside) the most instances that fit beside
        the pinned ones, ignoring the other profiles; greedy earliest placement is optimal for
        equal-length ranges. Best fit keeps this as high as possible.
        """
        key = (table, pinned)
        cached = self._capacity.get(key)
        if cached is None:
            cached = self._capacity[key] = free_capacity(table, pinned)
        return cached

    def room(self, cid: int, profile: str) -> int:
        """An upper bound of the devices of `profile` this class can still provide."""
        key = (cid, profile)
        cached = self._room.get(key)
        if cached is not None:
            return cached
        table = self.table[cid]
        result = 0
        if table.has(profile):
            prof = table.profile(profile)
            pinned = self.pinned[cid]
            reusable = sum(1 for f in self.free[cid] if f.profile == profile)
            if self.policy.permits(profile):
                mask = 0
                compute = 0
                count = 0
                for inst in pinned:
                    p = table.profile(inst.profile)
                    mask |= p.mask(inst.start)
                    compute += p.compute_slices
                    count += inst.profile == profile
                fit = 0
                limit = min(
                    prof.max_instances - count,
                    (table.compute_slices - compute) // prof.compute_slices,
                )
                for start in prof.placements:
                    m = prof.mask(start)
                    if fit < limit and not mask & m:
                        mask |= m
                        fit += 1
                result = max(fit, reusable)
            else:
                result = reusable
        self._room[key] = result
        return result

    def chain(self, cid: int, profiles: tuple[str, ...], length: int) -> list[_Link]:
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
            link: _Link | None = None
            for rank, profile in enumerate(profiles):
                option = self.best(current, profile)
                if option is not None:
                    cost = option.cost + (rank << _RANK)
                    if link is None or cost < link[0]:
                        link = (cost, option.instance, option.to_class, before + cost)
            if link is None:
                chain.ended = True
            else:
                links.append(link)
        return links

    def best(self, cid: int, profile: str) -> _Option | None:
        """The cheapest single device of `profile` on class `cid` (None: impossible)."""
        key = (cid, profile)
        if key in self._best:
            return self._best[key]
        option = self._compute_best(cid, profile)
        self._best[key] = option
        return option

    def best_create(self, cid: int, profile: str) -> _Option | None:
        """The cheapest new instance of `profile` on class `cid`, never a reuse (for spares)."""
        return self._compute_best(cid, profile, reuse=False)

    def _compute_best(self, cid: int, profile: str, reuse: bool = True) -> _Option | None:
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
            cost = _cost(0, 0, 0, 0, before - self.capacity(table, new_pinned))
            cand = (cost, inst.start, inst, new_pinned, free - {inst}, changed)
            if best is None or cand[:2] < best[:2]:
                best = cand
        if best is not None or not self.policy.permits(profile):
            # Reusing is always preferred to creating (created is a cost field above lost).
            return self._finish(table, best)
        mask = 0
        compute = 0
        count = 0
        for inst in pinned:
            p = table.profile(inst.profile)
            mask |= p.mask(inst.start)
            compute += p.compute_slices
            count += inst.profile == profile
        if count + 1 > prof.max_instances or compute + prof.compute_slices > table.compute_slices:
            return None
        for start in prof.placements:
            m = prof.mask(start)
            if mask & m:
                continue
            victims = [f for f in free if table.profile(f.profile).mask(f.start) & m]
            rest = sorted(
                (f for f in free if not table.profile(f.profile).mask(f.start) & m),
                key=lambda f: (-table.profile(f.profile).compute_slices, -f.start),
            )
            total = compute + prof.compute_slices
            total += sum(table.profile(f.profile).compute_slices for f in rest)
            same = count + 1 + sum(1 for f in rest if f.profile == profile)
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
            cost = _cost(
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
    ) -> _Option | None:
        if best is None:
            return None
        cost, _, inst, new_pinned, new_free, changed = best
        return _Option(cost, inst, self.intern(table, new_pinned, new_free, changed))


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a request needs, without its name: the cache and memo key."""

    profiles: tuple[str, ...]
    count: int
    nodes: frozenset[str] | None
    same_gpu: bool = False


_Steps = tuple[tuple[int, Instance], ...]
# A placement: cost, node index, devices.
_Found = tuple[int, int, _Steps]


@dataclass(slots=True)
class _Prefixes:
    """A node's cheapest k devices of some profiles, for k = 1, 2, ...: `found[k - 1]`."""

    found: list[tuple[int, _Steps]]
    ended: bool  # no further device fits


@dataclass(slots=True)
class _Heap:
    """(cost, node, node version) entries, and how much of the change log they reflect."""

    entries: list[tuple[int, int, int]]
    read: int


class _Planner:
    def __init__(
        self,
        snapshot: Snapshot,
        requests: Sequence[Request],
        policy: PolicyView,
        classes: _Classes | None = None,
        scan: bool = False,
    ) -> None:
        """`scan`: requests restricted to a node set evaluate every node of the set on every
        placement instead of keeping a heap, as the planner did before; the same plans,
        slower (for tests and the benchmark's baseline)."""
        self.snapshot = snapshot
        self.requests = list(requests)
        self.policy = policy
        self.classes = classes or _Classes(policy)
        self.node_names = [n.name for n in snapshot.nodes]
        self.node_index = {name: i for i, name in enumerate(self.node_names)}
        self.node_cids: list[list[int]] = []
        self.original: list[list[frozenset[Instance]]] = []
        # GPUs of one model with the same instances share a class: (model, instances) ->
        # (class, layout), so that a cluster of a few layouts is read in one lookup per GPU.
        seen: dict[tuple[str, tuple[InstanceState, ...]], tuple[int, frozenset[Instance]]] = {}
        for node in snapshot.nodes:
            cids = []
            originals = []
            for gpu in node.gpus:
                known = seen.get((gpu.model, gpu.instances))
                if known is None:
                    table = snapshot.table(gpu.model)
                    used = frozenset(i.geometry for i in gpu.instances if i.used)
                    free = frozenset(i.geometry for i in gpu.instances if not i.used)
                    known = (self.classes.intern(table, used, free, False), used | free)
                    seen[(gpu.model, gpu.instances)] = known
                cids.append(known[0])
                originals.append(known[1])
            self.node_cids.append(cids)
            self.original.append(originals)
        self.version = [0] * len(self.node_cids)
        self.scan = scan
        # node set -> indices of its snapshot nodes, ascending
        self.scopes: dict[frozenset[str], list[int]] = {}
        # Nodes in the order they changed, read by the shape heaps to refresh themselves.
        self.changes: list[int] = []
        self.shape_heaps: dict[tuple[tuple[str, ...], int, bool, frozenset[str] | None], _Heap]
        self.shape_heaps = {}
        self.heaps: dict[str, list[tuple[int, int, int]]] = {}
        self.failed: dict[tuple[tuple[str, ...], frozenset[str] | None, bool], int] = {}
        self.eval_cache: dict[tuple[tuple[int, ...], tuple[str, ...], bool], _Prefixes] = {}
        # The most devices any request of (profiles, same GPU) asks for: evaluations go that
        # deep at once, so that one serves all the counts of its profiles.
        self.depth: dict[tuple[tuple[str, ...], bool], int] = {}
        for request in self.requests:
            key = (tuple(dict.fromkeys(request.profiles)), request.same_gpu)
            self.depth[key] = max(self.depth.get(key, 0), request.count)
        # request index -> (node, ((gpu position, instance), ...))
        self.assigned: dict[int, tuple[int, _Steps]] = {}
        self.on_node: list[list[int]] = [[] for _ in self.node_cids]
        self.start_cids = [tuple(cids) for cids in self.node_cids]
        self.budget = _REPAIR_TRIALS
        self.start_room: dict[tuple[str, ...], list[int]] = {}

    # --- node level ---------------------------------------------------------------------

    def _node_best(self, node: int, profile: str) -> int | None:
        best: int | None = None
        for cid in self.node_cids[node]:
            option = self.classes.best(cid, profile)
            if option is not None and (best is None or option.cost < best):
                best = option.cost
        return best

    def _heap(self, profile: str) -> list[tuple[int, int, int]]:
        heap = self.heaps.get(profile)
        if heap is None:
            heap = []
            for node in range(len(self.node_cids)):
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

    def _evaluate(
        self, node: int, profiles: tuple[str, ...], count: int, same_gpu: bool = False
    ) -> tuple[int, _Steps] | None:
        """Cost and devices of `count` devices on `node`, added one cheapest device at a time
        (all on one GPU with `same_gpu`)."""
        return self._evaluate_on(tuple(self.node_cids[node]), profiles, count, same_gpu)

    def _evaluate_on(
        self, cids: tuple[int, ...], profiles: tuple[str, ...], count: int, same_gpu: bool = False
    ) -> tuple[int, _Steps] | None:
        key = (cids, profiles, same_gpu)
        known = self.eval_cache.get(key)
        if known is None or (len(known.found) < count and not known.ended):
            depth = max(count, self.depth.get((profiles, same_gpu), 0))
            known = self.eval_cache[key] = self._prefixes(cids, profiles, depth, same_gpu)
        return known.found[count - 1] if count <= len(known.found) else None

    def _prefixes(
        self, cids: tuple[int, ...], profiles: tuple[str, ...], count: int, same_gpu: bool
    ) -> _Prefixes:
        """The cheapest 1, 2, ... `count` devices on GPUs in classes `cids`.

        Devices are added one cheapest at a time, so the cheapest k devices are the first k
        of the cheapest `count`: one evaluation serves every count of the shape.
        """
        chains = [self.classes.chain(cid, profiles, count) for cid in cids]
        found: list[tuple[int, _Steps]] = []
        if same_gpu:
            # For each count, the cheapest GPU that can hold every device by itself.
            for k in range(count):
                best_pos = -1
                best_cost = 0
                for pos, links in enumerate(chains):
                    if k < len(links) and (best_pos < 0 or links[k][3] < best_cost):
                        best_pos = pos
                        best_cost = links[k][3]
                if best_pos < 0:
                    return _Prefixes(found, True)
                links = chains[best_pos][: k + 1]
                found.append((best_cost, tuple([(best_pos, link[1]) for link in links])))
            return _Prefixes(found, False)
        # The node's cheapest device, again and again: its GPUs' chains merged.
        taken = [0] * len(cids)
        total = 0
        steps: list[tuple[int, Instance]] = []
        for _ in range(count):
            best_pos = -1
            best_cost = 0
            for pos, links in enumerate(chains):
                j = taken[pos]
                if j < len(links) and (best_pos < 0 or links[j][0] < best_cost):
                    best_pos = pos
                    best_cost = links[j][0]
            if best_pos < 0:
                return _Prefixes(found, True)
            total += best_cost
            steps.append((best_pos, chains[best_pos][taken[best_pos]][1]))
            taken[best_pos] += 1
            found.append((total, tuple(steps)))
        return _Prefixes(found, False)

    def _fit(self, node: int, shape: _Shape) -> tuple[int, _Steps] | None:
        """Cost and devices of the request on `node` as it is now (None: it does not fit)."""
        cids = tuple(self.node_cids[node])
        return self._evaluate_on(cids, shape.profiles, shape.count, shape.same_gpu)

    def _step(self, cids: list[int], steps: _Steps) -> None:
        for pos, inst in steps:
            option = self.classes.best(cids[pos], inst.profile)
            if option is None or option.instance != inst:
                # Steps come from _evaluate on this exact state, so the cached option matches.
                raise AssertionError("planner state out of sync")
            cids[pos] = option.to_class

    def _apply(self, node: int, steps: _Steps) -> None:
        self._step(self.node_cids[node], steps)
        self._touch(node)

    def _touch(self, node: int) -> None:
        """Invalidate the node's heap entries and push fresh ones to the profile heaps (the
        shape heaps read `changes` when they are next used)."""
        self.version[node] += 1
        self.changes.append(node)
        for profile in self.heaps:
            cost = self._node_best(node, profile)
            if cost is not None:
                heapq.heappush(self.heaps[profile], (cost, node, self.version[node]))

    # --- request level ------------------------------------------------------------------

    def _scope(self, nodes: frozenset[str]) -> list[int]:
        """Indices of the snapshot nodes in `nodes`, ascending (names not in it are ignored)."""
        scope = self.scopes.get(nodes)
        if scope is None:
            index = self.node_index
            scope = self.scopes[nodes] = sorted(index[n] for n in nodes if n in index)
        return scope

    def _candidates_scan(self, shape: _Shape) -> _Found | None:
        """Every node of the request's set, each evaluated in full (exact)."""
        assert shape.nodes is not None
        best: _Found | None = None
        for node in self._scope(shape.nodes):
            found = self._fit(node, shape)
            if found is not None and (best is None or (found[0], node) < best[:2]):
                best = (found[0], node, found[1])
        return best

    def _candidates_single(self, shape: _Shape) -> _Found | None:
        best: tuple[int, int] | None = None
        for rank, profile in enumerate(shape.profiles):
            top = self._top(profile)
            if top is not None:
                cand = (top[0] + (rank << _RANK), top[1])
                if best is None or cand < best:
                    best = cand
        if best is None:
            return None
        found = self._evaluate(best[1], shape.profiles, 1)
        if found is None:  # cannot happen: the heap entry is fresh
            return None
        return (found[0], best[1], found[1])

    def _candidates_single_in(self, shape: _Shape) -> _Found | None:
        """A single device on a node of the request's set: the profiles' heaps walked past
        nodes outside the set (exact, as the scan: the same (cost, node) order).

        When the set is small or its nodes lie deeper than _PASSED entries, the shape's own
        heap answers.
        """
        inside = shape.nodes
        assert inside is not None
        if len(self._scope(inside)) <= _PASSED:
            return self._candidates_shape(shape)
        names = self.node_names
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
                cand = (top[0] + (rank << _RANK), top[1])
                if best is None or cand < best:
                    best = cand
        for profile, entry in passed:
            heapq.heappush(self.heaps[profile], entry)
        if deep:
            return self._candidates_shape(shape)
        if best is None:
            return None
        found = self._evaluate(best[1], shape.profiles, 1)
        if found is None:  # cannot happen: the heap entry is fresh
            return None
        return (found[0], best[1], found[1])

    def _candidates_shape(self, shape: _Shape) -> _Found | None:
        """The cheapest node from the shape's own heap of full costs (exact, as the scan).

        The heap is built on the shape's first request from every node it may use, and
        before each read takes in the nodes changed since the last one, so a shape costs
        one scan plus one evaluation per node that changed between its requests.
        """
        key = (shape.profiles, shape.count, shape.same_gpu, shape.nodes)
        heap = self.shape_heaps.get(key)
        if heap is None:
            scope: Sequence[int] = range(len(self.node_cids))
            if shape.nodes is not None:
                scope = self._scope(shape.nodes)
            heap = self.shape_heaps[key] = _Heap([], len(self.changes))
            for node in scope:
                found = self._fit(node, shape)
                if found is not None:
                    heap.entries.append((found[0], node, self.version[node]))
            heapq.heapify(heap.entries)
        elif heap.read < len(self.changes):
            changed = set(self.changes[heap.read :])
            heap.read = len(self.changes)
            inside = shape.nodes
            for node in sorted(changed):
                if inside is not None and self.node_names[node] not in inside:
                    continue
                found = self._fit(node, shape)
                if found is not None:
                    heapq.heappush(heap.entries, (found[0], node, self.version[node]))
        entries = heap.entries
        while entries and entries[0][2] != self.version[entries[0][1]]:
            heapq.heappop(entries)
        if not entries:
            return None
        cost, node, _ = entries[0]
        found = self._fit(node, shape)
        if found is None:  # cannot happen: the entry is fresh
            return None
        return (cost, node, found[1])

    def _place(self, request: Request, memo: bool = True) -> tuple[int, _Steps] | None:
        profiles = tuple(dict.fromkeys(request.profiles))
        same_gpu = request.same_gpu and request.count > 1
        shape = _Shape(profiles, request.count, request.nodes, same_gpu)
        memo_key = (profiles, request.nodes, same_gpu)
        failed_at = self.failed.get(memo_key)
        if memo and failed_at is not None and request.count >= failed_at:
            return None
        if request.nodes is not None and self.scan:
            found = self._candidates_scan(shape)
        elif request.count == 1:
            if request.nodes is None:
                found = self._candidates_single(shape)
            else:
                found = self._candidates_single_in(shape)
        else:
            found = self._candidates_shape(shape)
        if found is None:
            if memo:
                self.failed[memo_key] = min(request.count, failed_at or request.count)
            return None
        _, node, steps = found
        self._apply(node, steps)
        return node, steps

    def _order(self, strategy: int = 0) -> list[int]:
        """Priority descending, then (strategy 0) smallest demand first, then input order.

        Other strategies keep the priority order and change the order within a priority:
        1 most devices then largest first, 2 largest first, 3 input order.
        """
        smallest: dict[str, tuple[int, int]] = {}
        models = {g.model for n in self.snapshot.nodes for g in n.gpus}
        for table in {self.snapshot.table(model) for model in models}:
            for prof in table.profiles:
                size = (prof.compute_slices, prof.memory_slices)
                smallest[prof.name] = min(smallest.get(prof.name, size), size)

        def key(i: int) -> tuple[int, int, int, int, int]:
            r = self.requests[i]
            sizes = [smallest[p] for p in r.profiles if p in smallest]
            compute, memory = min(sizes) if sizes else (0, 0)
            if strategy == 1:
                return (-r.priority, -r.count, -compute, -memory, i)
            if strategy == 2:
                return (-r.priority, -r.count * compute, -r.count * memory, -r.count, i)
            if strategy == 3:
                return (-r.priority, 0, 0, 0, i)
            return (-r.priority, r.count * compute, r.count * memory, r.count, i)

        return sorted(range(len(self.requests)), key=key)

    def run(self, strategy: int = 0) -> Plan:
        order = self._order(strategy)
        # Each priority level is placed and repaired before the next one starts, so that a
        # lower priority can never cost a higher one anything.
        levels: list[list[int]] = []
        for i in order:
            if levels and self.requests[levels[-1][0]].priority == self.requests[i].priority:
                levels[-1].append(i)
            else:
                levels.append([i])
        for level in levels:
            for i in level:
                request = self.requests[i]
                if request.count <= 0 or not request.profiles:
                    continue
                placed = self._place(request)
                if placed is not None:
                    self.assigned[i] = placed
                    self.on_node[placed[0]].append(i)
            self._repair(level)
        self._spares()
        return self._result()

    # --- repair -------------------------------------------------------------------------

    def _repair(self, order: list[int]) -> None:
        """Retry each unsatisfied request by re-packing one node with it placed first.

        The node goes back to its snapshot state (used instances only pinned), the request is
        placed, then the node's earlier requests are placed again in their order; any that no
        longer fit there are placed elsewhere. The move is kept only when every request that
        was satisfied still is, so satisfaction strictly improves. Trials are bounded by a
        count (not a clock) so that the result stays deterministic and the cost bounded.
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
                scope: Sequence[int] = range(len(self.node_cids))
                if request.nodes is not None:
                    scope = self._scope(request.nodes)
                rooms = self._start_rooms(profiles)
                nodes = candidates[key] = [n for n in scope if rooms[n] >= request.count]
            for node in nodes:
                if self.budget <= 0:
                    return
                self.budget -= 1
                if self._repack(i, node, profiles):
                    break

    def _start_rooms(self, profiles: tuple[str, ...]) -> list[int]:
        """Per node, an upper bound of the devices of `profiles` its snapshot state holds."""
        rooms = self.start_room.get(profiles)
        if rooms is None:
            room = self.classes.room
            rooms = self.start_room[profiles] = [
                sum(room(cid, p) for cid in cids for p in profiles) for cids in self.start_cids
            ]
        return rooms

    def _repack(self, first: int, node: int, profiles: tuple[str, ...]) -> bool:
        saved = list(self.node_cids[node])
        state = list(self.start_cids[node])
        request = self.requests[first]
        found = self._evaluate_on(tuple(state), profiles, request.count, request.same_gpu)
        if found is None:
            return False
        self._step(state, found[1])
        kept: list[tuple[int, _Steps]] = [(first, found[1])]
        displaced: list[int] = []
        for i in self.on_node[node]:
            other = self.requests[i]
            again = self._evaluate_on(
                tuple(state), tuple(dict.fromkeys(other.profiles)), other.count, other.same_gpu
            )
            if again is None:
                displaced.append(i)
            else:
                self._step(state, again[1])
                kept.append((i, again[1]))
        if len(displaced) > 1:
            return False  # moving one request elsewhere is enough for a repair step
        self.node_cids[node] = state
        self._touch(node)
        moved: list[tuple[int, tuple[int, _Steps]]] = []
        for i in displaced:
            target = self._place(self.requests[i], memo=False)
            if target is None:
                self.node_cids[node] = saved
                self._touch(node)
                return False
            moved.append((i, target))
        self.on_node[node] = [i for i, _ in kept]
        for i, steps in kept:
            self.assigned[i] = (node, steps)
        for i, target in moved:
            self.assigned[i] = target
            self.on_node[target[0]].append(i)
        return True

    # --- exact search ---------------------------------------------------------------------

    def adopt(self, solution: Solution, packer: Packer) -> Plan:
        """The plan of a search solution: its layouts and devices, then spares."""
        cls = self.classes
        for node, packing in enumerate(solution.packings):
            if packing is None:
                continue
            members = solution.members[node]
            assigned: list[set[Instance]] = [set() for _ in packing.layouts]
            for i, devices in zip(members, packing.devices, strict=True):
                self.assigned[i] = (node, devices)
                for pos, inst in devices:
                    assigned[pos].add(inst)
            for pos, layout in enumerate(packing.layouts):
                space = packer.spaces[node][pos]
                pinned = space.used | assigned[pos]
                self.node_cids[node][pos] = cls.intern(
                    space.table, pinned, layout - pinned, layout != self.original[node][pos]
                )
            self.on_node[node] = list(members)
        self._spares()
        return self._result()

    # --- spares -------------------------------------------------------------------------

    def _spares(self) -> None:
        cls = self.classes
        for spare in self.policy.spares:
            if spare.count <= 0 or not self.policy.permits(spare.profile):
                continue
            have = sum(
                1
                for cids in self.node_cids
                for cid in cids
                for f in cls.free[cid]
                if f.profile == spare.profile
            )
            created: list[tuple[int, int, Instance]] = []
            while have < spare.count:
                best: tuple[int, int, int, _Option] | None = None
                for node, cids in enumerate(self.node_cids):
                    for pos, cid in enumerate(cids):
                        option = cls.best_create(cid, spare.profile)
                        if option is None or option.cost >> _DESTROYED:
                            continue
                        cand = (option.cost, node, pos, option)
                        if best is None or cand[:3] < best[:3]:
                            best = cand
                if best is None:
                    break
                _, node, pos, option = best
                # Pinned while more spares are placed (so the next one goes elsewhere)...
                self.node_cids[node][pos] = option.to_class
                created.append((node, pos, option.instance))
                have += 1
            # ...then released: a spare is a free instance.
            for node, pos, inst in created:
                cid = self.node_cids[node][pos]
                self.node_cids[node][pos] = cls.intern(
                    cls.table[cid], cls.pinned[cid] - {inst}, cls.free[cid] | {inst}, True
                )

    # --- output -------------------------------------------------------------------------

    def _result(self) -> Plan:
        cls = self.classes
        gpus: list[GpuPlan] = []
        destroyed = created = changed = 0
        for n, node in enumerate(self.snapshot.nodes):
            for pos, gpu in enumerate(node.gpus):
                cid = self.node_cids[n][pos]
                target = cls.pinned[cid] | cls.free[cid]
                original = self.original[n][pos]
                gone = original - target
                if gone:
                    target = _restore(cls.table[cid], target, gone)
                destroyed += len(original - target)
                created += len(target - original)
                changed += target != original
                gpus.append(GpuPlan(node.name, gpu.index, _by_start(target)))
        assignments: list[Assignment] = []
        unsatisfied: list[str] = []
        for i, request in enumerate(self.requests):
            placed = self.assigned.get(i)
            if placed is None:
                unsatisfied.append(request.name)
                continue
            node_pos, steps = placed
            gpu_states = self.snapshot.nodes[node_pos].gpus
            devices = tuple(
                DeviceRef(gpu_states[pos].index, inst.profile, inst.start) for pos, inst in steps
            )
            assignments.append(Assignment(request.name, self.node_names[node_pos], devices))
        return Plan(
            gpus=tuple(gpus),
            assignments=tuple(assignments),
            unsatisfied=tuple(unsatisfied),
            stats=PlanStats(destroyed=destroyed, created=created, gpus_changed=changed),
        )


def _restore(
    table: ModelTable, target: frozenset[Instance], destroyed: frozenset[Instance]
) -> frozenset[Instance]:
    """Keep destroyed free instances that still fit beside the target after all.

    A create may have destroyed a free instance for the compute budget or a later step may
    have freed room again; putting it back costs nothing and lowers the destroyed count.
    """
    for inst in sorted(destroyed, key=lambda i: (i.start, i.profile)):
        if not layout_problems(table, [*target, inst]):
            target = target | {inst}
    return target


def _by_start(instances: Iterable[Instance]) -> tuple[Instance, ...]:
    return tuple(sorted(instances, key=lambda i: (i.start, i.profile)))


def plan(
    snapshot: Snapshot,
    requests: Iterable[Request],
    policy: PolicyView | None = None,
) -> Plan:
    """Target layouts for every GPU of `snapshot` and the devices each satisfied request gets.

    Pure and deterministic; see the module docstring for the objective and the method.
    """
    with _collector_paused():
        return _plan(snapshot, _scoped(snapshot, requests), policy or PolicyView())


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block, then restore it as it was.

    Planning allocates many small objects that live until it returns, which set off the
    collector's full passes, each over the whole process heap: in the benchmark about half
    of a 1,000-node plan. The planner makes no reference cycles, so nothing is left waiting
    for the collector meanwhile, and it makes one pass after instead of several during.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _plan(snapshot: Snapshot, requests: tuple[Request, ...], policy: PolicyView) -> Plan:
    classes = _Classes(policy)
    greedy = _Planner(snapshot, requests, policy, classes)
    best = greedy.run()
    gpus = sum(len(n.gpus) for n in snapshot.nodes)
    if gpus * max(len(requests), 1) > _RESTART_SIZE:
        return best
    # Small problems can afford the other request orders; the best plan by the objective wins.
    weights = _priority_weights(requests)
    best_key = _plan_key(best, requests, weights)
    best_start = (greedy, 0)
    for strategy in range(1, _STRATEGIES):
        other = _Planner(snapshot, requests, policy, classes)
        candidate = other.run(strategy)
        key = _plan_key(candidate, requests, weights)
        if key < best_key:
            best, best_key, best_start = candidate, key, (other, strategy)
    if gpus > _SEARCH_GPUS or len(requests) > _SEARCH_REQUESTS:
        return best
    # ...and the local search over exactly packed nodes: from the best greedy plan, then from
    # scratch in each request order.
    packer = Packer(snapshot, requests, policy)
    start, strategy = best_start
    seed = {i: node for i, (node, _) in start.assigned.items()}
    found = NodeSearch(packer).run(start._order(strategy), _SEARCH_STEPS, seed)
    for strategy in range(_STRATEGIES):
        solution = NodeSearch(packer).run(start._order(strategy), _RESTART_STEPS)
        if solution.key < found.key:
            found = solution
    candidate = _Planner(snapshot, requests, policy, classes).adopt(found, packer)
    key = _plan_key(candidate, requests, weights)
    if key < best_key:
        best, best_key = candidate, key
    return best


def _scoped(snapshot: Snapshot, requests: Iterable[Request]) -> tuple[Request, ...]:
    """The requests with each node set cut to the snapshot's nodes, and dropped (None) where
    it holds them all, so that such requests take the unrestricted fast path.

    Equal sets become one object, which keeps the planner's per-set caches at one entry per
    set. Only `nodes` changes: names, and so the plan, stay as they were.
    """
    names = frozenset(n.name for n in snapshot.nodes)
    scoped: dict[frozenset[str], frozenset[str] | None] = {}
    result = []
    for request in requests:
        nodes = request.nodes
        if nodes is not None:
            if nodes not in scoped:
                inside = nodes & names
                scoped[nodes] = None if len(inside) == len(names) else inside
            request = replace(request, nodes=scoped[nodes])
        result.append(request)
    return tuple(result)


def _priority_weights(requests: Sequence[Request]) -> dict[int, int]:
    levels = sorted({r.priority for r in requests})
    return {p: -k for k, p in enumerate(reversed(levels))}


def _plan_key(
    result: Plan, requests: Sequence[Request], weights: dict[int, int]
) -> tuple[tuple[int, ...], int, int, int]:
    """Smaller is better: satisfied per priority (highest first, negated), then disruption."""
    satisfied = {a.request for a in result.assignments}
    per_level = [0] * len(weights)
    for r in requests:
        if r.name in satisfied:
            per_level[-weights[r.priority]] -= 1
    stats = result.stats
    return (tuple(per_level), stats.destroyed, stats.gpus_changed, stats.created)
