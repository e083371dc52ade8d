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
A request with `same_gpu` gets all its devices on one GPU.

How the work is divided (each a module of `migpart.planning`):

- `greedy`: every problem is planned greedily, one request at a time to the node where it
  costs least: `cost` is the cost vector, `classes` the GPU states that equal GPUs share,
  `evaluate` a request's cost on a node, `index` the heaps that find the cheapest node without
  a scan, `repair` the pass that re-packs a node for a request left out, `spares` what comes
  last. A node set that holds every node of the snapshot is no restriction, and `plan` drops
  it. Measured by `bench/planner.py` on one core of a shared machine: 1,000 nodes x 8 GPUs with
  2,000 trace-shaped requests in about 0.25 s; the operator's shape (that cluster as two
  policies of 500 nodes, one `plan()` each, every request restricted to its policy's nodes)
  in about 0.3 s for both.
- Problems up to 20,000 GPUs x requests run the greedy in four request orders.
- Small problems (up to 64 GPUs and 64 requests) are then improved by `search`, a local search
  in which every node is packed exactly by `packing` (a dynamic program over the node's GPUs
  and their reachable layouts, `targets`, served by `transport`), with the packings cached by
  `packer`. It is bounded by a count of packing steps, so it stays deterministic and takes at
  most about a second on one core.

The best plan by the objective wins. Planning allocates many objects that live until it
returns; Python's cyclic collector is paused meanwhile, since its full passes over the process
heap cost as much as the plan.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from migpart.planning.bounds import search_cannot_improve
from migpart.planning.classes import GpuClasses
from migpart.planning.greedy import Greedy
from migpart.planning.model import Plan, PolicyView, Request, Snapshot
from migpart.planning.packer import Packer
from migpart.planning.search import NodeSearch

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


def plan(
    snapshot: Snapshot,
    requests: Iterable[Request],
    policy: PolicyView | None = None,
) -> Plan:
    """Target layouts for every GPU of `snapshot` and the devices each satisfied request gets.

    Pure and deterministic; see the module docstring for the objective and the method.
    """
    with collector_paused():
        return _plan(snapshot, _scoped(snapshot, requests), policy or PolicyView())


@contextmanager
def collector_paused() -> Iterator[None]:
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
    classes = GpuClasses(policy)
    greedy = Greedy(snapshot, requests, policy, classes)
    best = greedy.run()
    gpus = sum(len(n.gpus) for n in snapshot.nodes)
    if gpus * max(len(requests), 1) > _RESTART_SIZE:
        return best
    # Small problems can afford the other request orders; the best plan by the objective wins.
    weights = _priority_weights(requests)
    best_key = _plan_key(best, requests, weights)
    best_start = (greedy, 0)
    for strategy in range(1, _STRATEGIES):
        other = Greedy(snapshot, requests, policy, classes)
        candidate = other.run(strategy)
        key = _plan_key(candidate, requests, weights)
        if key < best_key:
            best, best_key, best_start = candidate, key, (other, strategy)
    if gpus > _SEARCH_GPUS or len(requests) > _SEARCH_REQUESTS:
        return best
    if search_cannot_improve(snapshot, requests, best):
        return best
    # ...and the local search over exactly packed nodes: from the best greedy plan, then from
    # scratch in each request order.
    packer = Packer(snapshot, requests, policy)
    start, strategy = best_start
    seed = {i: node for i, (node, _) in start.assigned.items()}
    found = NodeSearch(packer).run(start.order(strategy), _SEARCH_STEPS, seed)
    for strategy in range(_STRATEGIES):
        solution = NodeSearch(packer).run(start.order(strategy), _RESTART_STEPS)
        if solution.key < found.key:
            found = solution
    candidate = Greedy(snapshot, requests, policy, classes).adopt(found, packer)
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
