"""The simulator reports what real NVML reports and fails the way real NVML fails."""

from __future__ import annotations

import asyncio
import contextlib
import stat
from pathlib import Path

import pynvml
import pytest

from migpart.agent.simulator import SimFaults, SimulatedNvml, mig_uuid, parse_simulate
from migpart.errors import GpuBusy, NvmlFailure
from tests.nvml_dumps import DUMPS, assert_profile_is_dumped, dump_profiles
from tests.unit.agent.conftest import H100, H200


@pytest.mark.parametrize("dump", DUMPS)
async def test_simulator_profile_info_equals_nvml_dump(dump: str) -> None:
    model, raw_profiles = dump_profiles(dump)
    sim = SimulatedNvml([(model, 1)])
    table = await sim.profile_table(0)
    assert len(table.profiles) == len(raw_profiles)
    for raw, prof in zip(raw_profiles, table.profiles, strict=True):
        assert_profile_is_dumped(prof, raw)
    assert (await sim.gpus())[0].model == model


async def test_create_list_destroy_round_trip(sim: SimulatedNvml) -> None:
    made = await sim.create(0, "3g.40gb", 4)
    assert made.uuid == mig_uuid((await sim.gpus())[0].uuid, made.gi_id)
    assert [(i.profile, i.start) for i in await sim.instances(0)] == [("3g.40gb", 4)]
    assert await sim.instances(1) == []
    await sim.destroy(0, "3g.40gb", 4)
    assert await sim.instances(0) == []
    assert sim.calls == [
        "create_gi 0 3g.40gb@4",
        "create_ci 0 3g.40gb@4",
        "destroy_ci 0 3g.40gb@4",
        "destroy_gi 0 3g.40gb@4",
    ]


@pytest.mark.parametrize(
    ("existing", "profile", "start", "code"),
    [
        ([("3g.40gb", 0)], "1g.10gb", 2, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),  # overlap
        ([("1g.10gb+me", 0)], "1g.10gb+me", 1, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),  # limit
        ([("4g.40gb", 0), ("2g.20gb", 4)], "1g.20gb", 6, None),  # exactly 7 compute slices
        ([], "3g.40gb", 2, pynvml.NVML_ERROR_INVALID_ARGUMENT),  # not a placement
        ([], "5g.50gb", 0, pynvml.NVML_ERROR_INVALID_ARGUMENT),  # not a profile
    ],
)
async def test_create_fails_like_nvml(
    sim: SimulatedNvml,
    existing: list[tuple[str, int]],
    profile: str,
    start: int,
    code: int | None,
) -> None:
    for p, s in existing:
        await sim.create(0, p, s)
    if code is None:
        await sim.create(0, profile, start)
        return
    with pytest.raises(NvmlFailure) as info:
        await sim.create(0, profile, start)
    assert info.value.code == code
    assert len(await sim.instances(0)) == len(existing)


async def test_compute_slices_are_exhausted_before_memory() -> None:
    sim = SimulatedNvml([(H100, 1)])
    for start in range(7):
        await sim.create(0, "1g.10gb", start)
    # memory slice 7 is free, but all 7 compute slices are used
    await sim.destroy(0, "1g.10gb", 6)
    await sim.create(0, "1g.20gb", 6)
    with pytest.raises(NvmlFailure) as info:
        await sim.create(0, "1g.10gb", 6)
    assert info.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


async def test_destroy_with_processes_is_in_use_and_missing_is_not_found(
    sim: SimulatedNvml,
) -> None:
    inst = await sim.create(0, "1g.10gb", 3)
    sim.add_process(inst.uuid, 4242)
    assert await sim.processes(0, "1g.10gb", 3) == [4242]
    with pytest.raises(GpuBusy):
        await sim.destroy(0, "1g.10gb", 3)
    sim.remove_process(inst.uuid, 4242)
    await sim.destroy(0, "1g.10gb", 3)
    with pytest.raises(NvmlFailure) as info:
        await sim.destroy(0, "1g.10gb", 3)
    assert info.value.code == pynvml.NVML_ERROR_NOT_FOUND


async def test_failed_compute_instance_rolls_back_gpu_instance(sim: SimulatedNvml) -> None:
    sim.fail_next("create_ci", pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
    with pytest.raises(NvmlFailure):
        await sim.create(0, "2g.20gb", 0)
    assert await sim.instances(0) == []


async def test_uuids_are_deterministic_per_node() -> None:
    a1 = SimulatedNvml([(H100, 1)], node="a")
    a2 = SimulatedNvml([(H100, 1)], node="a")
    b = SimulatedNvml([(H100, 1)], node="b")
    assert (await a1.gpus())[0].uuid == (await a2.gpus())[0].uuid != (await b.gpus())[0].uuid
    assert (await a1.create(0, "7g.80gb", 0)).uuid == (await a2.create(0, "7g.80gb", 0)).uuid


async def test_latency_is_awaited_not_blocking() -> None:
    sim = SimulatedNvml([(H100, 1)], latency_s=0.001)
    await sim.create(0, "7g.80gb", 0)
    assert len(await sim.instances(0)) == 1


async def test_mig_disabled_gpu_refuses_mig_calls() -> None:
    sim = SimulatedNvml([(H100, 1)], mig_enabled=False)
    with pytest.raises(NvmlFailure) as info:
        await sim.create(0, "7g.80gb", 0)
    assert info.value.code == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (f"{H100}:8", [(H100, 8)]),
        (f"{H100}:2, {H200}:1", [(H100, 2), (H200, 1)]),
        (H200, [(H200, 1)]),
    ],
)
def test_parse_simulate(text: str, parsed: list[tuple[str, int]]) -> None:
    assert parse_simulate(text) == parsed


@pytest.mark.parametrize("text", ["", "NVIDIA Z9000:1", f"{H100}:0", f"{H100}:x"])
def test_parse_simulate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--simulate"):
        parse_simulate(text)


async def test_instances_outlive_the_process_with_a_state_file(tmp_path: Path) -> None:
    """A killed agent's GPUs keep their instances: a new simulator on the same file sees them,
    a half-made one (GPU instance without compute instance) included."""
    state = tmp_path / "state" / "simulated-nvml.json"
    first = SimulatedNvml([(H100, 2)], node="n", state_path=state)
    made = await first.create(0, "3g.40gb", 4)
    first.create_gpu_instance_only(1, "1g.10gb", 3)
    assert stat.S_IMODE(state.stat().st_mode) == 0o600

    again = SimulatedNvml([(H100, 2)], node="n", state_path=state)
    assert await again.instances(0) == [made]
    [half] = await again.instances(1)
    assert (half.profile, half.start, half.ci_id) == ("1g.10gb", 3, None)
    await again.destroy(0, "3g.40gb", 4)
    assert await SimulatedNvml([(H100, 2)], node="n", state_path=state).instances(0) == []


async def test_injected_insufficient_resources_and_in_use_map_like_real_ones() -> None:
    sim = SimulatedNvml([(H100, 1)], node="n", faults=SimFaults(create_insufficient=1.0))
    with pytest.raises(NvmlFailure) as failed:
        await sim.create(0, "1g.10gb", 0)
    assert failed.value.code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    sim.faults = SimFaults()
    made = await sim.create(0, "1g.10gb", 0)
    sim.faults = SimFaults(destroy_in_use=1.0)
    with pytest.raises(GpuBusy):  # what the agent turns into "kept: in use"
        await sim.destroy(0, "1g.10gb", 0)
    assert await sim.instances(0) == [made]
    assert [i.split()[0] for i in sim.injected] == ["create", "destroy"]


async def test_a_timeout_comes_before_or_after_the_operation() -> None:
    """Half the timeouts come after the driver did the work: the caller must look again."""
    outcomes = set()
    for seed in range(40):
        sim = SimulatedNvml([(H100, 1)], node="n", faults=SimFaults(timeout=1.0, seed=seed))
        code = 0
        try:
            await sim.create(0, "1g.10gb", 0)
        except NvmlFailure as err:
            code = err.code or 0
        if code:
            sim.faults = SimFaults()
            outcomes.add((code, "late" if await sim.instances(0) else "early"))
    assert outcomes == {(pynvml.NVML_ERROR_TIMEOUT, "late"), (pynvml.NVML_ERROR_TIMEOUT, "early")}


def test_the_same_seed_injects_the_same_faults() -> None:
    def run(seed: int) -> list[str]:
        sim = SimulatedNvml([(H100, 1)], node="n", faults=SimFaults(timeout=0.5, seed=seed))

        async def go() -> None:
            for _ in range(20):
                with contextlib.suppress(NvmlFailure):
                    await sim.instances(0)

        asyncio.run(go())
        return sim.injected

    assert run(7) == run(7)
    assert run(7) != run(8) or not run(7)


@pytest.mark.parametrize(
    "text", ["timeout=2", "timeout=x", "lost=a", "explode=1", "seed", "create_insufficient"]
)
def test_bad_fault_specs_are_refused_clearly(text: str) -> None:
    with pytest.raises(ValueError, match="--sim-faults: bad entry"):
        SimFaults.parse(text)


async def test_a_lost_gpu_is_listed_lost_refuses_every_call_and_comes_back(
    tmp_path: Path,
) -> None:
    """GPU_IS_LOST: the GPU stays in the list, marked lost, and every call on it fails until
    it is back, with the instances it had. The agent in its own process is made to lose one
    through the lost-GPU file next to its state file (what the chaos harness does)."""
    state = tmp_path / "simulated-nvml.json"
    sim = SimulatedNvml([(H100, 2)], node="n", state_path=state)
    made = await sim.create(1, "3g.40gb", 0)
    (tmp_path / "simulated-nvml-lost.json").write_text("[1]")
    listed = await sim.gpus()
    assert [(g.index, g.lost, g.mig_enabled) for g in listed] == [
        (0, False, True),
        (1, True, False),
    ]
    assert listed[1].uuid == (await sim.gpus())[1].uuid != ""
    calls = (
        sim.instances(1),
        sim.profile_table(1),
        sim.create(1, "1g.10gb", 6),
        sim.destroy(1, "3g.40gb", 0),
        sim.processes(1, "3g.40gb", 0),
    )
    for call in calls:
        with pytest.raises(NvmlFailure) as failed:
            await call
        assert failed.value.code == pynvml.NVML_ERROR_GPU_IS_LOST
    assert await sim.instances(0) == []  # the other GPU works
    (tmp_path / "simulated-nvml-lost.json").unlink()
    assert not any(g.lost for g in await sim.gpus())
    assert await sim.instances(1) == [made]
    sim.lose(0)
    assert sim.lost() == {0}
    sim.recover(0)
    assert sim.lost() == frozenset()
