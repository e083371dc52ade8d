"""An in-process NVML that behaves like the real one for everything the agent does.

It exists so that the reconciler, the kubelet plugin, the demo and the tests run without a GPU
and still meet NVML's real rules: profile tables and placements come from the catalog (which
equals real NVML dumps), creation at an overlapping placement, past an instance limit or past
the compute slices fails with NVML_ERROR_INSUFFICIENT_RESOURCES, destroying an instance with
running processes fails with NVML_ERROR_IN_USE, a missing instance is NVML_ERROR_NOT_FOUND.
Errors are raised as the real `pynvml.NVMLError` subclasses and mapped exactly as the real
backend maps them. MIG UUIDs are deterministic (uuid5 of the GPU UUID and GI id) so restarts
and tests see stable identities.

With `state_path` the GPUs' instances are kept in a file, as a real GPU keeps them when the
agent process dies: a restarted agent finds what the killed one left, half-made instances
included. `SimFaults` injects the failures real drivers show, on a seeded schedule, for the
chaos harness (bench/chaos.py): INSUFFICIENT_RESOURCES on create, IN_USE on destroy, TIMEOUT
(half of them after the operation took effect, as a driver that answers too late), and GPUs
that are lost (GPU_IS_LOST: listed with `lost` set, every other call on them fails).

A GPU is lost from the start (`SimFaults.lost`), by `lose()` (tests holding the simulator), or,
while the agent runs in its own process, by the lost-GPU file next to the state file
(`simulated-nvml-lost.json`, a JSON list of GPU indices, read on every call): the chaos harness
writes it to make a GPU fall off the bus and removes it to bring the GPU back. A lost GPU keeps
its instances, as a GPU that comes back without a reset does.

Crash points (`SimFaults.crash_after`, for the e2e crash tests and the chaos harness): the
process exits at once with status 137 (`os._exit`, nothing cleaned up or flushed, as SIGKILL
leaves it) right after the Nth destroy (`prepare_destroy`) or create (`prepare_create`) done
inside the kubelet plugin's prepare, with NVML's state saved: between the destroy that made
room and the create, and between the create and the CDI write. A call is the prepare's when
`DraDriver.prepare` (`PREPARE_FRAME`) is on the call stack, so that nothing outside the
simulator knows of crash points: the reconciler's creates and destroys, and the retries of
placements reported unusable, never crash. Before it exits the process writes the crash marker
next to the state file (`simulated-nvml-crashed.json`: the point, its count, the instance) and
logs `nvml_crash_injected`; while the marker is there no crash point fires, so an agent started
again with the same flags goes on. Deleting the marker arms the crash points again, of a
running agent too (it is looked for at each point): the chaos harness starts its agents with
a marker and deletes it to crash one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NoReturn, TypeVar

import pynvml
import structlog

from migpart.agent.backend import NVML_ERROR_NAMES, GpuInfo, MigInstance, map_nvml_error
from migpart.agent.checkpoint import atomic_write
from migpart.mig import CATALOG, Instance, ModelTable, layout_problems

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from types import FrameType

log = structlog.get_logger(__name__)

_T = TypeVar("_T")

LOST_FILE = "simulated-nvml-lost.json"
CRASHED_FILE = "simulated-nvml-crashed.json"
CRASH_POINTS = ("prepare_destroy", "prepare_create")
CRASH_STATUS = 137  # what a process killed by SIGKILL exits with, as a shell reports it
# The call a crash point must be inside: (module, qualified name) of the kubelet plugin's
# prepare, matched on the call stack (tests/unit/agent/test_simulator.py holds it to the code).
PREPARE_FRAME = ("migpart.agent.plugin", "DraDriver.prepare")

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


@dataclass(frozen=True)
class SimFaults:
    """Rates (0..1, per call) of injected NVML failures, a seed, the lost GPUs, and the crash
    points: (point, N) to exit right after the Nth change of that kind inside a prepare."""

    create_insufficient: float = 0.0
    destroy_in_use: float = 0.0
    timeout: float = 0.0
    lost: frozenset[int] = frozenset()
    seed: int = 0
    crash_after: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> SimFaults:
        """`"create_insufficient=0.05,destroy_in_use=0.05,timeout=0.02,lost=3+5,seed=7"`,
        `"crash_after=prepare_destroy"`, `"crash_after=prepare_create:2+prepare_destroy"`."""
        rates: dict[str, float] = {}
        lost: frozenset[int] = frozenset()
        seed = 0
        crash: tuple[tuple[str, int], ...] = ()
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            try:
                if key == "lost" and sep:
                    lost = frozenset(int(i) for i in value.split("+") if i)
                elif key == "seed" and sep:
                    seed = int(value)
                elif key == "crash_after" and sep:
                    crash = tuple(_crash_point(p) for p in value.split("+"))
                elif key in ("create_insufficient", "destroy_in_use", "timeout") and sep:
                    rates[key] = float(value)
                    if not 0.0 <= rates[key] <= 1.0:
                        raise ValueError
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    f"--sim-faults: bad entry {part!r} (expected create_insufficient=RATE,"
                    " destroy_in_use=RATE, timeout=RATE with RATE in 0..1, lost=I+J, seed=N,"
                    " crash_after=POINT[:N][+POINT[:N]] with POINT prepare_destroy or"
                    " prepare_create)"
                ) from None
        return cls(lost=lost, seed=seed, crash_after=crash, **rates)


def _crash_point(text: str) -> tuple[str, int]:
    """`prepare_create` -> ("prepare_create", 1); `prepare_destroy:3` -> (..., 3)."""
    point, sep, nth = text.partition(":")
    if point not in CRASH_POINTS or (sep and (not nth.isdigit() or int(nth) < 1)):
        raise ValueError
    return point, int(nth) if sep else 1


def _in_prepare() -> bool:
    """Whether the kubelet plugin's prepare is on the call stack (an awaited coroutine's frame
    links to the one that awaits it)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if (frame.f_globals.get("__name__"), frame.f_code.co_qualname) == PREPARE_FRAME:
            return True
        frame = frame.f_back
    return False


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
        state_path: Path | None = None,
        faults: SimFaults | None = None,
        exit_process: Callable[[int], NoReturn] = os._exit,
    ) -> None:
        self.latency_s = latency_s
        self.state_path = state_path
        self.faults = faults or SimFaults()
        self._rng = random.Random(f"{node}/{self.faults.seed}")
        self._gpus: list[_SimGpu] = []
        for model, count in models:
            for _ in range(count):
                index = len(self._gpus)
                gpu_uuid = f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"
                info = GpuInfo(index, gpu_uuid, model, mig_enabled, minor=index)
                self._gpus.append(_SimGpu(info, _nvml_order(CATALOG[model])))
        self._processes: dict[str, set[int]] = {}
        self._fail_next: dict[str, int] = {}
        self._lost: set[int] = set()
        self._lost_file = state_path.with_name(LOST_FILE) if state_path is not None else None
        self._crashed_file = state_path.with_name(CRASHED_FILE) if state_path is not None else None
        self._exit = exit_process  # a crash point's end of the process (tests give their own)
        self._prepare_changes: dict[str, int] = {}  # crash point -> changes made in a prepare
        self.calls: list[str] = []  # mutating calls, in order (for tests)
        self.injected: list[str] = []  # injected faults, in order
        self._load()

    # ------------------------------------------------------------------ test hooks

    def add_process(self, mig: str, pid: int) -> None:
        """Pretend `pid` runs on the MIG device with UUID `mig`."""
        self._processes.setdefault(mig, set()).add(pid)

    def remove_process(self, mig: str, pid: int) -> None:
        self._processes.get(mig, set()).discard(pid)

    def lose(self, gpu: int) -> None:
        """The GPU falls off the bus: GPU_IS_LOST from every call on it until `recover`."""
        self._lost.add(gpu)

    def recover(self, gpu: int) -> None:
        self._lost.discard(gpu)

    def lost(self) -> frozenset[int]:
        """The GPUs lost now: from the start, by `lose`, or named in the lost-GPU file."""
        named: list[int] = []
        if self._lost_file is not None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                named = [int(i) for i in json.loads(self._lost_file.read_text())]
        return self.faults.lost | self._lost | frozenset(named)

    def fail_next(self, op: str, code: int) -> None:
        """Make the next call of `op` ("create_gi", "create_ci", "destroy") fail with `code`."""
        self._fail_next[op] = code

    def create_gpu_instance_only(self, gpu: int, profile: str, start: int) -> int:
        """A GPU instance without compute instance, as a crash between the two calls leaves."""
        g = self._gpu(gpu)
        self._check_fits(g, profile, start)
        gi_id = self._free_gi_id(g)
        g.gis[gi_id] = _SimGi(profile, start, gi_id, None)
        self._save()
        return gi_id

    # ------------------------------------------------------------------ NvmlBackend

    async def gpus(self) -> list[GpuInfo]:
        lost = self.lost()
        return [
            replace(g.info, mig_enabled=False, lost=True) if g.info.index in lost else g.info
            for g in self._gpus
        ]

    async def profile_table(self, gpu: int) -> ModelTable:
        return self._mapped("GetGpuInstanceProfileInfo", lambda: self._gpu(gpu).table)

    async def instances(self, gpu: int) -> list[MigInstance]:
        await self._delay()

        def listing() -> list[MigInstance]:
            g = self._gpu(gpu)
            self._maybe_inject("instances", timeout=True)
            return sorted((self._record(g, gi) for gi in g.gis.values()), key=lambda m: m.start)

        return self._mapped("GetGpuInstances", listing)

    async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        await self._delay()

        def create() -> MigInstance:
            g = self._gpu(gpu)
            self._maybe_fail("create_gi")
            self._maybe_inject("create", insufficient=True, timeout=True)
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
            self._save()
            self._maybe_crash("prepare_create", gpu, profile, start)
            self._maybe_inject("create", late_timeout=True)
            return self._record(g, gi)

        return self._mapped(f"create {profile}@{start} on GPU {gpu}", create)

    async def destroy(self, gpu: int, profile: str, start: int) -> None:
        await self._delay()

        def destroy() -> None:
            g = self._gpu(gpu)
            gi = self._find(g, profile, start)
            self._maybe_fail("destroy")
            self._maybe_inject("destroy", in_use=True, timeout=True)
            if gi.ci_id is not None:
                if self._processes.get(mig_uuid(g.info.uuid, gi.gi_id)):
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
                gi.ci_id = None
                self.calls.append(f"destroy_ci {gpu} {profile}@{start}")
            del g.gis[gi.gi_id]
            self.calls.append(f"destroy_gi {gpu} {profile}@{start}")
            self._save()
            self._maybe_crash("prepare_destroy", gpu, profile, start)
            self._maybe_inject("destroy", late_timeout=True)

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

    def _maybe_inject(
        self,
        op: str,
        *,
        insufficient: bool = False,
        in_use: bool = False,
        timeout: bool = False,
        late_timeout: bool = False,
    ) -> None:
        """Raise an injected failure of `op` at the configured rates. A timeout is drawn
        before the operation (nothing happened) or after it (`late_timeout`: it did happen),
        each at half the timeout rate."""
        f = self.faults
        draws = (
            (insufficient, f.create_insufficient, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),
            (in_use, f.destroy_in_use, pynvml.NVML_ERROR_IN_USE),
            (timeout or late_timeout, f.timeout / 2, pynvml.NVML_ERROR_TIMEOUT),
        )
        for wanted, rate, code in draws:
            if wanted and rate > 0 and self._rng.random() < rate:
                name = NVML_ERROR_NAMES[code]
                self.injected.append(f"{op} {name}")
                log.warning("nvml_fault_injected", op=op, error=name, late=late_timeout)
                raise pynvml.NVMLError(code)

    def _maybe_crash(self, point: str, gpu: int, profile: str, start: int) -> None:
        """End the process here if `point` is armed, this change is a prepare's and its Nth
        (or a later one), and no crash marker is there; the marker is written first."""
        nth = dict(self.faults.crash_after).get(point)
        if nth is None or not _in_prepare():
            return
        count = self._prepare_changes[point] = self._prepare_changes.get(point, 0) + 1
        if count < nth or (self._crashed_file is not None and self._crashed_file.exists()):
            return
        crash = {"point": point, "count": count, "gpu": gpu, "profile": profile, "start": start}
        if self._crashed_file is not None:
            atomic_write(self._crashed_file, json.dumps(crash, sort_keys=True) + "\n")
        log.warning("nvml_crash_injected", **crash)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        self._exit(CRASH_STATUS)

    def _save(self) -> None:
        if self.state_path is None:
            return
        body = {
            str(g.info.index): [
                {"profile": gi.profile, "start": gi.start, "gi": gi.gi_id, "ci": gi.ci_id}
                for gi in sorted(g.gis.values(), key=lambda gi: gi.gi_id)
            ]
            for g in self._gpus
        }
        atomic_write(self.state_path, json.dumps(body, sort_keys=True) + "\n")

    def _load(self) -> None:
        """The instances a previous run left (a missing file: none)."""
        if self.state_path is None or not self.state_path.exists():
            return
        saved = json.loads(self.state_path.read_text())
        for g in self._gpus:
            for gi in saved.get(str(g.info.index), []):
                g.gis[gi["gi"]] = _SimGi(gi["profile"], gi["start"], gi["gi"], gi["ci"])

    def _gpu(self, index: int) -> _SimGpu:
        if not 0 <= index < len(self._gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index in self.lost():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
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
