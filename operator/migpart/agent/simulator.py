"""An in-process NVML that behaves like the real one for everything the agent does.

It exists so that the reconciler, the kubelet plugin, the demo and the tests run without a GPU
and still meet NVML's real rules: profile tables and placements come from the catalog (which
equals real NVML dumps), creation at an overlapping placement, past an instance limit or past
the compute slices fails with NVML_ERROR_INSUFFICIENT_RESOURCES, destroying an instance with
running processes fails with NVML_ERROR_IN_USE, a missing instance is NVML_ERROR_NOT_FOUND.
Errors are raised as the real `pynvml.NVMLError` subclasses and mapped exactly as the real
backend maps them. MIG UUIDs are deterministic (uuid5 of the GPU UUID and GI id) so restarts
and tests see stable identities.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import pynvml

from migpart.agent.backend import GpuInfo, MigInstance, map_nvml_error
from migpart.mig import CATALOG, Instance, ModelTable, layout_problems

if TYPE_CHECKING:
    from collections.abc import Callable

_T = TypeVar("_T")

_NAMESPACE = uuid.UUID("6f1f3d5e-7b2a-4c55-9a0e-6d2c1b1e0a11")


def parse_simulate(spec: str) -> list[tuple[str, int]]:
    """`"NVIDIA H100 80GB HBM3:8,NVIDIA H200:2"` -> [(model, count), ...]."""
    out: list[tuple[str, int]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        model, sep, count = part.rpartition(":")
        if not sep:
            model, count = part, "1"
        if model not in CATALOG:
            known = ", ".join(sorted(CATALOG))
            raise ValueError(f"--simulate: unknown model {model!r} (known: {known})")
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--simulate: count of {model!r} must be a positive integer")
        out.append((model, int(count)))
    if not out:
        raise ValueError("--simulate: expected MODEL:COUNT[,MODEL:COUNT]")
    return out


@dataclass
class _SimGi:
    profile: str
    start: int
    gi_id: int
    ci_id: int | None


@dataclass
class _SimGpu:
    info: GpuInfo
    table: ModelTable
    gis: dict[int, _SimGi] = field(default_factory=dict)


def _nvml_order(table: ModelTable) -> ModelTable:
    """The catalog table with its profiles in NVML profile-index order, as NVML lists them."""
    profiles = tuple(sorted(table.profiles, key=lambda p: p.nvml_index))
    return ModelTable(table.model, table.compute_slices, table.memory_slices, profiles)


def mig_uuid(gpu_uuid: str, gi_id: int) -> str:
    """The simulator's MIG device UUID: stable for a GPU UUID and GPU-instance id."""
    return f"MIG-{uuid.uuid5(_NAMESPACE, f'{gpu_uuid}/gi/{gi_id}')}"


class SimulatedNvml:
    """`NvmlBackend` over in-memory GPUs. One instance per simulated node.

    `latency_s` delays every mutating or listing call (with `asyncio.sleep`), to let the demo
    and tests see the reconfiguration time a real driver takes.
    """

    def __init__(
        self,
        models: list[tuple[str, int]],
        *,
        node: str = "sim",
        latency_s: float = 0.0,
        mig_enabled: bool = True,
    ) -> None:
        self.latency_s = latency_s
        self._gpus: list[_SimGpu] = []
        for model, count in models:
            for _ in range(count):
                index = len(self._gpus)
                gpu_uuid = f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"
                info = GpuInfo(index, gpu_uuid, model, mig_enabled, minor=index)
                self._gpus.append(_SimGpu(info, _nvml_order(CATALOG[model])))
        self._processes: dict[str, set[int]] = {}
        self._fail_next: dict[str, int] = {}
        self.calls: list[str] = []  # mutating calls, in order (for tests)

    # ------------------------------------------------------------------ test hooks

    def add_process(self, mig: str, pid: int) -> None:
        """Pretend `pid` runs on the MIG device with UUID `mig`."""
        self._processes.setdefault(mig, set()).add(pid)

    def remove_process(self, mig: str, pid: int) -> None:
        self._processes.get(mig, set()).discard(pid)

    def fail_next(self, op: str, code: int) -> None:
        """Make the next call of `op` ("create_gi", "create_ci", "destroy") fail with `code`."""
        self._fail_next[op] = code

    def create_gpu_instance_only(self, gpu: int, profile: str, start: int) -> int:
        """A GPU instance without compute instance, as a crash between the two calls leaves."""
        g = self._gpu(gpu)
        self._check_fits(g, profile, start)
        gi_id = self._free_gi_id(g)
        g.gis[gi_id] = _SimGi(profile, start, gi_id, None)
        return gi_id

    # ------------------------------------------------------------------ NvmlBackend

    async def gpus(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    async def profile_table(self, gpu: int) -> ModelTable:
        return self._mapped("GetGpuInstanceProfileInfo", lambda: self._gpu(gpu).table)

    async def instances(self, gpu: int) -> list[MigInstance]:
        await self._delay()

        def listing() -> list[MigInstance]:
            g = self._gpu(gpu)
            return sorted((self._record(g, gi) for gi in g.gis.values()), key=lambda m: m.start)

        return self._mapped("GetGpuInstances", listing)

    async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        await self._delay()

        def create() -> MigInstance:
            g = self._gpu(gpu)
            self._maybe_fail("create_gi")
            self._check_fits(g, profile, start)
            gi_id = self._free_gi_id(g)
            gi = _SimGi(profile, start, gi_id, None)
            g.gis[gi_id] = gi
            self.calls.append(f"create_gi {gpu} {profile}@{start}")
            try:
                self._maybe_fail("create_ci")
            except pynvml.NVMLError:
                # The real backend rolls the GPU instance back when the CI cannot be made.
                del g.gis[gi_id]
                raise
            gi.ci_id = 0
            self.calls.append(f"create_ci {gpu} {profile}@{start}")
            return self._record(g, gi)

        return self._mapped(f"create {profile}@{start} on GPU {gpu}", create)

    async def destroy(self, gpu: int, profile: str, start: int) -> None:
        await self._delay()

        def destroy() -> None:
            g = self._gpu(gpu)
            gi = self._find(g, profile, start)
            self._maybe_fail("destroy")
            if gi.ci_id is not None:
                if self._processes.get(mig_uuid(g.info.uuid, gi.gi_id)):
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
                gi.ci_id = None
                self.calls.append(f"destroy_ci {gpu} {profile}@{start}")
            del g.gis[gi.gi_id]
            self.calls.append(f"destroy_gi {gpu} {profile}@{start}")

        self._mapped(f"destroy {profile}@{start} on GPU {gpu}", destroy)

    async def processes(self, gpu: int, profile: str, start: int) -> list[int]:
        def procs() -> list[int]:
            g = self._gpu(gpu)
            gi = self._find(g, profile, start)
            if gi.ci_id is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return sorted(self._processes.get(mig_uuid(g.info.uuid, gi.gi_id), ()))

        return self._mapped(f"GetComputeRunningProcesses {profile}@{start}", procs)

    async def close(self) -> None:
        return None

    # ------------------------------------------------------------------ internals

    async def _delay(self) -> None:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

    def _mapped(self, what: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except pynvml.NVMLError as err:
            raise map_nvml_error(err, what) from err

    def _maybe_fail(self, op: str) -> None:
        code = self._fail_next.pop(op, None)
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, index: int) -> _SimGpu:
        if not 0 <= index < len(self._gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self._gpus[index]
        if not g.info.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    def _find(self, g: _SimGpu, profile: str, start: int) -> _SimGi:
        for gi in g.gis.values():
            if gi.profile == profile and gi.start == start:
                return gi
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _check_fits(self, g: _SimGpu, profile: str, start: int) -> None:
        if not g.table.has(profile) or start not in g.table.profile(profile).placements:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        layout = [Instance(gi.profile, gi.start) for gi in g.gis.values()]
        if layout_problems(g.table, [*layout, Instance(profile, start)]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    @staticmethod
    def _free_gi_id(g: _SimGpu) -> int:
        gi_id = 1
        while gi_id in g.gis:
            gi_id += 1
        return gi_id

    @staticmethod
    def _record(g: _SimGpu, gi: _SimGi) -> MigInstance:
        uuid_ = mig_uuid(g.info.uuid, gi.gi_id) if gi.ci_id is not None else ""
        return MigInstance(g.info.index, gi.profile, gi.start, gi.gi_id, gi.ci_id, uuid_)
