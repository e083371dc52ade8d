"""An offering node's prepare (`MigNodeSpec.allocation: Offer`, issue 35): the allocated
placement's instance is made at NodePrepareResources, a free instance in the way is destroyed
first, one still prepared or running is never destroyed (kubelet retries), the instance stays
after unprepare for the next claim of its placement, and the reconciler keeps it. An agent
killed between the destroy and the create, or between the create and the CDI write, comes
back to a state where a retried prepare finishes and nothing prepared was destroyed.

Every test here that destroys tries to make it destroy an instance in use."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pynvml
import pytest

from migpart.agent.cdi import CdiWriter
from migpart.agent.checkpoint import Checkpoint
from migpart.agent.plugin import ClaimRef, DraDriver, PrepareError
from migpart.agent.reconciler import reconcile_once
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import GpuSpec, MigInstanceSpec, MigNodeSpec
from migpart.slices.dra import DRIVER, AllocatedDevice
from migpart.testing.claims import InMemoryClaims
from tests.unit.agent.helpers import layout, prepare

NODE = "node-a"
H100 = "NVIDIA H100 80GB HBM3"


def offering(*instances: tuple[str, int]) -> MigNodeSpec:
    """An offering node's spec: GPU 0 lists `instances` (made ahead)."""
    listed = [MigInstanceSpec(profile=p, start=s) for p, s in instances]
    return MigNodeSpec(
        plan_id="offer", allocation="Offer", gpus=[GpuSpec(index=0, instances=listed)]
    )


def driver(
    root: Path, sim: SimulatedNvml, claims: InMemoryClaims, cp: Checkpoint, offer: bool = True
) -> DraDriver:
    return DraDriver(
        NODE, sim, claims, cp, CdiWriter(root / "cdi", caps_root=None), offering=lambda: offer
    )


def claim(claims: InMemoryClaims, name: str, device: str) -> ClaimRef:
    claims.put("team", name, f"uid-{name}", [AllocatedDevice("gpu", DRIVER, NODE, device)])
    return ClaimRef("team", f"uid-{name}", name)


async def test_a_free_instance_in_the_way_is_destroyed_then_the_placement_created(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    await sim.create(0, "1g.10gb", 0)
    await sim.create(0, "1g.10gb", 6)  # not in the way of 4g.40gb@0: stays
    claims = InMemoryClaims()
    sim.calls.clear()
    plugin = driver(tmp_path, sim, claims, checkpoint)
    counted: list[str] = []
    plugin.counted = counted.append
    await plugin.prepare(claim(claims, "a", "gpu-0-4g40gb-0"))
    assert counted == ["destroy", "create"]  # the agent's migpart_agent_mig_operations_total
    assert sim.calls == [
        "destroy_ci 0 1g.10gb@0",
        "destroy_gi 0 1g.10gb@0",
        "create_gi 0 4g.40gb@0",
        "create_ci 0 4g.40gb@0",
    ]
    assert sorted(await layout(sim)) == [("1g.10gb", 6), ("4g.40gb", 0)]
    assert checkpoint.prepared() == {(0, "4g.40gb", 0): ["team/a"]}


async def test_an_instance_in_the_way_still_prepared_is_never_destroyed(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """kubelet may prepare the next claim before it unprepared the last one (the scheduler
    freed the counters when the pod ended): an error kubelet retries, nothing destroyed."""
    await sim.create(0, "1g.10gb", 0)
    await sim.create(0, "1g.10gb", 1)  # free, also in the way: not destroyed either
    prepare(checkpoint, "old", (await sim.instances(0))[0])
    claims = InMemoryClaims()
    sim.calls.clear()
    with pytest.raises(PrepareError, match=r"1g\.10gb@0 is in the way and prepared for claim"):
        await driver(tmp_path, sim, claims, checkpoint).prepare(
            claim(claims, "a", "gpu-0-4g40gb-0")
        )
    assert sim.calls == []
    assert await layout(sim) == [("1g.10gb", 0), ("1g.10gb", 1)]
    checkpoint.remove("old")  # kubelet unprepares it; its retry of the new claim goes through
    await driver(tmp_path, sim, claims, checkpoint).prepare(claim(claims, "a", "gpu-0-4g40gb-0"))
    assert await layout(sim) == [("4g.40gb", 0)]


async def test_a_prepare_waits_for_the_unprepare_of_the_claim_in_its_way(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """Rather than fail into kubelet's back-off (tens of seconds after a few tries), a
    prepare blocked by another claim's prepared instance waits for kubelet's unprepare of it,
    which comes as the old pod stops, and then goes through."""
    await sim.create(0, "1g.10gb", 0)
    claims = InMemoryClaims()
    plugin = DraDriver(
        NODE,
        sim,
        claims,
        checkpoint,
        CdiWriter(tmp_path / "cdi", caps_root=None),
        offering=lambda: True,
        unprepare_wait_s=3600.0,  # never reached: the unprepare below ends the wait
    )
    await plugin.prepare(claim(claims, "old", "gpu-0-1g10gb-0"))
    waiting = asyncio.create_task(plugin.prepare(claim(claims, "a", "gpu-0-4g40gb-0")))
    for _ in range(20):  # let the prepare try and start waiting
        await asyncio.sleep(0)
    assert not waiting.done()
    assert await layout(sim) == [("1g.10gb", 0)]  # prepared: never destroyed while it waits
    await plugin.unprepare(ClaimRef("team", "uid-old", "old"))
    [device] = await waiting
    assert (device.profile, device.start) == ("4g.40gb", 0)
    assert await layout(sim) == [("4g.40gb", 0)]


async def test_an_instance_in_the_way_running_processes_is_never_destroyed(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    running = await sim.create(0, "2g.20gb", 2)
    sim.add_process(running.uuid, 4242)
    claims = InMemoryClaims()
    sim.calls.clear()
    with pytest.raises(PrepareError, match="running processes 4242"):
        await driver(tmp_path, sim, claims, checkpoint).prepare(
            claim(claims, "a", "gpu-0-3g40gb-0")
        )
    assert sim.calls == []


async def test_a_node_that_does_not_offer_destroys_nothing_to_make_room(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """Reactive mode's pool has no counters: the instance in the way may be allocated to
    another claim, so only an offering node makes room."""
    await sim.create(0, "1g.10gb", 0)
    claims = InMemoryClaims()
    sim.calls.clear()
    with pytest.raises(PrepareError, match="nothing is destroyed to make room"):
        await driver(tmp_path, sim, claims, checkpoint, offer=False).prepare(
            claim(claims, "a", "gpu-0-4g40gb-0")
        )
    assert sim.calls == []


async def test_the_instance_stays_after_unprepare_and_the_next_claim_reuses_it(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    claims = InMemoryClaims()
    plugin = driver(tmp_path, sim, claims, checkpoint)
    first = claim(claims, "a", "gpu-0-3g40gb-4")
    [made] = await plugin.prepare(first)
    await plugin.unprepare(first)
    spec = offering()  # an offering node's reconciler keeps what prepare made
    result = await reconcile_once(spec, sim, checkpoint)
    assert result.ops == []
    assert result.converged
    sim.calls.clear()
    [reused] = await plugin.prepare(claim(claims, "b", "gpu-0-3g40gb-4"))
    assert sim.calls == []  # warm: no create
    assert reused.uuid == made.uuid


async def test_an_offering_spec_makes_what_it_lists_and_destroys_nothing(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    await sim.create(0, "1g.10gb", 6)  # made at a prepare, free now
    result = await reconcile_once(offering(("3g.40gb", 0)), sim, checkpoint)
    assert sorted(await layout(sim)) == [("1g.10gb", 6), ("3g.40gb", 0)]
    assert [op.kind for op in result.ops] == ["create"]
    assert result.converged  # at least what it lists


async def test_a_half_made_instance_of_the_placement_is_replaced(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """A create that made the GPU instance and failed at the compute instance left nothing
    usable: prepare on an offering node clears it and makes the placement."""
    sim.fail_next("create_ci", pynvml.NVML_ERROR_UNKNOWN)
    claims = InMemoryClaims()
    plugin = driver(tmp_path, sim, claims, checkpoint)
    ref = claim(claims, "a", "gpu-0-3g40gb-4")
    with pytest.raises(PrepareError):
        await plugin.prepare(ref)
    [device] = await plugin.prepare(ref)
    assert (device.profile, device.start) == ("3g.40gb", 4)
    assert await layout(sim) == [("3g.40gb", 4)]


class _Killed(BaseException):
    """The agent process dies here (nothing after it runs, no handler catches it)."""


async def test_an_agent_killed_between_destroy_and_create_finishes_on_the_retry(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml.json"
    sim = SimulatedNvml([(H100, 1)], node=NODE, state_path=state)
    kept = await sim.create(0, "1g.10gb", 6)
    await sim.create(0, "1g.10gb", 0)
    checkpoint = Checkpoint(tmp_path / "state" / "checkpoint.json")
    prepare(checkpoint, "running", kept)
    claims = InMemoryClaims()
    ref = claim(claims, "a", "gpu-0-4g40gb-0")

    async def die(gpu: int, profile: str, start: int) -> None:
        raise _Killed

    sim.create = die  # type: ignore[assignment,method-assign]
    with pytest.raises(_Killed):
        await driver(tmp_path, sim, claims, checkpoint).prepare(ref)
    # a new process: NVML and the checkpoint as they were left
    again = SimulatedNvml([(H100, 1)], node=NODE, state_path=state)
    assert await layout(again) == [("1g.10gb", 6)]  # the free one went, nothing was made
    reloaded = Checkpoint(tmp_path / "state" / "checkpoint.json")
    await driver(tmp_path, again, claims, reloaded).prepare(ref)
    assert sorted(await layout(again)) == [("1g.10gb", 6), ("4g.40gb", 0)]
    assert reloaded.prepared() == {
        (0, "1g.10gb", 6): ["default/claim-running"],
        (0, "4g.40gb", 0): ["team/a"],
    }


async def test_an_agent_killed_between_create_and_the_cdi_write_reuses_the_instance(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml.json"
    sim = SimulatedNvml([(H100, 1)], node=NODE, state_path=state)
    checkpoint = Checkpoint(tmp_path / "state" / "checkpoint.json")
    claims = InMemoryClaims()
    ref = claim(claims, "a", "gpu-0-7g80gb-0")
    plugin = driver(tmp_path, sim, claims, checkpoint)

    def die(claim_uid: str, devices: object) -> None:
        raise _Killed

    plugin.cdi.write = die  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        await plugin.prepare(ref)
    assert checkpoint.claims() == []  # not recorded: kubelet was told nothing
    again = SimulatedNvml([(H100, 1)], node=NODE, state_path=state)
    [made] = await again.instances(0)
    again.calls.clear()
    reloaded = Checkpoint(tmp_path / "state" / "checkpoint.json")
    [device] = await driver(tmp_path, again, claims, reloaded).prepare(ref)
    assert again.calls == []  # the instance made before the kill, not a new one
    assert device.uuid == made.uuid
    assert (tmp_path / "cdi").is_dir()
    assert any((tmp_path / "cdi").iterdir())
