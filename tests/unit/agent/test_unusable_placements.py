"""A placement an offering node keeps failing to make at prepare (issue 35, item 4): after
`FAILURES_BEFORE_UNUSABLE` failed prepares in a row it is reported in `status.failedInstances`
(the operator taints its device NoExecute), a successful prepare or a retry of the agent's pass
(with back-off, on the agent's clock) clears it, and a retry never destroys an instance in use.
A node that does not offer is left as it was. Time moves only by `ManualClock.advance`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import pynvml
import pytest

from migpart.agent.cdi import CdiWriter
from migpart.agent.checkpoint import Checkpoint
from migpart.agent.failures import (
    FAILURES_BEFORE_UNUSABLE,
    RETRY_FIRST_S,
    PlacementFailures,
    retry_due,
)
from migpart.agent.metrics import AgentMetrics
from migpart.agent.plugin import ClaimRef, DraDriver, PrepareError
from migpart.agent.runner import Agent
from migpart.api.models import GpuSpec, MigInstanceSpec, MigNodeSpec
from migpart.clock import ManualClock
from migpart.slices.dra import DRIVER, AllocatedDevice
from migpart.testing.claims import InMemoryClaims
from migpart.testing.mignodes import InMemoryMigNodes
from tests.unit.agent.helpers import layout, prepare, running

if TYPE_CHECKING:
    from pathlib import Path

    from migpart.agent.simulator import SimulatedNvml

NODE = "node-a"
DEVICE = "gpu-0-3g40gb-4"


def spec(
    allocation: Literal["Offer", "Reactive"] = "Offer", *instances: tuple[str, int]
) -> MigNodeSpec:
    """A spec of plan p1 that lists `instances` on GPU 0."""
    listed = [MigInstanceSpec(profile=p, start=s) for p, s in instances]
    return MigNodeSpec(
        plan_id="p1", allocation=allocation, gpus=[GpuSpec(index=0, instances=listed)]
    )


class Node:
    """One node's agent loop and kubelet plugin, sharing their failure counts, on a manual
    clock."""

    def __init__(
        self,
        tmp_path: Path,
        sim: SimulatedNvml,
        checkpoint: Checkpoint,
        node_spec: MigNodeSpec | None = None,
    ) -> None:
        self.sim = sim
        self.clock = ManualClock()
        self.store = InMemoryMigNodes(node_spec or spec())
        self.metrics = AgentMetrics(NODE)
        self.agent = Agent(
            NODE, sim, checkpoint, self.store, self.metrics, resync_s=3600, clock=self.clock
        )
        self.agent.spec = self.store.spec
        self.claims = InMemoryClaims()
        self.plugin = DraDriver(
            NODE,
            sim,
            self.claims,
            checkpoint,
            CdiWriter(tmp_path / "cdi", caps_root=None),
            on_change=self.agent.poke,
            offering=self.agent.offering,
            failures=self.agent.failures,
        )

    def claim(self, name: str, device: str = DEVICE) -> ClaimRef:
        self.claims.put("team", name, f"uid-{name}", [AllocatedDevice("gpu", DRIVER, NODE, device)])
        return ClaimRef("team", f"uid-{name}", name)

    async def fail_prepares(self, ref: ClaimRef, times: int, code: int | None = None) -> None:
        """`times` prepares of `ref` that fail (with NVML's `code` at create, if given)."""
        for _ in range(times):
            if code is not None:
                self.sim.fail_next("create_gi", code)
            with pytest.raises(PrepareError):
                await self.plugin.prepare(ref)

    def unusable_gauge(self, reason: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "migpart_agent_unusable_placements", {"node": NODE, "reason": reason}
        )


INSUFFICIENT = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES


async def test_three_failed_creates_report_the_placement(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    node = Node(tmp_path, sim, checkpoint)
    ref = node.claim("a")
    await node.fail_prepares(ref, FAILURES_BEFORE_UNUSABLE - 1, INSUFFICIENT)
    await node.agent.reconcile()
    assert node.store.statuses[-1].failed_instances == []
    await node.fail_prepares(ref, 1, INSUFFICIENT)
    assert node.agent.trigger.is_set()  # the loop is asked to report it
    await node.agent.reconcile()
    [failed] = node.store.statuses[-1].failed_instances
    assert (failed.gpu, failed.profile, failed.start, failed.reason) == (
        0,
        "3g.40gb",
        4,
        "NvmlError",
    )
    assert failed.message.startswith("3 prepares in a row failed; the last: create 3g.40gb@4")
    assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in failed.message
    assert node.store.warnings == [("PlacementUnusable", f"3g.40gb@4 on GPU 0: {failed.message}")]
    assert node.unusable_gauge("NvmlError") == 1
    assert node.unusable_gauge("Overlap") == 0
    # a fourth failure counts on in the message, without a second Event
    await node.fail_prepares(ref, 1, INSUFFICIENT)
    await node.agent.reconcile()
    [again] = node.store.statuses[-1].failed_instances
    assert again.message.startswith("4 prepares in a row failed")
    assert [reason for reason, _ in node.store.warnings] == ["PlacementUnusable"]
    assert await layout(sim) == []  # nothing made, nothing half made


async def test_two_failures_then_a_prepare_that_works_never_report(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    node = Node(tmp_path, sim, checkpoint)
    ref = node.claim("a")
    await node.fail_prepares(ref, FAILURES_BEFORE_UNUSABLE - 1, INSUFFICIENT)
    await node.plugin.prepare(ref)
    await node.plugin.unprepare(ref)
    await sim.destroy(0, "3g.40gb", 4)
    # the count started again: two more failures are two, not four
    await node.fail_prepares(node.claim("b"), FAILURES_BEFORE_UNUSABLE - 1, INSUFFICIENT)
    await node.agent.reconcile()
    assert all(s.failed_instances == [] for s in node.store.statuses)
    assert node.store.warnings == []
    assert node.unusable_gauge("NvmlError") == 0


async def test_a_retry_that_works_clears_the_report_and_keeps_the_instance_free(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    node = Node(tmp_path, sim, checkpoint)
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE, INSUFFICIENT)
    await node.agent.reconcile()
    assert node.store.statuses[-1].failed_instances != []
    # made since at a prepare of another placement, free, in the way: a retry makes room
    await sim.create(0, "1g.10gb", 5)
    sim.calls.clear()
    node.clock.advance(RETRY_FIRST_S - 1)
    await node.agent.reconcile()
    assert sim.calls == []  # not yet
    assert node.store.statuses[-1].failed_instances != []
    # the first retry fails too (after it made room): the report stays, and the next comes
    # twice as late
    sim.fail_next("create_gi", INSUFFICIENT)
    node.clock.advance(1)
    await node.agent.reconcile()
    assert sim.calls == ["destroy_ci 0 1g.10gb@5", "destroy_gi 0 1g.10gb@5"]
    assert node.store.statuses[-1].failed_instances != []
    assert node.agent.failures.next_retry_s() == 2 * RETRY_FIRST_S
    node.clock.advance(2 * RETRY_FIRST_S)
    sim.calls.clear()
    await node.agent.reconcile()
    assert sim.calls == ["create_gi 0 3g.40gb@4", "create_ci 0 3g.40gb@4"]
    status = node.store.statuses[-1]
    assert status.failed_instances == []
    assert [(i.profile, i.start, i.state) for i in status.gpus[0].instances] == [
        ("3g.40gb", 4, "Free")
    ]
    assert node.unusable_gauge("NvmlError") == 0
    for kind in ("create", "destroy"):  # migpart_agent_mig_operations_total
        assert (
            node.metrics.registry.get_sample_value(
                "migpart_agent_mig_operations_total", {"node": NODE, "kind": kind}
            )
            == 1
        )
    assert node.store.warnings == [("PlacementUnusable", node.store.warnings[0][1])]
    # warm for the next claim of the placement, and kept by the offering node's passes
    await node.agent.reconcile()
    sim.calls.clear()
    await node.plugin.prepare(node.claim("b"))
    assert sim.calls == []


async def test_a_prepared_instance_in_the_way_is_retried_never_counted_nor_destroyed(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """kubelet may prepare the new claim before it unprepares the old one, whose counters the
    scheduler already freed: a transient refusal. Counted, three quick tries would report the
    placement, taint it and evict the new pod for nothing."""
    in_use = await sim.create(0, "1g.10gb", 4)
    prepare(checkpoint, "old", in_use)
    node = Node(tmp_path, sim, checkpoint)
    sim.calls.clear()
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE + 2)
    await node.agent.reconcile()
    assert node.store.statuses[-1].failed_instances == []
    assert node.unusable_gauge("Overlap") == 0
    assert sim.calls == []  # nothing destroyed
    assert await layout(sim) == [("1g.10gb", 4)]
    checkpoint.remove("old")  # its claim is unprepared: the next prepare makes room
    await node.plugin.prepare(node.claim("a"))
    assert await layout(sim) == [("3g.40gb", 4)]


async def test_a_running_instance_in_the_way_is_never_destroyed_by_a_retry(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    running_one = await sim.create(0, "2g.20gb", 4)
    sim.add_process(running_one.uuid, 4242)
    node = Node(tmp_path, sim, checkpoint)
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE)
    sim.calls.clear()
    node.clock.advance(RETRY_FIRST_S)
    await node.agent.reconcile()
    assert sim.calls == []
    [failed] = node.store.statuses[-1].failed_instances
    assert "running processes 4242" in failed.message


async def test_a_retry_never_goes_over_an_instance_the_spec_lists(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    node = Node(tmp_path, sim, checkpoint)
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE, INSUFFICIENT)
    node.agent.spec = spec("Offer", ("7g.80gb", 0))  # made ahead, over the placement
    node.clock.advance(RETRY_FIRST_S)
    await node.agent.reconcile()
    assert await layout(sim) == [("7g.80gb", 0)]
    assert [(f.profile, f.start) for f in node.store.statuses[-1].failed_instances] == [
        ("3g.40gb", 4)
    ]


async def test_the_loop_wakes_for_the_retry(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    node = Node(tmp_path, sim, checkpoint)
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE, INSUFFICIENT)
    async with running(node.agent):
        await node.store.wait_for(lambda s: s.failed_instances)
        assert await node.clock.waiting() == [RETRY_FIRST_S]  # not the 3600 s resync
        node.clock.advance(RETRY_FIRST_S)
        await node.store.wait_for(lambda s: s.gpus and s.gpus[0].instances)
    assert node.store.statuses[-1].failed_instances == []


async def test_reports_survive_a_restart_and_are_retried_at_the_first_pass(
    tmp_path: Path, sim: SimulatedNvml
) -> None:
    path = tmp_path / "state" / "checkpoint.json"
    node = Node(tmp_path, sim, Checkpoint(path))
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE, INSUFFICIENT)
    reported = node.agent.failures.reports()
    # a new process: the report is read back from the checkpoint
    again = PlacementFailures(NODE, Checkpoint(path), ManualClock())
    assert again.reports() == reported
    assert again.due() == [(0, "3g.40gb", 4)]
    again.retry_failed((0, "3g.40gb", 4), "refused")  # at the first pass
    assert again.next_retry_s() == RETRY_FIRST_S
    # one more failed prepare counts on from three
    assert again.failed((0, "3g.40gb", 4), "NvmlError", "refused")
    assert again.reports()[0].message.startswith("4 prepares in a row failed")
    assert again.worked((0, "3g.40gb", 4))
    assert Checkpoint(path).unusable() == ()
    assert "unusable" not in path.read_text()  # the file as agents before wrote it


async def test_a_node_that_does_not_offer_reports_nothing(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """Reactive mode: no counts, no reports, no retries; the prepare errors are as before."""
    await sim.create(0, "1g.10gb", 4)
    node = Node(tmp_path, sim, checkpoint, spec("Reactive", ("1g.10gb", 4)))
    sim.calls.clear()
    for _ in range(FAILURES_BEFORE_UNUSABLE + 1):
        with pytest.raises(PrepareError, match="nothing is destroyed to make room"):
            await node.plugin.prepare(node.claim("a"))
    node.clock.advance(RETRY_FIRST_S)
    await node.agent.reconcile()
    assert sim.calls == []
    assert node.store.statuses[-1].failed_instances == []
    assert node.agent.failures.reports() == []
    assert node.store.warnings == []


async def test_a_node_that_stops_offering_forgets_its_reports(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    node = Node(tmp_path, sim, checkpoint)
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE, INSUFFICIENT)
    node.agent.spec = spec("Reactive")
    await node.agent.reconcile()
    assert node.store.statuses[-1].failed_instances == []
    assert checkpoint.unusable() == ()


async def test_a_placement_the_spec_lists_is_reported_once_and_cleared_when_a_pass_makes_it(
    tmp_path: Path, sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """The pass's own failure to create it and the report are one entry, with one Event; the
    pass that makes it clears the report in the status it writes."""
    node = Node(tmp_path, sim, checkpoint, spec("Offer", ("3g.40gb", 4)))
    await node.fail_prepares(node.claim("a"), FAILURES_BEFORE_UNUSABLE, INSUFFICIENT)
    sim.fail_next("create_gi", INSUFFICIENT)  # the pass's create fails too
    await node.agent.reconcile()
    [failed] = node.store.statuses[-1].failed_instances
    assert failed.message.startswith("3 prepares in a row failed")
    assert [reason for reason, _ in node.store.warnings] == ["PlacementUnusable"]
    await node.agent.reconcile()  # NVML well again: the pass makes it
    status = node.store.statuses[-1]
    assert status.failed_instances == []
    assert [(i.profile, i.start) for i in status.gpus[0].instances] == [("3g.40gb", 4)]


async def test_a_report_of_a_gpu_the_node_has_no_more_is_dropped(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    clock = ManualClock()
    failures = PlacementFailures(NODE, checkpoint, clock)
    for _ in range(FAILURES_BEFORE_UNUSABLE):
        failures.failed((5, "3g.40gb", 4), "NvmlError", "refused")
    assert failures.reports() != []
    clock.advance(RETRY_FIRST_S)
    await retry_due(failures, sim, checkpoint, {})
    assert failures.reports() == []
    assert checkpoint.unusable() == ()
    assert sim.calls == []
