"""The simulated cluster: nodes of GPUs and the MIG instances on each, who holds them, and the
scheduler's choice of free devices for a pod.

An instance is ready (usable) or being created, and free or held by a pod (running on it, or
bound to it while it is created). The scheduler takes free ready instances only, as
kube-scheduler takes only published devices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from migpart.mig import Instance, ModelTable
from migpart.sim.workload import SimPod


@dataclass(slots=True)
class SimInstance:
    instance: Instance
    ready: bool = True
    holder: str | None = None


@dataclass(slots=True)
class SimGpu:
    node: int
    index: int
    table: ModelTable
    instances: dict[Instance, SimInstance] = field(default_factory=dict)


# A device: (node index, GPU index on the node, instance).
Device = tuple[int, int, Instance]


class SimCluster:
    """`nodes` nodes named `node-1`, `node-2`, ... with `gpus_per_node` GPUs of one model."""

    def __init__(self, table: ModelTable, nodes: int, gpus_per_node: int) -> None:
        self.table = table
        self.names = [f"node-{n + 1}" for n in range(nodes)]
        self.gpus = [[SimGpu(n, g, table) for g in range(gpus_per_node)] for n in range(nodes)]
        self.capacity_slices = nodes * gpus_per_node * table.compute_slices
        # Free ready instances per profile, cluster-wide: a pod no node can serve is skipped
        # without a scan.
        self.free: Counter[str] = Counter()

    def gpu(self, node: int, index: int) -> SimGpu:
        return self.gpus[node][index]

    def add(
        self, node: int, index: int, inst: Instance, *, ready: bool, holder: str | None
    ) -> None:
        gpu = self.gpus[node][index]
        assert inst not in gpu.instances, f"{inst} exists on {self.names[node]} GPU {index}"
        gpu.instances[inst] = SimInstance(inst, ready, holder)
        if ready and holder is None:
            self.free[inst.profile] += 1

    def remove(self, node: int, index: int, inst: Instance) -> None:
        state = self.gpus[node][index].instances.pop(inst)
        assert state.holder is None, f"destroying {inst} held by {state.holder}"
        if state.ready:
            self.free[inst.profile] -= 1

    def set_ready(self, node: int, index: int, inst: Instance) -> SimInstance:
        state = self.gpus[node][index].instances[inst]
        if not state.ready:
            state.ready = True
            if state.holder is None:
                self.free[inst.profile] += 1
        return state

    def hold(self, device: Device, holder: str) -> None:
        node, index, inst = device
        state = self.gpus[node][index].instances[inst]
        assert state.holder is None, f"{inst} already held by {state.holder}"
        state.holder = holder
        if state.ready:
            self.free[inst.profile] -= 1

    def release(self, device: Device) -> None:
        node, index, inst = device
        state = self.gpus[node][index].instances[inst]
        state.holder = None
        if state.ready:
            self.free[inst.profile] += 1

    def allowed(self, pod: SimPod) -> list[int]:
        if pod.nodes is None:
            return list(range(len(self.names)))
        return [n for n, name in enumerate(self.names) if name in pod.nodes]

    def find(self, pod: SimPod) -> list[Device] | None:
        """Free ready devices for `pod` on one node: the node where they rank best in the
        pod's preference order, the first such node on ties; None when no node has them."""
        if sum(self.free[p] for p in pod.profiles) < pod.count:
            return None
        rank = {p: r for r, p in enumerate(pod.profiles)}
        best: tuple[int, list[Device]] | None = None
        for node in self.allowed(pod):
            found = [
                (rank[i.profile], g.index, i.start, i)
                for g in self.gpus[node]
                for i, s in g.instances.items()
                if s.ready and s.holder is None and i.profile in rank
            ]
            if len(found) < pod.count:
                continue
            found.sort()
            chosen = found[: pod.count]
            cost = sum(c[0] for c in chosen)
            if best is None or cost < best[0]:
                best = (cost, [(node, c[1], c[3]) for c in chosen])
                if cost == 0:
                    break
        return None if best is None else best[1]

    def layout(self, node: int, index: int) -> Sequence[SimInstance]:
        return list(self.gpus[node][index].instances.values())
