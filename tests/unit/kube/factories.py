"""MigNode pieces as an agent reports them, and slices as the watch shows them, for the
kube-layer unit tests."""

from __future__ import annotations

from typing import Any

from migpart.api.models import GpuStatus, MigInstanceStatus, MigNode, ProfileInfo
from migpart.mig import builtin_table
from migpart.slice_content import node_slices

H100 = "NVIDIA H100 80GB HBM3"


def gpu(
    index: int, *instances: tuple[str, int, str], model: str = H100, mig: bool = True
) -> GpuStatus:
    table = builtin_table(model)
    return GpuStatus(
        index=index,
        uuid=f"GPU-{index}",
        model=model,
        mig_enabled=mig,
        compute_slices=table.compute_slices,
        memory_slices=table.memory_slices,
        profiles=[ProfileInfo.from_profile(p) for p in table.profiles],
        instances=[
            MigInstanceStatus(profile=p, start=s, uuid=f"MIG-{index}-{p}-{s}", state=state)
            for p, s, state in instances
        ],
    )


def watched_slice(node: str, generation: int, revision: int) -> dict[str, Any]:
    """An empty slice of `node` at pool `generation`, as the watch shows it at `revision`."""
    [content] = node_slices(MigNode(metadata={"name": node}))
    return content.body(generation, str(revision))
