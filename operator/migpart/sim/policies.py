"""The baseline policies: fixed layouts (static MIG, MIG off) and first-fit dynamic MIG.

- `Static`: every GPU keeps one layout for the whole run; a mig-parted config, `all-balanced`,
  `all-7g`, or a mix found by the best-static search. MIG off is `Static` with one whole-GPU
  device per GPU and every pod asking whole GPUs (`whole_gpu_pods`).
- `FirstFit`: NVIDIA's dynamic MIG in its DRA driver: a pod that finds no device gets its
  first profile created at the first place it fits in free space (nodes, then GPUs, then
  placements in order), never destroying anything; the instance is destroyed when the pod
  leaves. The pod waits for the creation (`actuation_s` per GPU touched, one after another).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from migpart.mig import Instance, ModelTable
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine
from migpart.sim.layouts import StaticLayout
from migpart.sim.workload import SimPod, plain_profiles


@dataclass
class Static:
    """`layout` on every node, except the first `whole_nodes` nodes, which get `whole`."""

    name: str
    layout: StaticLayout
    whole_nodes: int = 0
    whole: StaticLayout = ()

    def setup(self, engine: Engine) -> None:
        for node in range(len(engine.cluster.names)):
            layout = self.whole if node < self.whole_nodes else self.layout
            for index, instances in enumerate(layout):
                for inst in instances:
                    engine.cluster.add(node, index, inst, ready=True, holder=None)

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None:
        return None

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
        return None


def whole_gpu_pods(table: ModelTable, pods: Sequence[SimPod]) -> list[SimPod]:
    """MIG off: each device of a pod is a whole GPU (its size, for utilisation, unchanged)."""
    whole = plain_profiles(table)[-1]
    return [replace(p, profiles=(whole,)) for p in pods]


@dataclass
class FirstFit:
    actuation_s: float
    name: str = "first-fit"

    def setup(self, engine: Engine) -> None:
        return None

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None:
        for pod in pods:
            found = first_fit(engine.cluster, pod)
            if found is None:
                continue
            gpus_touched: dict[tuple[int, int], int] = {}
            for node, index, inst in found:
                k = gpus_touched.setdefault((node, index), len(gpus_touched) + 1)
                engine.create(node, index, inst, engine.now + self.actuation_s * k)
            # The pod starts when its last GPU is done.
            engine.bind(pod, found)

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
        for node, index, inst in devices:
            engine.destroy(node, index, inst)


def first_fit(cluster: SimCluster, pod: SimPod) -> list[Device] | None:
    """`pod.count` new instances of its first profile on the first node that has room for
    all of them, each at the first free placement of the first GPU with one."""
    table = cluster.table
    prof = table.profile(pod.profiles[0])
    for node in cluster.allowed(pod):
        found: list[Device] = []
        for gpu in cluster.gpus[node]:
            taken = 0
            compute = 0
            count = 0
            for inst in gpu.instances:
                p = table.profile(inst.profile)
                taken |= p.mask(inst.start)
                compute += p.compute_slices
                count += inst.profile == prof.name
            for start in prof.placements:
                if len(found) == pod.count:
                    break
                mask = prof.mask(start)
                if taken & mask:
                    continue
                if compute + prof.compute_slices > table.compute_slices:
                    break
                if count >= prof.max_instances:
                    break
                taken |= mask
                compute += prof.compute_slices
                count += 1
                found.append((node, gpu.index, Instance(prof.name, start)))
            if len(found) == pod.count:
                return found
    return None
