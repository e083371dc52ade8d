"""Offer mode on the agent: a placement allocated before its instance exists is created by the
reconciler (the operator added it to the spec) or by the kubelet plugin at prepare time, under
one guard: never over an instance that exists, never destroying anything to make room, and a
refusal or an NVML error reported in `status.failedInstances` (and once as a Warning Event)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import pynvml
import pytest

from migpart.agent.cdi import CdiWriter
from migpart.agent.metrics import AgentMetrics
from migpart.agent.plugin import ClaimRef, DraDriver, PrepareError
from migpart.agent.reconciler import reconcile_once
from migpart.agent.runner import Agent
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import FailedInstance
from migpart.slices.dra import DRIVER, AllocatedDevice
from migpart.testing.claims import InMemoryClaims
from migpart.testing.mignodes import InMemoryMigNodes
from tests.unit.agent.helpers import layout, one_gpu, prepare

if TYPE_CHECKING:
    from pathlib import Path

    from migpart.agent.checkpoint import Checkpoint

NODE = "node-a"


async def test_a_placement_over_a_kept_instance_is_refused_without_nvml(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """The spec drops a prepared 3g.40gb@4 for a 7g.80gb@0: the prepared one is kept, and
    7g.80gb@0 would overlap it: refused before any NVML create call (NVML would refuse too,
    but nothing may depend on that)."""
    await reconcile_once(one_gpu("p1", ("3g.40gb", 0), ("3g.40gb", 4)), sim, checkpoint)
    held = (await sim.instances(0))[1]
    prepare(checkpoint, "u1", held)
    sim.calls.clear()
    result = await reconcile_once(one_gpu("p2", ("7g.80gb", 0)), sim, checkpoint)
    assert await layout(sim) == [("3g.40gb", 4)]  # the free one went, the prepared one stayed
    assert not [c for c in sim.calls if c.startswith("create")]
    assert result.status.failed_instances == [
        FailedInstance(
            gpu=0,
            profile="7g.80gb",
            start=0,
            reason="Overlap",
            message="would overlap 3g.40gb@4, which exists: nothing is destroyed to make room",
        )
    ]
    assert not result.converged
    assert result.nvml_errors == []


async def test_an_nvml_error_at_create_is_reported_and_touches_nothing_else(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    first = await reconcile_once(one_gpu("p1", ("3g.40gb", 0)), sim, checkpoint)
    before = await sim.instances(0)
    sim.fail_next("create_gi", pynvml.NVML_ERROR_UNKNOWN)
    sim.calls.clear()
    result = await reconcile_once(
        one_gpu("p2", ("3g.40gb", 0), ("3g.40gb", 4)), sim, checkpoint, previous=first.status
    )
    assert await sim.instances(0) == before  # the existing instance is as it was
    assert sim.calls == []  # no destroy, nothing half-created left
    [failed] = result.status.failed_instances
    assert (failed.profile, failed.start, failed.reason) == ("3g.40gb", 4, "NvmlError")
    assert "NVML_ERROR_UNKNOWN" in failed.message
    assert result.nvml_errors == [pynvml.NVML_ERROR_UNKNOWN]
    assert result.status.observed_plan_id == "p1"
    # the next pass (NVML well again) creates it and clears the report
    again = await reconcile_once(
        one_gpu("p2", ("3g.40gb", 0), ("3g.40gb", 4)), sim, checkpoint, previous=result.status
    )
    assert again.converged
    assert again.status.failed_instances == []


async def test_the_agent_warns_once_per_failure(sim: SimulatedNvml, checkpoint: Checkpoint) -> None:
    await sim.create(0, "3g.40gb", 4)
    prepare(checkpoint, "u1", (await sim.instances(0))[0])
    store = InMemoryMigNodes(one_gpu("p1", ("7g.80gb", 0)))
    agent = Agent(NODE, sim, checkpoint, store, AgentMetrics(NODE), resync_s=3600)
    agent.spec = store.spec
    await agent.reconcile()
    await agent.reconcile()
    assert store.warnings == [
        (
            "InstanceRefused",
            "7g.80gb@0 on GPU 0: would overlap 3g.40gb@4, which exists: nothing is destroyed"
            " to make room",
        )
    ]
    assert store.statuses[-1].failed_instances[0].reason == "Overlap"


async def test_an_nvml_create_error_is_retried_with_back_off(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes(one_gpu("p1", ("3g.40gb", 4)))
    sim.fail_next("create_gi", pynvml.NVML_ERROR_UNKNOWN)
    agent = Agent(NODE, sim, checkpoint, store, AgentMetrics(NODE), resync_s=3600, backoff_s=0.001)
    task = asyncio.create_task(agent.run())
    try:
        failed = await store.wait_for(lambda s: s.failed_instances)
        done = await store.wait_for(lambda s: s.observed_plan_id == "p1")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert failed.failed_instances[0].reason == "NvmlError"
    assert done.failed_instances == []
    assert store.warnings[0][0] == "InstanceNotCreated"


def driver(tmp_path: Path, sim: SimulatedNvml, claims: InMemoryClaims, cp: Checkpoint) -> DraDriver:
    return DraDriver(NODE, sim, claims, cp, CdiWriter(tmp_path / "cdi", caps_root=None))


async def test_prepare_creates_a_placement_not_created_yet(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    claims = InMemoryClaims()
    claims.put("team", "c1", "uid-1", [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-3g40gb-4")])
    devices = await driver(tmp_path, sim, claims, checkpoint).prepare(
        ClaimRef("team", "uid-1", "c1")
    )
    assert [(d.device, d.profile, d.start) for d in devices] == [("gpu-0-3g40gb-4", "3g.40gb", 4)]
    assert await layout(sim) == [("3g.40gb", 4)]
    assert checkpoint.prepared() == {(0, "3g.40gb", 4): ["team/c1"]}


async def test_two_prepares_of_overlapping_placements_create_only_one(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """Two claims allocated overlapping placements (a stale slice): prepared at once, one
    gets its instance, the other an error; the first one's instance is left alone."""
    claims = InMemoryClaims()
    claims.put("team", "a", "uid-a", [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-4g40gb-0")])
    claims.put("team", "b", "uid-b", [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-7g80gb-0")])
    plugin = driver(tmp_path, sim, claims, checkpoint)
    outcomes = await asyncio.gather(
        plugin.prepare(ClaimRef("team", "uid-a", "a")),
        plugin.prepare(ClaimRef("team", "uid-b", "b")),
        return_exceptions=True,
    )
    assert not isinstance(outcomes[0], BaseException)
    assert isinstance(outcomes[1], PrepareError)
    assert "would overlap 4g.40gb@0" in str(outcomes[1])
    assert await layout(sim) == [("4g.40gb", 0)]
    assert checkpoint.prepared() == {(0, "4g.40gb", 0): ["team/a"]}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_NO_PERMISSION])
async def test_prepare_reports_an_nvml_error_and_records_nothing(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint, code: int
) -> None:
    claims = InMemoryClaims()
    claims.put("team", "c1", "uid-1", [AllocatedDevice("gpu", DRIVER, NODE, "gpu-0-3g40gb-4")])
    sim.fail_next("create_ci", code)
    with pytest.raises(PrepareError, match="gpu-0-3g40gb-4 not created"):
        await driver(tmp_path, sim, claims, checkpoint).prepare(ClaimRef("team", "uid-1", "c1"))
    assert await layout(sim) == []  # the GPU instance was rolled back
    assert checkpoint.claims() == []
