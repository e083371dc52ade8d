"""MigNode pieces as an agent reports them, for the kube-layer unit tests."""

from __future__ import annotations

from migpart.api.models import GpuStatus
from migpart.testing.builders import H100, gpu_status


def gpu(
    index: int, *instances: tuple[str, int, str], model: str = H100, mig: bool = True
) -> GpuStatus:
    return gpu_status(index, *instances, model=model, mig=mig)
