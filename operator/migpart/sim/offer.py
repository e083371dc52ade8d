"""Offer mode as a policy: one stable pool per node, instances made at prepare and kept after.

Each node lists every placement its policy allows, once, in a fixed order
(`migpart.planning.listing`: `planner_order` for `offer`, NVIDIA's `name_order` for
`offer-name-order`). The scheduler's pass takes the pending pods in arrival order
(`Engine._schedule`) and gives each, on the first node in node order (`node-1`, `node-2`, ...:
the order first-fit tries them) where they fit, the first listed placements of its first
profile that fit, then of its next one: kube-scheduler's structured allocator, first fit in
listing order. "Fit" is the counters' rule, which only allocated devices consume: no memory
slice in common with an instance in use or chosen with it, within the compute slices and the
profile's instance limit. A free instance takes no counter.

At prepare the agent reuses the instance already at the chosen placement (the pod starts at
once); otherwise it destroys the free instances that overlap the placement (the counters
guarantee none is in use) and creates it, `actuation_s` per GPU touched, one after another, as
first-fit's. When the pod leaves, its instances stay, free, for the next claim of their
placement; nothing else destroys them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from migpart.mig import Instance, ModelTable, Occupancy
from migpart.planning.listing import NodeGpus, planner_order
from migpart.planning.model import DeviceRef, PolicyView
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine
from migpart.sim.workload import SimPod

Order = Callable[[NodeGpus, PolicyView], Sequence[DeviceRef]]


@dataclass
class Offer:
    actuation_s: float = 5.0
    policy: PolicyView = field(default_factory=PolicyView)
    order: Order = planner_order
    name: str = "offer"
    # A node's listed placements by profile, in listing order (every node has the same GPUs).
    _listed: dict[str, list[tuple[int, Instance]]] = field(default_factory=dict)
    # What the allocated devices take of each GPU's counters, by (node, GPU).
    _allocated: dict[tuple[int, int], Occupancy] = field(default_factory=dict)

    def setup(self, engine: Engine) -> None:
        cluster = engine.cluster
        gpus = {gpu.index: cluster.table for gpu in cluster.gpus[0]} if cluster.gpus else {}
        self._listed = {}
        for ref in self.order(gpus, self.policy):
            self._listed.setdefault(ref.profile, []).append(
                (ref.gpu, Instance(ref.profile, ref.start))
            )
        engine.allocate = lambda pod: self._allocate(engine, pod)

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None:
        return None

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
        for node, index, _ in devices:
            self._allocated.pop((node, index), None)

    def _allocate(self, engine: Engine, pod: SimPod) -> list[Device] | None:
        cluster = engine.cluster
        for node in cluster.allowed(pod):
            for profile in pod.profiles:
                chosen = self._first_fit(cluster, node, profile, pod.count)
                if chosen is not None:
                    return self._prepare(engine, node, chosen)
        return None

    def _first_fit(
        self, cluster: SimCluster, node: int, profile: str, count: int
    ) -> list[tuple[int, Instance]] | None:
        """The first `count` listed placements of `profile` whose counters are free beside
        each other; None when fewer are."""
        table = cluster.table
        prof = table.profile(profile)
        chosen: list[tuple[int, Instance]] = []
        for index, inst in self._listed.get(profile, ()):
            taken = self._counters(cluster, node, index)
            mine = [i for g, i in chosen if g == index]
            if mine:
                taken = Occupancy.of(table, [*_held(cluster, node, index), *mine])
            if not taken.mask & prof.mask(inst.start) and taken.headroom(prof) >= 1:
                chosen.append((index, inst))
                if len(chosen) == count:
                    return chosen
        return None

    def _prepare(
        self, engine: Engine, node: int, chosen: Sequence[tuple[int, Instance]]
    ) -> list[Device]:
        """The agent's NodePrepareResources for each chosen placement: the instance there
        reused, else the free instances in its way destroyed and it created."""
        cluster = engine.cluster
        touched: dict[int, int] = {}
        for index, inst in chosen:
            instances = cluster.gpus[node][index].instances
            if inst not in instances:
                mask = cluster.table.profile(inst.profile).mask(inst.start)
                for other in [i for i in instances if _mask(cluster.table, i) & mask]:
                    engine.destroy(node, index, other)
                k = touched.setdefault(index, len(touched) + 1)
                engine.create(node, index, inst, engine.now + self.actuation_s * k)
            # The engine binds the pod to its devices next: counted again when next asked.
            self._allocated.pop((node, index), None)
        return [(node, index, inst) for index, inst in chosen]

    def _counters(self, cluster: SimCluster, node: int, index: int) -> Occupancy:
        taken = self._allocated.get((node, index))
        if taken is None:
            taken = Occupancy.of(cluster.table, _held(cluster, node, index))
            self._allocated[node, index] = taken
        return taken


def _held(cluster: SimCluster, node: int, index: int) -> list[Instance]:
    return [i for i, s in cluster.gpus[node][index].instances.items() if s.holder is not None]


def _mask(table: ModelTable, inst: Instance) -> int:
    return table.profile(inst.profile).mask(inst.start)
