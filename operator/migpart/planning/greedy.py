"""The greedy planner: requests one at a time, each on the node where it costs least.

Requests go in priority order (descending), and within a priority smallest first (compute
slices x count), which maximises the number of satisfied requests for a given capacity; other
orders serve `migpart.planning.planner`'s restarts. Each request goes to the node whose cost
vector (`migpart.planning.cost`) for its devices is smallest, the first such node on ties,
found through `migpart.planning.index`. Each priority level is repaired
(`migpart.planning.repair`) before the next one starts, so a lower priority never costs a
higher one anything; spares (`migpart.planning.spares`) come last.

Capacity only shrinks while planning, so a request shape that found no node is remembered and
later requests of the same shape that are at least as large fail in O(1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from migpart.mig import Instance, ModelTable, layout_problems
from migpart.planning.classes import GpuClasses
from migpart.planning.evaluate import Evaluator
from migpart.planning.index import NodeIndex, Placed, Shape
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
from migpart.planning.packer import Packer, Solution
from migpart.planning.repair import Repair
from migpart.planning.spares import add_spares


class Greedy:
    """One greedy run over a snapshot; `run` plans, `adopt` turns a search solution into the
    same kind of plan."""

    def __init__(
        self,
        snapshot: Snapshot,
        requests: Sequence[Request],
        policy: PolicyView,
        classes: GpuClasses | None = None,
        scan: bool = False,
    ) -> None:
        """`classes` may be shared between runs over one snapshot and policy. `scan`: see
        `NodeIndex` (the same plans, slower; for tests and the benchmark's baseline)."""
        self.snapshot = snapshot
        self.requests = list(requests)
        self.policy = policy
        self.classes = classes or GpuClasses(policy)
        self.names = [n.name for n in snapshot.nodes]
        # Per node, the class of each GPU now, and its layout in the snapshot.
        self.cids: list[list[int]] = []
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
            self.cids.append(cids)
            self.original.append(originals)
        evaluator = Evaluator(self.classes, self.requests)
        self.index = NodeIndex(self.names, self.cids, self.classes, evaluator, scan)
        self.failed: dict[tuple[tuple[str, ...], frozenset[str] | None, bool], int] = {}
        # request index -> (node, ((gpu position, instance), ...))
        self.assigned: dict[int, Placed] = {}
        self.on_node: list[list[int]] = [[] for _ in self.cids]
        self.repair = Repair(self.requests, self.index, self.assigned, self.on_node)

    def _place(self, request: Request, memo: bool = True) -> Placed | None:
        """Put the request on its cheapest node; None when no node can take it.

        With `memo`, a shape that found no node is remembered, and a later request of that
        shape at least as large fails at once.
        """
        profiles = tuple(dict.fromkeys(request.profiles))
        same_gpu = request.same_gpu and request.count > 1
        shape = Shape(profiles, request.count, request.nodes, same_gpu)
        memo_key = (profiles, request.nodes, same_gpu)
        failed_at = self.failed.get(memo_key)
        if memo and failed_at is not None and request.count >= failed_at:
            return None
        found = self.index.cheapest(shape)
        if found is None:
            if memo:
                self.failed[memo_key] = min(request.count, failed_at or request.count)
            return None
        _, node, steps = found
        self.index.apply(node, steps)
        return node, steps

    def _place_again(self, request: Request) -> Placed | None:
        """`_place` for the repair, which has changed a node since shapes were remembered."""
        return self._place(request, memo=False)

    def order(self, strategy: int = 0) -> list[int]:
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
        order = self.order(strategy)
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
            self.repair.run(level, self._place_again)
        add_spares(self.classes, self.cids, self.policy)
        return self._result()

    # --- exact search -------------------------------------------------------------------

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
                self.cids[node][pos] = cls.intern(
                    space.table, pinned, layout - pinned, layout != self.original[node][pos]
                )
            self.on_node[node] = list(members)
        add_spares(self.classes, self.cids, self.policy)
        return self._result()

    # --- output -------------------------------------------------------------------------

    def _result(self) -> Plan:
        cls = self.classes
        gpus: list[GpuPlan] = []
        destroyed = created = changed = 0
        for n, node in enumerate(self.snapshot.nodes):
            for pos, gpu in enumerate(node.gpus):
                cid = self.cids[n][pos]
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
            assignments.append(Assignment(request.name, self.names[node_pos], devices))
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
