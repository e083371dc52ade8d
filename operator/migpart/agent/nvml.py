"""`NvmlBackend` on the real driver through nvidia-ml-py (`pynvml`).

Everything NVML says wins over the built-in catalog: profile tables are read with
`nvmlDeviceGetGpuInstanceProfileInfo` (v2, which carries the profile name) and
`nvmlDeviceGetGpuInstancePossiblePlacements`. NVML calls block (some, like instance creation,
for hundreds of milliseconds), so each public method runs its whole sequence of calls in one
worker thread; a lock keeps two sequences from interleaving on the driver.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from typing import TYPE_CHECKING, Any, TypeVar

import pynvml

from migpart.agent.backend import GpuInfo, MigInstance, map_nvml_error
from migpart.mig import CATALOG, ModelTable, Profile

if TYPE_CHECKING:
    from collections.abc import Callable

_T = TypeVar("_T")

# Codes that mean "this profile index does not exist on this GPU", not a failure.
_ABSENT = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT}


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _nvml_profile(handle: Any, index: int, model: str) -> Profile | None:
    """Profile `index` of the GPU, or None when the GPU does not offer it."""
    try:
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, version=2)
    except pynvml.NVMLError as err:
        if err.value in _ABSENT:
            return None
        raise
    name = _text(info.name).removeprefix("MIG ").strip()
    if not name:  # drivers that fill only the v1 fields: name it from the catalog by id
        known = CATALOG.get(model)
        name = next((p.name for p in known.profiles if p.nvml_id == info.id), "") if known else ""
        if not name:
            name = f"profile-{info.id}"
    count = ctypes.c_uint(0)
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * max(int(info.instanceCount), 8))()
    count.value = len(placements)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, info.id, placements, ctypes.byref(count)
    )
    found = [(int(placements[i].start), int(placements[i].size)) for i in range(count.value)]
    memory_slices = found[0][1] if found else 0
    return Profile(
        name=name,
        compute_slices=int(info.sliceCount),
        memory_slices=memory_slices,
        placements=tuple(start for start, _ in found),
        max_instances=int(info.instanceCount),
        memory_mib=int(info.memorySizeMB),
        multiprocessors=int(info.multiprocessorCount),
        copy_engines=int(info.copyEngineCount),
        decoders=int(info.decoderCount),
        encoders=int(info.encoderCount),
        jpegs=int(info.jpegCount),
        ofas=int(info.ofaCount),
        nvml_index=index,
        nvml_id=int(info.id),
    )


def _mig_enabled(handle: Any) -> bool:
    """Whether MIG mode is currently on (GPUs without MIG support say NOT_SUPPORTED)."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as err:
        if err.value != pynvml.NVML_ERROR_NOT_SUPPORTED:
            raise
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def read_table(handle: Any, model: str) -> ModelTable:
    """The GPU's profile table as NVML reports it (blocking)."""
    profiles = [
        p
        for i in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
        if (p := _nvml_profile(handle, i, model)) is not None
    ]
    compute = max((p.compute_slices for p in profiles), default=0)
    memory = max((s + p.memory_slices for p in profiles for s in p.placements), default=0)
    return ModelTable(
        model=model, compute_slices=compute, memory_slices=memory, profiles=tuple(profiles)
    )


class RealNvml:
    """`NvmlBackend` on the NVIDIA driver. Call `open()` (nvmlInit) before use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[int, ModelTable] = {}
        self._seen: dict[int, GpuInfo] = {}  # each GPU as last read (for a lost one)

    @classmethod
    async def open(cls) -> RealNvml:
        self = cls()
        await self._run("nvmlInit", pynvml.nvmlInit)
        return self

    async def close(self) -> None:
        await self._run("nvmlShutdown", pynvml.nvmlShutdown)

    async def _run(self, what: str, fn: Callable[[], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                try:
                    return fn()
                except pynvml.NVMLError as err:
                    raise map_nvml_error(err, what) from err

        return await asyncio.to_thread(locked)

    # ------------------------------------------------------------------ reads

    async def gpus(self) -> list[GpuInfo]:
        def read() -> list[GpuInfo]:
            out = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    h = pynvml.nvmlDeviceGetHandleByIndex(index)
                    info = GpuInfo(
                        index=index,
                        uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                        model=_text(pynvml.nvmlDeviceGetName(h)),
                        mig_enabled=_mig_enabled(h),
                        minor=int(pynvml.nvmlDeviceGetMinorNumber(h)),
                    )
                except pynvml.NVMLError as err:
                    if err.value != pynvml.NVML_ERROR_GPU_IS_LOST:
                        raise
                    # what it was when last seen (it cannot be read now); its table may
                    # differ when it comes back (another board after a repair)
                    seen = self._seen.get(index)
                    info = GpuInfo(
                        index,
                        seen.uuid if seen else "",
                        seen.model if seen else "",
                        mig_enabled=False,
                        minor=seen.minor if seen else index,
                        lost=True,
                    )
                    self._tables.pop(index, None)
                else:
                    self._seen[index] = info
                out.append(info)
            return out

        return await self._run("inventory", read)

    async def profile_table(self, gpu: int) -> ModelTable:
        if gpu not in self._tables:

            def read() -> ModelTable:
                h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
                return read_table(h, _text(pynvml.nvmlDeviceGetName(h)))

            self._tables[gpu] = await self._run(f"profile table of GPU {gpu}", read)
        return self._tables[gpu]

    async def instances(self, gpu: int) -> list[MigInstance]:
        table = await self.profile_table(gpu)
        return await self._run(f"instances of GPU {gpu}", lambda: self._list(gpu, table))

    def _mig_devices(self, handle: Any) -> dict[tuple[int, int], tuple[str, Any]]:
        """(GI id, CI id) -> (MIG device UUID, MIG device handle) of the GPU's MIG devices."""
        out: dict[tuple[int, int], tuple[str, Any]] = {}
        for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except pynvml.NVMLError as err:
                if err.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise
            key = (
                int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
            )
            out[key] = (_text(pynvml.nvmlDeviceGetUUID(mig)), mig)
        return out

    def _mig_uuids(self, handle: Any) -> dict[tuple[int, int], str]:
        return {key: uuid for key, (uuid, _h) in self._mig_devices(handle).items()}

    def _gpu_instances(self, handle: Any, table: ModelTable) -> list[tuple[Profile, Any, Any]]:
        """(profile, GI handle, GI info) of every GPU instance."""
        out = []
        for prof in table.profiles:
            handles = (pynvml.c_nvmlGpuInstance_t * max(prof.max_instances, 1))()
            count = ctypes.c_uint(0)
            pynvml.nvmlDeviceGetGpuInstances(handle, prof.nvml_id, handles, ctypes.byref(count))
            for i in range(count.value):
                out.append((prof, handles[i], pynvml.nvmlGpuInstanceGetInfo(handles[i])))
        return out

    @staticmethod
    def _compute_instances(gi: Any) -> list[Any]:
        """Handles of every compute instance of a GPU instance, whatever its CI profile."""
        out: list[Any] = []
        for ci_profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            handles = (pynvml.c_nvmlComputeInstance_t * 8)()
            count = ctypes.c_uint(0)
            try:
                pynvml.nvmlGpuInstanceGetComputeInstances(
                    gi, ci_profile_id(gi, ci_profile), handles, ctypes.byref(count)
                )
            except pynvml.NVMLError as err:
                if err.value in _ABSENT:
                    continue
                raise
            out.extend(handles[i] for i in range(count.value))
        return out

    def _list(self, gpu: int, table: ModelTable) -> list[MigInstance]:
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        if not _mig_enabled(h):
            return []  # no GPU instances can exist; listing them would fail
        uuids = self._mig_uuids(h)
        out = []
        for prof, gi, info in self._gpu_instances(h, table):
            cis = self._compute_instances(gi)
            ci_id = int(pynvml.nvmlComputeInstanceGetInfo(cis[0]).id) if cis else None
            uuid = uuids.get((int(info.id), ci_id), "") if ci_id is not None else ""
            out.append(
                MigInstance(gpu, prof.name, int(info.placement.start), int(info.id), ci_id, uuid)
            )
        return sorted(out, key=lambda m: m.start)

    def _find_gi(self, h: Any, table: ModelTable, profile: str, start: int) -> Any:
        for prof, gi, info in self._gpu_instances(h, table):
            if prof.name == profile and int(info.placement.start) == start:
                return gi
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    async def processes(self, gpu: int, profile: str, start: int) -> list[int]:
        table = await self.profile_table(gpu)

        def read() -> list[int]:
            h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
            gi = self._find_gi(h, table, profile, start)
            gi_id = int(pynvml.nvmlGpuInstanceGetInfo(gi).id)
            pids: set[int] = set()
            for (g, _c), (_uuid, mig) in self._mig_devices(h).items():
                if g == gi_id:
                    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
                    pids.update(int(p.pid) for p in procs)
            return sorted(pids)

        return await self._run(f"processes of {profile}@{start} on GPU {gpu}", read)

    # ------------------------------------------------------------------ writes

    async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        table = await self.profile_table(gpu)
        prof = table.profile(profile)

        def create() -> MigInstance:
            h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = prof.memory_slices
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, prof.nvml_id, placement)
            try:
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, full_ci_profile(gi, prof))
            except pynvml.NVMLError:
                pynvml.nvmlGpuInstanceDestroy(gi)  # no half-made instance left behind
                raise
            gi_id = int(pynvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
            uuid = self._mig_uuids(h).get((gi_id, ci_id), "")
            return MigInstance(gpu, profile, start, gi_id, ci_id, uuid)

        return await self._run(f"create {profile}@{start} on GPU {gpu}", create)

    async def destroy(self, gpu: int, profile: str, start: int) -> None:
        table = await self.profile_table(gpu)

        def destroy() -> None:
            h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
            gi = self._find_gi(h, table, profile, start)
            for ci in self._compute_instances(gi):
                pynvml.nvmlComputeInstanceDestroy(ci)
            pynvml.nvmlGpuInstanceDestroy(gi)

        await self._run(f"destroy {profile}@{start} on GPU {gpu}", destroy)


def ci_profile_id(gi: Any, ci_profile_index: int) -> int:
    """The id of compute-instance profile `ci_profile_index` on a GPU instance."""
    info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, ci_profile_index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return int(info.id)


def full_ci_profile(gi: Any, prof: Profile) -> int:
    """The id of the compute-instance profile that spans the whole GPU instance."""
    best: tuple[int, int] | None = None
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except pynvml.NVMLError as err:
            if err.value in _ABSENT:
                continue
            raise
        slices = int(info.sliceCount)
        if slices <= prof.compute_slices and (best is None or slices > best[0]):
            best = (slices, int(info.id))
    if best is None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return best[1]
