"""What every search over one problem shares: each node's GPUs, each request as each node
sees it, and the cache of exact node packings.

The local search (`migpart.planning.search`) asks one question again and again: the cheapest
packing of a set of requests on a node (`migpart.planning.packing.pack`). Nodes with the same
GPUs in the same state share a kind, and equal demands an id, so that a packing is computed
once per (node kind, demands) and looked up after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from migpart.planning.model import PolicyView, Request, Snapshot
from migpart.planning.packing import DeviceDemand, NodePacking, Work, pack
from migpart.planning.targets import GpuSpace, Memo

# What looking up a node packing costs in packing steps, cached or not (a step is a transition
# of the packer's dynamic program, about a microsecond).
_LOOKUP = 4

# A node's packing and its requests in the packing's demand order.
Packed = tuple[NodePacking, list[int]]


@dataclass(frozen=True, slots=True)
class Solution:
    """Every node's packing (None: untouched) and requests (in the packing's demand order),
    and the key to compare solutions by: satisfied per priority (negated), then total cost."""

    key: tuple[tuple[int, ...], int]
    packings: tuple[NodePacking | None, ...]
    members: tuple[tuple[int, ...], ...]


class Packer:
    """What every search over one problem shares: the nodes' GPUs, each request as each node
    sees it, the cache of node packings and the allowance of packing steps left."""

    def __init__(
        self,
        snapshot: Snapshot,
        requests: Sequence[Request],
        policy: PolicyView,
    ) -> None:
        self.policy = policy
        self.work = Work(0)
        self.memo = Memo()
        self.spaces: list[tuple[GpuSpace, ...]] = []
        kinds: dict[tuple[GpuSpace, ...], int] = {}
        self.kind: list[int] = []
        supplied: list[frozenset[str]] = []
        for node in snapshot.nodes:
            spaces = tuple(
                GpuSpace(
                    snapshot.table(gpu.model),
                    frozenset(i.geometry for i in gpu.instances if i.used),
                    frozenset(i.geometry for i in gpu.instances if not i.used),
                )
                for gpu in node.gpus
            )
            self.spaces.append(spaces)
            self.kind.append(kinds.setdefault(spaces, len(kinds)))
            supplied.append(frozenset(p for s in spaces for p in s.table.profile_names))
        levels = sorted({r.priority for r in requests}, reverse=True)
        self.level = [levels.index(r.priority) for r in requests]
        self.n_levels = len(levels)
        # The request as each node sees it (only the profiles the node's models supply), for the
        # nodes that could serve it at all.
        self.demand: list[dict[int, DeviceDemand]] = []
        for request in requests:
            per_node: dict[int, DeviceDemand] = {}
            if request.count > 0 and request.profiles:
                profiles = tuple(dict.fromkeys(request.profiles))
                same = request.same_gpu and request.count > 1
                for n, node in enumerate(snapshot.nodes):
                    if request.nodes is not None and node.name not in request.nodes:
                        continue
                    mine = tuple(p for p in profiles if p in supplied[n])
                    if mine:
                        per_node[n] = DeviceDemand(mine, request.count, same)
            self.demand.append(per_node)
        # Equal demands share an id, ordered like the demands, so that a node's requests sort
        # into a cache key quickly.
        ids = {
            d: k
            for k, d in enumerate(
                sorted({d for p in self.demand for d in p.values()}, key=_demand_key)
            )
        }
        self.demands = sorted(ids, key=ids.__getitem__)
        self.ids: list[dict[int, int]] = [
            {node: ids[d] for node, d in per_node.items()} for per_node in self.demand
        ]
        # Packings by node kind and demand ids; (None, bound): none costs at most `bound`.
        self.cache: dict[tuple[int, tuple[int, ...]], tuple[NodePacking | None, int | None]]
        self.cache = {}
        self.empty: list[int] = []
        for spaces in self.spaces:
            found = pack(spaces, (), policy, memo=self.memo)
            assert found is not None
            self.empty.append(found.cost)

    def pack(self, node: int, members: Sequence[int], limit: int | None = None) -> Packed | None:
        """The exact packing of `members` on `node` and the members in the packing's order.

        With a `limit`, None may also mean that every packing costs more than that.
        """
        self.work.spend(_LOOKUP)
        ids = [(self.ids[i][node], i) for i in members]
        ids.sort()
        order = [i for _, i in ids]
        key = (self.kind[node], tuple(d for d, _ in ids))
        cached = self.cache.get(key)
        if cached is not None:
            found, bound = cached
            if found is not None or bound is None or (limit is not None and limit <= bound):
                return None if found is None else (found, order)
        demands = [self.demands[d] for d in key[1]]
        found = pack(self.spaces[node], demands, self.policy, limit, self.work, self.memo)
        self.cache[key] = (found, limit if found is None else None)
        return None if found is None else (found, order)


def _demand_key(demand: DeviceDemand) -> tuple[tuple[str, ...], int, bool]:
    return (demand.profiles, demand.count, demand.same_gpu)
