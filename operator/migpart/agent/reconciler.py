"""Make the node's MIG instances match MigNode.spec, without ever breaking a workload.

`reconcile_once` is level-triggered: it reads NVML, compares with the spec, destroys what the
spec no longer lists (free instances only), creates what is missing, and reports what it found.
It keeps no memory between runs, so a reconciler killed at any point and started again simply
converges from whatever NVML shows. Safety rules, enforced here and nowhere else:

- an instance prepared for a claim (checkpoint) or running processes (NVML) is never destroyed,
  even when the spec drops it; it is kept and reported as Degraded naming the instance;
- the prepared/busy check is repeated under the checkpoint lock right before the NVML call;
- what the spec wants is `MigNodeSpec.desired()`, the definition the operator's slice publisher
  and planner use too: GPUs it does not list, and every GPU while the spec has no `planId`
  (whatever it lists), are left alone;
- an instance is created only where nothing else is: one that would overlap an instance that
  exists (kept in use, or created meanwhile by the kubelet plugin: both create under the
  checkpoint lock) is refused without an NVML call and reported in `status.failedInstances`
  (`Overlap`), as is one NVML refused (`NvmlError`); the operator turns either into the
  failure binding condition of the claim allocated it (offer mode);
- `observedPlanId` becomes the spec's planId only when every managed GPU equals its spec. A GPU
  NVML reports lost (GPU_IS_LOST) is left out: nothing can be done on it, so it does not hold
  the plan back (nor the operator's `maxConcurrentNodes` slot). It is reported in
  `status.lostGpus` and the Degraded condition instead of `status.gpus`, and the spec is
  carried out on it once it is back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pynvml
import structlog

from migpart.api.models import (
    Condition,
    FailedInstance,
    GpuStatus,
    MigInstanceStatus,
    MigNodeSpec,
    MigNodeStatus,
    ProfileInfo,
)
from migpart.errors import GpuBusy, NvmlFailure
from migpart.mig import Instance, layout_problems

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from migpart.agent.backend import GpuInfo, MigInstance, NvmlBackend
    from migpart.agent.checkpoint import Checkpoint, UnusableReason
    from migpart.api.models import InstanceStateName
    from migpart.mig import ModelTable

log = structlog.get_logger("migpart.agent.reconciler")

OpKind = Literal["create", "destroy"]


@dataclass(frozen=True, slots=True)
class Op:
    """One NVML change the reconciler made."""

    kind: OpKind
    gpu: int
    profile: str
    start: int


@dataclass
class ReconcileResult:
    status: MigNodeStatus
    ops: list[Op]
    problems: list[str] = field(default_factory=list)
    converged: bool = False
    # NVML error codes of the creates that failed (the agent counts them and retries soon)
    nvml_errors: list[int | None] = field(default_factory=list)


@dataclass
class _Gpu:
    info: GpuInfo
    table: ModelTable
    actual: list[MigInstance]


def _key(i: MigInstance) -> Instance:
    return Instance(i.profile, i.start)


async def _busy_reason(
    backend: NvmlBackend, checkpoint: Checkpoint, inst: MigInstance
) -> str | None:
    """Why `inst` must not be destroyed, or None when it is free."""
    claims = checkpoint.prepared().get((inst.gpu, inst.profile, inst.start))
    if claims:
        return f"prepared for claim {', '.join(claims)}"
    if inst.ci_id is None:
        return None  # no compute instance: no MIG device, no process can run on it
    pids = await backend.processes(inst.gpu, inst.profile, inst.start)
    if pids:
        return f"running processes {', '.join(map(str, pids))}"
    return None


def is_lost(err: NvmlFailure) -> bool:
    return bool(err.code == pynvml.NVML_ERROR_GPU_IS_LOST)


async def read_gpus(backend: NvmlBackend) -> tuple[list[_Gpu], set[int]]:
    """The reachable GPUs with their tables and instances, and the indices of the lost ones
    (listed lost, or lost while being read)."""
    out = []
    lost = set()
    for info in await backend.gpus():
        try:
            if info.lost:
                raise NvmlFailure(f"GPU {info.index}", pynvml.NVML_ERROR_GPU_IS_LOST)
            table = await backend.profile_table(info.index)
            actual = await backend.instances(info.index) if info.mig_enabled else []
        except NvmlFailure as err:
            if not is_lost(err):
                raise
            lost.add(info.index)
            continue
        out.append(_Gpu(info, table, actual))
    return out, lost


async def _converge(
    g: _Gpu,
    want: frozenset[Instance],
    backend: NvmlBackend,
    checkpoint: Checkpoint,
    ops: list[Op],
    kept: list[str],
    problems: list[str],
    failed: list[Failure],
    errors: list[int | None],
    keep: bool = False,
) -> None:
    """Make one GPU's instances `want`: free instances it does not list destroyed (with
    `keep`, an offering node's, only half-made ones: the rest are kept for the next claim of
    their placement), then the missing ones created; what was done, kept, refused or failed
    (with the NVML error codes) is appended to the lists."""
    where = f"GPU {g.info.index}"
    if not g.info.mig_enabled:
        if want:
            problems.append(f"{where}: MIG mode is disabled")
        return
    invalid = layout_problems(g.table, sorted(want))
    if invalid:
        problems.append(f"{where}: desired layout is invalid: {invalid[0]}")
        return
    # Destroy first: new instances usually need the memory slices the old ones hold.
    for inst in g.actual:
        if inst.ci_id is not None and (keep or _key(inst) in want):
            continue
        name = f"{inst.profile}@{inst.start} on {where}"
        async with checkpoint.lock:
            reason = await _busy_reason(backend, checkpoint, inst)
            if reason is None:
                try:
                    await backend.destroy(inst.gpu, inst.profile, inst.start)
                except GpuBusy as err:
                    reason = f"in use ({err})"
                except NvmlFailure as err:
                    if err.code != pynvml.NVML_ERROR_NOT_FOUND:
                        raise
        if reason is not None:
            kept.append(f"{name} kept: {reason}")
            log.warning(
                "mig_instance_kept",
                gpu=inst.gpu,
                profile=inst.profile,
                start=inst.start,
                reason=reason,
            )
            continue
        ops.append(Op("destroy", inst.gpu, inst.profile, inst.start))
        log.info("mig_instance_destroyed", gpu=inst.gpu, profile=inst.profile, start=inst.start)
    for inst_key in sorted(want - {_key(i) for i in g.actual if i.ci_id is not None}):
        failure = await create_guarded(backend, checkpoint, g.table, g.info.index, inst_key)
        if failure is None:
            ops.append(Op("create", g.info.index, inst_key.profile, inst_key.start))
            continue
        failed.append(failure)
        if failure.reason == "NvmlError":
            errors.append(failure.code)
        problems.append(
            f"{inst_key.profile}@{inst_key.start} on {where} not created: {failure.message}"
        )


def overlaps(table: ModelTable, new: Instance, other: Instance) -> bool:
    """Whether `new` and `other` would share a memory slice."""
    if not (table.has(new.profile) and table.has(other.profile)):
        return False
    return bool(
        table.profile(new.profile).mask(new.start) & table.profile(other.profile).mask(other.start)
    )


def overlapping(table: ModelTable, taken: Iterable[Instance], new: Instance) -> Instance | None:
    """An instance of `taken` whose memory slices `new` would share (None: none)."""
    return next((t for t in taken if overlaps(table, new, t)), None)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why `create_guarded` did not create an instance (`code`: NVML's, for NvmlError)."""

    status: FailedInstance
    code: int | None = None

    @property
    def reason(self) -> str:
        return self.status.reason

    @property
    def message(self) -> str:
        return self.status.message


def _failure(
    gpu: int, inst: Instance, reason: UnusableReason, message: str, code: int | None = None
) -> Failure:
    """`inst` not made on `gpu`, and why (the message cut to what the status field holds)."""
    status = FailedInstance(
        gpu=gpu, profile=inst.profile, start=inst.start, reason=reason, message=message[:1024]
    )
    return Failure(status, code)


async def create_guarded(
    backend: NvmlBackend, checkpoint: Checkpoint, table: ModelTable, gpu: int, inst: Instance
) -> Failure | None:
    """Create `inst` on `gpu` unless it exists already or would overlap an instance that
    exists; None when it exists now, else why not. Under the checkpoint lock, so that the
    reconciler and the kubelet plugin (which creates a placement at prepare time) never create
    two overlapping instances. Nothing is ever destroyed here. A lost GPU raises."""
    async with checkpoint.lock:
        return await create_locked(backend, table, gpu, inst)


async def create_locked(
    backend: NvmlBackend, table: ModelTable, gpu: int, inst: Instance
) -> Failure | None:
    """`create_guarded` for a caller that holds the checkpoint lock already."""
    listed = await backend.instances(gpu)
    if any(_key(i) == inst and i.ci_id is not None for i in listed):
        return None
    clash = overlapping(table, [_key(i) for i in listed], inst)
    if clash is not None:
        message = (
            f"would overlap {clash.profile}@{clash.start}, which exists: nothing is"
            " destroyed to make room"
        )
        log.warning(
            "mig_instance_refused",
            gpu=gpu,
            profile=inst.profile,
            start=inst.start,
            reason=message,
        )
        return _failure(gpu, inst, "Overlap", message)
    try:
        await backend.create(gpu, inst.profile, inst.start)
    except NvmlFailure as err:
        if is_lost(err):
            raise
        log.warning(
            "mig_instance_create_failed",
            gpu=gpu,
            profile=inst.profile,
            start=inst.start,
            error=str(err),
            code=err.code,
        )
        return _failure(gpu, inst, "NvmlError", str(err), err.code)
    log.info("mig_instance_created", gpu=gpu, profile=inst.profile, start=inst.start)
    return None


async def make_room_locked(
    backend: NvmlBackend,
    checkpoint: Checkpoint,
    table: ModelTable,
    gpu: int,
    inst: Instance,
    destroyed: Callable[[], None] = lambda: None,
) -> str | None:
    """Destroy the free instances on `gpu` that `inst` would overlap, for an offering node's
    prepare (the caller holds the checkpoint lock): its pool lists every placement with the
    GPU's counters, so kube-scheduler allocated none of them while it allocated `inst`. An
    overlapping instance that is prepared or running processes stops it: why, and nothing
    destroyed (kubelet retries the prepare; its claim may be unprepared in a moment)."""
    listed = await backend.instances(gpu)
    if any(_key(i) == inst and i.ci_id is not None for i in listed):
        return None
    # a half-made instance of `inst` itself (no compute instance) too
    clashes = [i for i in listed if overlaps(table, inst, _key(i))]
    for clash in clashes:  # every one checked before any is destroyed
        reason = await _busy_reason(backend, checkpoint, clash)
        if reason is not None:
            return f"{clash.profile}@{clash.start} is in the way and {reason}"
    for clash in clashes:
        try:
            await backend.destroy(gpu, clash.profile, clash.start)
        except GpuBusy as err:
            return f"{clash.profile}@{clash.start} is in the way and in use ({err})"
        except NvmlFailure as err:
            if err.code != pynvml.NVML_ERROR_NOT_FOUND:
                raise
        destroyed()
        log.info(
            "mig_instance_destroyed_for_prepare",
            gpu=gpu,
            profile=clash.profile,
            start=clash.start,
            placement=f"{inst.profile}@{inst.start}",
        )
    return None


async def make_placement_locked(
    backend: NvmlBackend,
    checkpoint: Checkpoint,
    table: ModelTable,
    gpu: int,
    inst: Instance,
    destroyed: Callable[[], None] = lambda: None,
) -> Failure | None:
    """An offering node's placement made (the caller holds the checkpoint lock): the free
    instances in its way destroyed (`make_room_locked`), then it created (`create_locked`).
    None when it exists now; else why not: `Overlap` when an instance in use is in the way
    (NVML's IN_USE included), `NvmlError` when NVML refused the create."""
    blocked = await make_room_locked(backend, checkpoint, table, gpu, inst, destroyed)
    if blocked is None:
        return await create_locked(backend, table, gpu, inst)
    return _failure(gpu, inst, "Overlap", blocked)


async def reconcile_once(
    spec: MigNodeSpec | None,
    backend: NvmlBackend,
    checkpoint: Checkpoint,
    *,
    previous: MigNodeStatus | None = None,
    now: str | None = None,
) -> ReconcileResult:
    """Converge NVML towards `spec` once and return the resulting status and the ops done."""
    desired = spec.desired() if spec is not None else {}
    offering = spec is not None and spec.allocation == "Offer"
    ops: list[Op] = []
    problems: list[str] = []
    kept: list[str] = []
    failed: list[Failure] = []
    errors: list[int | None] = []
    gpus, lost = await read_gpus(backend)
    by_index = {g.info.index: g for g in gpus}
    for index in sorted(desired):
        if index not in by_index and index not in lost:
            problems.append(f"gpus[{index}]: no such GPU on this node")
    for g in gpus:
        want = desired.get(g.info.index)
        if want is None:
            continue
        try:
            await _converge(
                g, want, backend, checkpoint, ops, kept, problems, failed, errors, offering
            )
        except NvmlFailure as err:
            if not is_lost(err):
                raise
            log.warning("gpu_lost_mid_pass", gpu=g.info.index, error=str(err))  # seen below
    status, converged = await observe(backend, checkpoint, desired, at_least=offering)
    if problems or kept:
        converged = False
    plan_id = spec.plan_id if spec is not None else None
    observed = plan_id if converged else (previous.observed_plan_id if previous else None)
    gone = [
        f"GPU {i} lost (NVML_ERROR_GPU_IS_LOST): nothing is planned or published on it until it"
        " is back" + (", its spec is carried out then" if i in desired else "")
        for i in status.lost_gpus
    ]
    conditions = _conditions(converged, kept, problems + gone, previous, now, bool(gone))
    status = status.model_copy(
        update={
            "observed_plan_id": observed,
            "conditions": conditions,
            "failed_instances": [f.status for f in failed],
        }
    )
    return ReconcileResult(status.summarized(plan_id), ops, kept + problems, converged, errors)


async def observe(
    backend: NvmlBackend,
    checkpoint: Checkpoint,
    desired: Mapping[int, frozenset[Instance]],
    *,
    at_least: bool = False,
) -> tuple[MigNodeStatus, bool]:
    """The node's MIG state as NVML shows it, and whether its reachable GPUs equal `desired`
    (with `at_least`, an offering node's: hold at least what it lists)."""
    prepared = checkpoint.prepared()
    converged = True
    out = []
    gpus, lost = await read_gpus(backend)
    for g in gpus:
        rows = []
        for inst in g.actual:
            claims = prepared.get((inst.gpu, inst.profile, inst.start), [])
            pids = (
                await backend.processes(inst.gpu, inst.profile, inst.start)
                if inst.ci_id is not None
                else []
            )
            state: InstanceStateName = "Busy" if pids else "Prepared" if claims else "Free"
            rows.append(
                MigInstanceStatus(
                    profile=inst.profile,
                    start=inst.start,
                    uuid=inst.uuid,
                    state=state,
                    claims=claims,
                )
            )
        want = desired.get(g.info.index)
        complete = {_key(i) for i in g.actual if i.ci_id is not None}
        if want is not None:
            matches = want <= complete if at_least else complete == want
            if not matches or len(g.actual) != len(complete):
                converged = False
        out.append(
            GpuStatus(
                index=g.info.index,
                uuid=g.info.uuid,
                model=g.info.model,
                mig_enabled=g.info.mig_enabled,
                compute_slices=g.table.compute_slices,
                memory_slices=g.table.memory_slices,
                profiles=[ProfileInfo.from_profile(p) for p in g.table.profiles],
                instances=rows,
            )
        )
    return MigNodeStatus(gpus=out, lost_gpus=sorted(lost)), converged


def condition(
    type_: str,
    status: bool,
    reason: str,
    message: str,
    previous: MigNodeStatus | None,
    now: str | None,
) -> Condition:
    value: Literal["True", "False"] = "True" if status else "False"
    since = now
    for old in previous.conditions if previous else []:
        if old.type == type_ and old.status == value:
            since = old.last_transition_time or now
    return Condition(
        type=type_, status=value, reason=reason, message=message[:4000], last_transition_time=since
    )


def _conditions(
    converged: bool,
    kept: list[str],
    problems: list[str],
    previous: MigNodeStatus | None,
    now: str | None,
    lost: bool = False,
) -> list[Condition]:
    message = "; ".join(kept + problems)
    degraded_reason = (
        "InstancesKept"
        if kept
        else "GpuLost"
        if lost
        else "SpecNotApplied"
        if problems
        else "AsExpected"
    )
    return [
        condition(
            "Ready",
            converged,
            "Converged" if converged else "NotConverged",
            "" if converged else message or "reconfiguring",
            previous,
            now,
        ),
        condition("Degraded", bool(message), degraded_reason, message, previous, now),
    ]
