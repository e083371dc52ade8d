"""MigNode pieces as an agent reports them, for the kube-layer unit tests."""

from __future__ import annotations

from migpart.api.models import GpuStatus, MigInstanceStatus, ProfileInfo
from migpart.mig import builtin_table

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
