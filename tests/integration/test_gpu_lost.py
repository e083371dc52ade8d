"""A GPU that falls off the bus (NVML_ERROR_GPU_IS_LOST) mid-spec does not stall its policy:
the agent reports it lost and observes the plan on the GPUs it can reach, so the node frees
its `maxConcurrentNodes` slot; nothing is published for the lost GPU; once it is back the
agent carries out the spec there and its devices are published again.

The agent runs as a real `migpart agent --simulate` process; the GPU is lost through the
simulator's lost-GPU file, as the chaos harness loses one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migpart.agent.simulator import LOST_FILE
from migpart.testbed import Testbed
from tests.integration.conftest import (
    PROFILE_IS,
    apply,
    claim_body,
    eventually,
    get_or_none,
    pending_pod,
    policy_body,
    running_operator,
)
from tests.integration.test_node_health import AgentProcess

pytestmark = pytest.mark.integration

LABEL = {"migpart-test": "gpu-lost"}


@pytest.fixture
def agents(cluster: Testbed, tmp_path: Path) -> Iterator[dict[str, AgentProcess]]:
    running: dict[str, AgentProcess] = {}
    yield running
    for agent in running.values():
        agent.stop()
        print(agent.log_path.read_text()[-3000:])  # shown when the test failed


def _mignode(bed: Testbed, node: str) -> dict[str, Any]:
    return get_or_none(bed, "mignode", node) or {}


def _status(bed: Testbed, node: str) -> dict[str, Any]:
    return _mignode(bed, node).get("status") or {}


def _devices(bed: Testbed, node: str) -> list[str]:
    got = get_or_none(bed, "resourceslice", f"{node}-mig.migpart.io")
    return sorted(d["name"] for d in ((got or {}).get("spec") or {}).get("devices") or [])


def _planned(obj: dict[str, Any], profile: str) -> bool:
    gpus = (obj.get("spec") or {}).get("gpus") or []
    return any(i["profile"] == profile for g in gpus for i in g.get("instances") or [])


def test_a_gpu_lost_mid_spec_frees_the_slot_and_comes_back(
    cluster: Testbed, agents: dict[str, AgentProcess], tmp_path: Path
) -> None:
    a, b = "lost-a", "lost-b"
    cluster.add_node(a, {**LABEL, "lost-node": "a"})
    cluster.add_node(b, {**LABEL, "lost-node": "b"})
    # a's NVML is slow: it is still carrying out its spec when its GPU is lost
    agents[a] = AgentProcess(cluster, a, tmp_path, 3000, "--resync-seconds", "1")
    agents[b] = AgentProcess(cluster, b, tmp_path, 0)
    with running_operator(cluster):
        for node in (a, b):
            eventually(lambda n=node: _status(cluster, n).get("gpus"), timeout=90)  # type: ignore[misc]
        apply(
            cluster,
            policy_body(
                "gpu-lost",
                LABEL,
                reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 1},
            ),
        )
        apply(cluster, claim_body("lost-a", "default", PROFILE_IS.format("1g.10gb")))
        pending_pod(cluster, "lost-a", "default", "lost-a", {"lost-node": "a"})
        spec_a = eventually(
            lambda: _planned(_mignode(cluster, a), "1g.10gb") and _mignode(cluster, a)
        )
        plan_a = spec_a["spec"]["planId"]
        assert (spec_a.get("status") or {}).get("observedPlanId") != plan_a
        # a holds the policy's only slot; its GPU falls off the bus
        (agents[a].state_dir / LOST_FILE).write_text(json.dumps([0]))

        apply(cluster, claim_body("lost-b", "default", PROFILE_IS.format("3g.40gb")))
        pending_pod(cluster, "lost-b", "default", "lost-b", {"lost-node": "b"})

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
        eventually(lambda: _planned(_mignode(cluster, b), "3g.40gb"), timeout=90)
        eventually(lambda: any("3g40gb" in d for d in _devices(cluster, b)), timeout=60)
        assert _devices(cluster, a) == []  # nothing published for the lost GPU

        # the GPU is back: the agent carries out the spec there and its device is published
        (agents[a].state_dir / LOST_FILE).unlink()
        eventually(lambda: any("1g10gb" in d for d in _devices(cluster, a)), timeout=90)
        back = _status(cluster, a)
        assert back.get("lostGpus", []) == []
        assert [g["index"] for g in back["gpus"]] == [0]
