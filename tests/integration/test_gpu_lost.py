"""A GPU that falls off the bus (NVML_ERROR_GPU_IS_LOST) mid-spec does not stall its policy:
the agent reports it lost and observes the plan on the GPUs it can reach, so the node frees
its `maxConcurrentNodes` slot; nothing is published for the lost GPU; once it is back the
agent carries out the spec there and its devices are published again.

The agent runs as a real `migpart agent --simulate` process; the GPU is lost through the
simulator's lost-GPU file, as the chaos harness loses one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from migpart.agent.simulator import LOST_FILE
from migpart.testbed import Testbed
from tests.integration.agent_processes import (
    AgentProcess,
    agents_fixture,  # noqa: F401 - the `agents` fixture
    devices,
    mignode,
    planned,
    slot_held_by_a,
    two_agents,
)
from tests.integration.conftest import eventually, pending_claim, running_operator

pytestmark = pytest.mark.integration


def _status(bed: Testbed, node: str) -> dict[str, Any]:
    return mignode(bed, node).get("status") or {}


def test_a_gpu_lost_mid_spec_frees_the_slot_and_comes_back(
    cluster: Testbed, agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    # a's NVML is slow: it is still carrying out its spec when its GPU is lost
    a, b = two_agents(cluster, agents, tmp_path, "lost", 3000, "--resync-seconds", "1")
    with running_operator(cluster):
        plan_a = slot_held_by_a(cluster, "lost", a, b)
        # a holds the policy's only slot; its GPU falls off the bus
        (agents[a].state_dir / LOST_FILE).write_text(json.dumps([0]))

        pending_claim(cluster, b, "3g.40gb", {"lost-node": "b"})

        # a reports the GPU lost and observes its plan (nothing it can reach differs), so
        # its slot is free: b is repartitioned and its device published
        lost = eventually(
            lambda: _status(cluster, a).get("observedPlanId") == plan_a and _status(cluster, a),
            timeout=90,
        )
        assert lost["lostGpus"] == [0]
        assert lost.get("gpus", []) == []
        degraded = next(c for c in lost["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "GpuLost")
        eventually(lambda: planned(mignode(cluster, b), "3g.40gb"), timeout=90)
        eventually(lambda: any("3g40gb" in d for d in devices(cluster, b)), timeout=60)
        assert devices(cluster, a) == []  # nothing published for the lost GPU

        # the GPU is back: the agent carries out the spec there and its device is published
        (agents[a].state_dir / LOST_FILE).unlink()
        eventually(lambda: any("1g10gb" in d for d in devices(cluster, a)), timeout=90)
        back = _status(cluster, a)
        assert back.get("lostGpus", []) == []
        assert [g["index"] for g in back["gpus"]] == [0]
