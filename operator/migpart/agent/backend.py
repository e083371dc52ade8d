"""The one interface the agent has to NVML, so that the real library and the simulator agree.

The reconciler and the kubelet plugin only ever see `NvmlBackend`; `RealNvml` (nvidia-ml-py)
and `SimulatedNvml` implement it. Both raise NVML failures through `map_nvml_error`, so an
overlap is `NvmlFailure(code=NVML_ERROR_INSUFFICIENT_RESOURCES)` and an instance with running
processes is `GpuBusy` whichever backend produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pynvml

from migpart.errors import GpuBusy, NvmlFailure

if TYPE_CHECKING:
    from migpart.mig import ModelTable


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as NVML enumerates it."""

    index: int
    uuid: str
    model: str
    mig_enabled: bool
    minor: int  # /dev/nvidia<minor>
    # NVML answers GPU_IS_LOST for it (fallen off the bus): no other call on it can succeed,
    # so callers leave it out until it is back
    lost: bool = False


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance (with its compute instance) that exists on a GPU."""

    gpu: int
    profile: str
    start: int
    gi_id: int
    ci_id: int | None  # None: a GPU instance without a compute instance (half-created)
    uuid: str  # MIG-...; empty when there is no compute instance (no MIG device yet)


class NvmlBackend(Protocol):
    """What the agent needs from NVML. Every method may block on the driver: implementations
    run the calls in a worker thread (`asyncio.to_thread`)."""

    async def gpus(self) -> list[GpuInfo]:
        """Every GPU of the node, a lost one (GPU_IS_LOST) included with `lost` set."""
        ...

    async def profile_table(self, gpu: int) -> ModelTable:
        """GPU-instance profiles and their possible placements, as NVML reports them."""
        ...

    async def instances(self, gpu: int) -> list[MigInstance]: ...

    async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        """Create a GPU instance at `start` and a compute instance spanning all of it."""
        ...

    async def destroy(self, gpu: int, profile: str, start: int) -> None:
        """Destroy the compute instances of the GPU instance, then the GPU instance."""
        ...

    async def processes(self, gpu: int, profile: str, start: int) -> list[int]:
        """PIDs of compute processes running on the instance's MIG device."""
        ...

    async def close(self) -> None: ...


NVML_ERROR_NAMES: dict[int, str] = {
    getattr(pynvml, name): name for name in dir(pynvml) if name.startswith("NVML_ERROR_")
}


def map_nvml_error(err: pynvml.NVMLError, what: str) -> NvmlFailure | GpuBusy:
    """The migpart error for an NVML failure of the operation `what`.

    IN_USE becomes GpuBusy (the caller must keep the instance); everything else NvmlFailure
    carrying the NVML return code, so callers can tell INSUFFICIENT_RESOURCES from NOT_FOUND.
    """
    code = int(err.value)
    name = NVML_ERROR_NAMES.get(code, f"NVML error {code}")
    message = f"{what}: {name} ({err})"
    if code == pynvml.NVML_ERROR_IN_USE:
        return GpuBusy(message)
    return NvmlFailure(message, code)
