"""Layout diffs: the NVML operations that turn the current layouts into the planned ones.

Destroys come before creates on every GPU: a new instance usually needs the memory slices of
an instance that goes, and NVML refuses overlapping placements.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from migpart.mig import Instance
from migpart.planning.model import GpuPlan, Snapshot

OpKind = Literal["destroy", "create"]


@dataclass(frozen=True, order=True, slots=True)
class Op:
    """One MIG GPU-instance operation on GPU `gpu` of node `node`."""

    kind: OpKind
    gpu: int
    profile: str
    start: int
    node: str = ""

    @property
    def instance(self) -> Instance:
        return Instance(self.profile, self.start)


def current_layouts(snapshot: Snapshot) -> tuple[GpuPlan, ...]:
    """The snapshot's layouts in the shape of a plan, to diff against one."""
    return tuple(
        GpuPlan(node.name, gpu.index, tuple(sorted(i.geometry for i in gpu.instances)))
        for node in snapshot.nodes
        for gpu in node.gpus
    )


def gpu_diff(
    current: Iterable[Instance], desired: Iterable[Instance], gpu: int, node: str = ""
) -> list[Op]:
    """Operations for one GPU: destroys (by start), then creates (by start)."""
    have = set(current)
    want = set(desired)
    destroys = sorted(have - want, key=lambda i: (i.start, i.profile))
    creates = sorted(want - have, key=lambda i: (i.start, i.profile))
    return [Op("destroy", gpu, i.profile, i.start, node) for i in destroys] + [
        Op("create", gpu, i.profile, i.start, node) for i in creates
    ]


def diff(current: Iterable[GpuPlan], desired: Iterable[GpuPlan]) -> list[Op]:
    """Operations turning `current` into `desired`, grouped by GPU, destroys first per GPU.

    GPUs are keyed by (node, index); a GPU missing on one side counts as having no instances.
    GPUs come out in (node, index) order so that the result is deterministic.
    """
    now = {(g.node, g.index): g.instances for g in current}
    target = {(g.node, g.index): g.instances for g in desired}
    ops: list[Op] = []
    for node, index in sorted(now.keys() | target.keys()):
        ops += gpu_diff(now.get((node, index), ()), target.get((node, index), ()), index, node)
    return ops


def apply_ops(current: Iterable[GpuPlan], ops: Iterable[Op]) -> tuple[GpuPlan, ...]:
    """The layouts after `ops`, in (node, index) order; raises ValueError on an impossible op.

    The inverse check of `diff`, used by tests and by the agent's simulator.
    """
    layouts: dict[tuple[str, int], set[Instance]] = {
        (g.node, g.index): set(g.instances) for g in current
    }
    for op in ops:
        layout = layouts.setdefault((op.node, op.gpu), set())
        if op.kind == "destroy":
            if op.instance not in layout:
                raise ValueError(f"destroy of absent {op.profile}@{op.start} on GPU {op.gpu}")
            layout.remove(op.instance)
        else:
            if op.instance in layout:
                raise ValueError(f"create of present {op.profile}@{op.start} on GPU {op.gpu}")
            layout.add(op.instance)
    return tuple(
        GpuPlan(node, index, tuple(sorted(layouts[(node, index)])))
        for node, index in sorted(layouts)
    )
