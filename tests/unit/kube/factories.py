"""MigNode pieces as an agent reports them, and slices as the watch shows them, for the
kube-layer unit tests."""

from __future__ import annotations

from typing import Any

from migpart.api.models import (
    GpuSpec,
    GpuStatus,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.slices.content import node_slices
from migpart.testing.builders import H100, gpu_status


def gpu(
    index: int, *instances: tuple[str, int, str], model: str = H100, mig: bool = True
) -> GpuStatus:
    return gpu_status(index, *instances, model=model, mig=mig)


def watched_slice(node: str, generation: int, revision: int) -> dict[str, Any]:
    """An empty slice of `node` at pool `generation`, as the watch shows it at `revision`."""
    [content] = node_slices(MigNode(metadata={"name": node}))
    return content.body(generation, str(revision))


def spec_node(
    gpus: list[GpuStatus], spec: dict[int, list[tuple[str, int]]] | None = None
) -> MigNode:
    """MigNode `n`: `gpus` as its status, `spec` (GPU -> (profile, start)) as its spec."""
    return MigNode(
        metadata={"name": "n"},
        spec=None
        if spec is None
        else MigNodeSpec(
            plan_id="p",
            gpus=[
                GpuSpec(index=i, instances=[MigInstanceSpec(profile=p, start=s) for p, s in insts])
                for i, insts in spec.items()
            ],
        ),
        status=MigNodeStatus(gpus=gpus),
    )
