"""The reconciler converges to MigNode.spec and never destroys what a workload holds."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migpart.agent.checkpoint import Checkpoint
from migpart.agent.reconciler import Op, reconcile_once
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import GpuSpec, MigInstanceSpec, MigNodeSpec, condition_status
from migpart.mig import CATALOG, Instance, enumerate_layouts
from tests.unit.agent.conftest import H100
from tests.unit.agent.helpers import layout, prepare

if TYPE_CHECKING:
    from pathlib import Path

    from migpart.agent.backend import GpuInfo, MigInstance
    from migpart.mig import ModelTable


def spec(plan: str | None, *gpus: list[tuple[str, int]]) -> MigNodeSpec:
    return MigNodeSpec(
        plan_id=plan,
        gpus=[
            GpuSpec(index=i, instances=[MigInstanceSpec(profile=p, start=s) for p, s in g])
            for i, g in enumerate(gpus)
        ],
    )


async def test_converges_reports_and_is_idempotent(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    want = spec("p1", [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)], [])
    first = await reconcile_once(want, sim, checkpoint, now="t0")
    assert first.converged
    assert first.ops == [
        Op("create", 0, "1g.10gb", 6),
        Op("create", 0, "2g.20gb", 4),
        Op("create", 0, "3g.40gb", 0),
    ]
    status = first.status
    assert status.observed_plan_id == "p1"
    assert condition_status(status.conditions, "Ready") == "True"
    assert condition_status(status.conditions, "Degraded") == "False"
    gpu0 = status.gpus[0]
    assert gpu0.model == H100
    assert gpu0.mig_enabled
    assert (gpu0.compute_slices, gpu0.memory_slices) == (7, 8)
    assert {p.name for p in gpu0.profiles} == set(CATALOG[H100].profile_names)
    assert [(i.profile, i.start, i.state) for i in gpu0.instances] == [
        ("3g.40gb", 0, "Free"),
        ("2g.20gb", 4, "Free"),
        ("1g.10gb", 6, "Free"),
    ]
    assert all(i.uuid.startswith("MIG-") for i in gpu0.instances)
    assert status.summary is not None
    assert (status.summary.gpus, status.summary.instances, status.summary.free) == (2, 3, 3)
    assert status.summary.synced
    again = await reconcile_once(want, sim, checkpoint, previous=status, now="t1")
    assert again.ops == []
    assert again.status == status  # transition times kept: nothing changed


async def test_destroys_before_creating(sim: SimulatedNvml, checkpoint: Checkpoint) -> None:
    await reconcile_once(spec("p1", [("7g.80gb", 0)]), sim, checkpoint)
    sim.calls.clear()
    result = await reconcile_once(spec("p2", [("3g.40gb", 0), ("3g.40gb", 4)]), sim, checkpoint)
    assert result.converged
    assert sim.calls[:2] == ["destroy_ci 0 7g.80gb@0", "destroy_gi 0 7g.80gb@0"]
    assert await layout(sim) == [("3g.40gb", 0), ("3g.40gb", 4)]


@pytest.mark.parametrize(
    "no_plan",
    [None, MigNodeSpec(), MigNodeSpec(gpus=[GpuSpec(index=0, instances=[])])],
    ids=["no-spec", "spec-without-plan", "gpus-without-plan"],
)
async def test_without_a_plan_nothing_is_touched(
    sim: SimulatedNvml, checkpoint: Checkpoint, no_plan: MigNodeSpec | None
) -> None:
    await sim.create(0, "7g.80gb", 0)
    result = await reconcile_once(no_plan, sim, checkpoint)
    assert result.ops == []
    assert await layout(sim) == [("7g.80gb", 0)]
    assert result.status.observed_plan_id is None
    # Without a planId the operator publishes the instance and may plan it as it is (its
    # slice and snapshot read `MigNodeSpec.desired()` too): destroying it here would race
    # with kube-scheduler outside the destroy protocol.


async def test_gpus_not_in_the_spec_are_left_alone(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    await sim.create(1, "7g.80gb", 0)
    result = await reconcile_once(spec("p1", [("7g.80gb", 0)]), sim, checkpoint)
    assert result.converged
    assert await layout(sim, 1) == [("7g.80gb", 0)]


async def test_prepared_instance_survives_being_dropped(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    first = await reconcile_once(spec("p1", [("3g.40gb", 0), ("3g.40gb", 4)]), sim, checkpoint)
    held = (await sim.instances(0))[1]
    prepare(checkpoint, "u1", held)
    result = await reconcile_once(
        spec("p2", [("7g.80gb", 0)]), sim, checkpoint, previous=first.status
    )
    assert await layout(sim) == [("3g.40gb", 4)]  # the free one went, the prepared one stayed
    assert not result.converged
    status = result.status
    assert status.observed_plan_id == "p1"
    assert condition_status(status.conditions, "Degraded") == "True"
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert degraded.reason == "InstancesKept"
    assert "3g.40gb@4 on GPU 0 kept: prepared for claim default/claim-u1" in degraded.message
    assert "7g.80gb@0 on GPU 0 not created" in degraded.message
    row = status.gpus[0].instances[0]
    assert (row.state, row.claims) == ("Prepared", ["default/claim-u1"])
    # once the claim is unprepared, the next pass finishes the plan
    checkpoint.remove("u1")
    done = await reconcile_once(spec("p2", [("7g.80gb", 0)]), sim, checkpoint)
    assert done.converged
    assert done.status.observed_plan_id == "p2"


async def test_busy_instance_survives_being_dropped(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    await reconcile_once(spec("p1", [("1g.10gb", 0), ("1g.10gb", 1)]), sim, checkpoint)
    busy = (await sim.instances(0))[0]
    sim.add_process(busy.uuid, 777)
    result = await reconcile_once(spec("p2", []), sim, checkpoint)
    assert await layout(sim) == [("1g.10gb", 0)]
    assert result.status.gpus[0].instances[0].state == "Busy"
    assert "1g.10gb@0 on GPU 0 kept: running processes 777" in result.problems[0]


class _RacingProcessBackend:
    """A backend where a process starts on the instance between listing and destroying."""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim

    async def gpus(self) -> list[GpuInfo]:
        return await self.sim.gpus()

    async def profile_table(self, gpu: int) -> ModelTable:
        return await self.sim.profile_table(gpu)

    async def instances(self, gpu: int) -> list[MigInstance]:
        return await self.sim.instances(gpu)

    async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        return await self.sim.create(gpu, profile, start)

    async def processes(self, gpu: int, profile: str, start: int) -> list[int]:
        found = await self.sim.processes(gpu, profile, start)
        for inst in await self.sim.instances(gpu):
            self.sim.add_process(inst.uuid, 99)  # starts right after the check
        return found

    async def destroy(self, gpu: int, profile: str, start: int) -> None:
        await self.sim.destroy(gpu, profile, start)

    async def close(self) -> None:
        return None


async def test_in_use_at_destroy_time_is_kept(sim: SimulatedNvml, checkpoint: Checkpoint) -> None:
    await sim.create(0, "7g.80gb", 0)
    result = await reconcile_once(spec("p", []), _RacingProcessBackend(sim), checkpoint)
    assert await layout(sim) == [("7g.80gb", 0)]
    assert "in use" in result.problems[0]


async def test_half_created_instance_is_replaced(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    sim.create_gpu_instance_only(0, "4g.40gb", 0)
    assert (await sim.instances(0))[0].ci_id is None
    result = await reconcile_once(spec("p", [("4g.40gb", 0)]), sim, checkpoint)
    assert result.converged
    assert [i.ci_id is not None for i in await sim.instances(0)] == [True]
    assert result.ops == [Op("destroy", 0, "4g.40gb", 0), Op("create", 0, "4g.40gb", 0)]


async def test_invalid_spec_is_reported_not_applied(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    result = await reconcile_once(spec("p", [("3g.40gb", 0), ("4g.40gb", 0)]), sim, checkpoint)
    assert result.ops == []
    degraded = next(c for c in result.status.conditions if c.type == "Degraded")
    assert degraded.reason == "SpecNotApplied"
    assert "overlaps" in degraded.message


class Crash(Exception):
    """The agent process dying in the middle of a reconcile."""


class _CrashAfter(_RacingProcessBackend):
    """Passes calls through to the simulator and dies after `ops` create/destroy calls."""

    def __init__(self, sim: SimulatedNvml, ops: int) -> None:
        super().__init__(sim)
        self.left = ops

    async def processes(self, gpu: int, profile: str, start: int) -> list[int]:
        return await self.sim.processes(gpu, profile, start)

    def _tick(self) -> None:
        if self.left == 0:
            raise Crash
        self.left -= 1

    async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        self._tick()
        return await self.sim.create(gpu, profile, start)

    async def destroy(self, gpu: int, profile: str, start: int) -> None:
        self._tick()
        await self.sim.destroy(gpu, profile, start)


@pytest.mark.parametrize("crash_after", range(6))
async def test_killed_mid_reconcile_and_restarted_converges(
    tmp_path: Path, crash_after: int
) -> None:
    sim = SimulatedNvml([(H100, 1)])
    path = tmp_path / "checkpoint.json"
    first = Checkpoint(path)
    await reconcile_once(
        spec("p1", [("1g.10gb", s) for s in range(4)] + [("3g.40gb", 4)]), sim, first
    )
    prepare(first, "u1", (await sim.instances(0))[4])  # 3g.40gb@4 is in use
    target = spec("p2", [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)])
    with pytest.raises(Crash):
        await reconcile_once(target, _CrashAfter(sim, crash_after), first)
    # a fresh process: new checkpoint object read from disk, same GPUs
    result = await reconcile_once(target, sim, Checkpoint(path))
    assert result.converged
    assert await layout(sim) == [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert "destroy_gi 0 3g.40gb@4" not in sim.calls


H100_LAYOUTS = enumerate_layouts(CATALOG[H100], frozenset())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plans=st.lists(st.sampled_from(H100_LAYOUTS), min_size=1, max_size=4),
    hold=st.lists(st.booleans(), min_size=8, max_size=8),
    crash=st.lists(st.integers(min_value=0, max_value=6) | st.none(), min_size=4, max_size=4),
)
async def test_random_plans_never_destroy_held_instances(
    plans: list[frozenset[Instance]], hold: list[bool], crash: list[int | None]
) -> None:
    sim = SimulatedNvml([(H100, 1)])
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Checkpoint(Path(tmp) / "c.json")
        held: set[tuple[str, int, str]] = set()
        for n, plan in enumerate(plans):
            target = spec(f"p{n}", sorted((i.profile, i.start) for i in plan))
            after = crash[n]
            if after is not None:
                with contextlib.suppress(Crash):
                    await reconcile_once(target, _CrashAfter(sim, after), checkpoint)
            result = await reconcile_once(target, sim, checkpoint)
            now = {(i.profile, i.start, i.uuid) for i in await sim.instances(0)}
            assert held <= now  # nothing prepared was ever destroyed
            if not held:
                assert result.converged
                assert {Instance(p, s) for p, s, _ in now} == plan
            for i, inst in enumerate(await sim.instances(0)):
                if hold[i] and (inst.profile, inst.start, inst.uuid) not in held:
                    prepare(checkpoint, f"u{n}-{i}", inst)
                    held.add((inst.profile, inst.start, inst.uuid))


async def test_a_lost_gpu_does_not_hold_the_plan_back(checkpoint: Checkpoint) -> None:
    """A spec naming a GPU that is lost (GPU_IS_LOST) is carried out on the others and
    observed: the lost GPU cannot hold the node's plan, and the operator's
    `maxConcurrentNodes` slot, forever. The GPU is reported lost and left out of `gpus`;
    once it is back the spec is carried out on it."""
    sim = SimulatedNvml([(H100, 2)], node="n")
    sim.lose(1)
    want = spec("p1", [("3g.40gb", 0)], [("7g.80gb", 0)])
    lost = await reconcile_once(want, sim, checkpoint, now="t0")
    assert lost.converged
    assert lost.status.observed_plan_id == "p1"
    assert [g.index for g in lost.status.gpus] == [0]
    assert lost.status.lost_gpus == [1]
    assert lost.ops == [Op("create", 0, "3g.40gb", 0)]
    degraded = next(c for c in lost.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "GpuLost")
    assert "GPU 1 lost" in degraded.message
    assert "carried out then" in degraded.message
    assert condition_status(lost.status.conditions, "Ready") == "True"

    sim.recover(1)
    back = await reconcile_once(want, sim, checkpoint, previous=lost.status, now="t1")
    assert back.ops == [Op("create", 1, "7g.80gb", 0)]
    assert back.status.lost_gpus == []
    assert [g.index for g in back.status.gpus] == [0, 1]
    assert condition_status(back.status.conditions, "Degraded") == "False"


async def test_a_gpu_lost_mid_pass_is_reported_not_raised(checkpoint: Checkpoint) -> None:
    class LosesOnCreate(SimulatedNvml):
        async def create(self, gpu: int, profile: str, start: int) -> MigInstance:
            if gpu == 1:
                self.lose(1)  # falls off the bus as it is being changed
            return await super().create(gpu, profile, start)

    sim = LosesOnCreate([(H100, 2)], node="n")
    result = await reconcile_once(
        spec("p1", [("3g.40gb", 0)], [("7g.80gb", 0)]), sim, checkpoint, now="t0"
    )
    assert result.status.lost_gpus == [1]
    assert result.status.observed_plan_id == "p1"


async def test_a_missing_gpu_still_holds_the_plan_back(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """Only a lost GPU is excused: an index the node never had is the spec's error."""
    want = spec("p1", [], [], [("7g.80gb", 0)])  # the node has GPUs 0 and 1
    result = await reconcile_once(want, sim, checkpoint, now="t0")
    assert not result.converged
    assert result.status.observed_plan_id is None
    assert "gpus[2]: no such GPU on this node" in result.problems
