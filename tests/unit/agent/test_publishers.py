"""The overlap guard: an agent manages nothing on a node whose GPUs NVIDIA's device plugin or DRA
driver already offers, says why, and manages it again once they are gone (or when overridden)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.agent.metrics import AgentMetrics
from migpart.agent.publishers import Overlap, device_plugin_resources, overlap_of
from migpart.agent.runner import Agent
from migpart.api.models import PUBLISHER_OVERLAP, Condition, MigNodeStatus
from migpart.commands.agent import config_from, parser
from migpart.testing.mignodes import InMemoryMigNodes
from tests.unit.agent.helpers import one_gpu

if TYPE_CHECKING:
    from migpart.agent.checkpoint import Checkpoint
    from migpart.agent.simulator import SimulatedNvml


DEVICE_PLUGIN = Overlap({"DevicePlugin": ("nvidia.com/mig-1g.10gb: 7",)})


@pytest.mark.parametrize(
    ("allocatable", "found"),
    [
        ({"cpu": "8", "memory": "1Gi"}, ()),
        ({"nvidia.com/gpu": "8"}, ("nvidia.com/gpu: 8",)),
        ({"nvidia.com/gpu": "0"}, ()),  # kubelet keeps a gone plugin's resource at 0
        (
            {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "0"},
            ("nvidia.com/mig-1g.10gb: 7",),
        ),
        ({"nvidia.com/gpu.shared": "16"}, ("nvidia.com/gpu.shared: 16",)),  # time-slicing
        ({"nvidia.com/gpu-other": "1", "example.com/nvidia.com/gpu": "1"}, ()),
    ],
)
def test_the_device_plugin_is_seen_in_allocatable(
    allocatable: dict[str, str], found: tuple[str, ...]
) -> None:
    assert device_plugin_resources(allocatable) == found


def test_an_overlap_names_each_publisher_and_what_it_offers() -> None:
    assert overlap_of({"nvidia.com/gpu": "0"}, []) is None
    both = overlap_of({"nvidia.com/gpu": "2"}, ["node-a-gpu.nvidia.com-x"])
    assert both is not None
    assert both.reason == "DevicePlugin"
    text = both.describe()
    assert "NVIDIA's device plugin (node allocatable: nvidia.com/gpu: 2)" in text
    assert "DRA driver (ResourceSlices of driver gpu.nvidia.com: node-a-gpu.nvidia.com-x)" in text
    dra = overlap_of({}, ["s"])
    assert dra is not None
    assert dra.reason == "DraDriver"


class Probe:
    """A `PublisherProbe` whose answer the test sets (or makes fail)."""

    def __init__(self, overlap: Overlap | None = None) -> None:
        self.answer = overlap
        self.fail = False
        self.calls = 0

    async def overlap(self) -> Overlap | None:
        self.calls += 1
        if self.fail:
            raise ApiException(status=503, reason="unavailable")
        return self.answer


def overlap_condition(status: MigNodeStatus) -> Condition:
    (condition,) = [c for c in status.conditions if c.type == PUBLISHER_OVERLAP]
    return condition


def agent(
    sim: SimulatedNvml,
    checkpoint: Checkpoint,
    store: InMemoryMigNodes,
    probe: Probe,
    allow: bool = False,
) -> Agent:
    a = Agent(
        "node-a",
        sim,
        checkpoint,
        store,
        AgentMetrics("node-a"),
        resync_s=0,
        publishers=probe,
        allow_overlap=allow,
    )
    a.spec = store.spec
    return a


async def test_an_overlapping_node_is_not_touched_and_says_why(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """With the device plugin present, a spec that creates and one that destroys are both
    left undone: the instances the other publisher may have handed out stay."""
    await sim.create(0, "3g.40gb", 4)  # made before migpart, maybe in use by the plugin's pod
    store = InMemoryMigNodes(one_gpu("p1", ("7g.80gb", 0)))
    probe = Probe(DEVICE_PLUGIN)
    a = agent(sim, checkpoint, store, probe)
    await a.reconcile()
    assert [(i.profile, i.start) for i in await sim.instances(0)] == [("3g.40gb", 4)]
    status = store.statuses[-1]
    assert status.observed_plan_id is None
    condition = overlap_condition(status)
    assert (condition.status, condition.reason) == ("True", "DevicePlugin")
    assert "nvidia.com/mig-1g.10gb: 7" in condition.message
    assert "--allow-publisher-overlap" in condition.message
    assert store.warnings == [(PUBLISHER_OVERLAP, condition.message)]
    text = a.metrics.exposition().decode()
    assert 'migpart_agent_publisher_overlap{node="node-a",publisher="DevicePlugin"} 1.0' in text
    assert 'migpart_agent_publisher_overlap{node="node-a",publisher="DraDriver"} 0.0' in text

    await a.reconcile()  # still there: told once
    assert len(store.warnings) == 1

    probe.answer = None  # the device plugin was removed from the node
    await a.reconcile()
    assert [(i.profile, i.start) for i in await sim.instances(0)] == [("7g.80gb", 0)]
    condition = overlap_condition(store.statuses[-1])
    assert (condition.status, condition.reason) == ("False", "NoOtherPublisher")
    assert store.statuses[-1].observed_plan_id == "p1"


async def test_a_failed_check_keeps_the_last_verdict(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes(one_gpu("p1", ("7g.80gb", 0)))
    probe = Probe(DEVICE_PLUGIN)
    a = agent(sim, checkpoint, store, probe)
    await a.reconcile()
    probe.fail = True
    await a.reconcile()  # the API server did not answer: the node stays held
    assert await sim.instances(0) == []
    assert overlap_condition(store.statuses[-1]).status == "True"


async def test_the_override_manages_the_node_and_says_so(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes(one_gpu("p1", ("7g.80gb", 0)))
    a = agent(sim, checkpoint, store, Probe(DEVICE_PLUGIN), allow=True)
    await a.reconcile()
    assert [(i.profile, i.start) for i in await sim.instances(0)] == [("7g.80gb", 0)]
    condition = overlap_condition(store.statuses[-1])
    assert (condition.status, condition.reason) == ("False", "Overridden")
    assert "managed anyway" in condition.message
    text = a.metrics.exposition().decode()  # no alert for what the user chose
    assert 'migpart_agent_publisher_overlap{node="node-a",publisher="DevicePlugin"} 0.0' in text


async def test_the_check_runs_once_per_resync_period(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes()
    probe = Probe()
    a = agent(sim, checkpoint, store, probe)
    a.resync_s = 3600
    for _ in range(3):
        await a.reconcile()
    assert probe.calls == 1


def test_the_flag_reaches_the_config() -> None:
    args = parser().parse_args(["--node-name", "n", "--allow-publisher-overlap"])
    assert config_from(args).allow_publisher_overlap
    assert not config_from(parser().parse_args(["--node-name", "n"])).allow_publisher_overlap
