"""MigNode status from a buggy or hostile agent, on the real API server with the operator
running: nothing is planned on such a node, the policy status and an event on the MigNode say
why, and a sound node of the same policy is served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from migpart.api.models import GpuStatus, MigInstanceStatus, MigNodeStatus
from migpart.testbed import Testbed
from migpart.testing.builders import MigNodeBuilder
from tests.integration.conftest import (
    RunningOperator,
    add_mignode,
    apply,
    events,
    eventually,
    get,
    gpu_status,
    pending_claim,
    planned_spec,
    policy_body,
    policy_status,
    put_mignode,
)

pytestmark = pytest.mark.integration

LABELS = {"migpart-test": "hostile"}


def _huge(index: int) -> GpuStatus:
    """A GPU with 3,000 instances listed (about 300 KB of status)."""
    gpu = gpu_status(index, [])
    instances = [
        MigInstanceStatus(profile="1g.10gb", start=i % 7, uuid=f"MIG-{i:032d}", state="Free")
        for i in range(3000)
    ]
    return gpu.model_copy(update={"instances": instances})


# node -> (its GPUs, words the reason must contain)
HOSTILE: dict[str, tuple[list[GpuStatus], str]] = {
    "hostile-overlap": (
        [gpu_status(0, [("3g.40gb", 0), ("1g.10gb", 2)])],
        "GPU 0: instances[1]: 1g.10gb@2 overlaps instances[0] in memory slices",
    ),
    "hostile-profile": (
        [gpu_status(0, [("5g.50gb", 0)])],
        "GPU 0: instances[0].profile: '5g.50gb' is not offered",
    ),
    "hostile-index": ([gpu_status(99, [])], "GPU 99: index out of range"),
    "hostile-huge": ([_huge(0)], "GPU 0: 3000 instances reported; a GPU holds at most 8"),
    "hostile-17-gpus": (
        [gpu_status(i, []) for i in range(17)],
        "17 MIG GPUs; a MigNode spec lists at most 16",
    ),
}


def _put_status_from_file(bed: Testbed, name: str, gpus: list[GpuStatus], tmp: Path) -> None:
    """put_mignode for a status too large for a command line."""
    apply(bed, MigNodeBuilder(name).obj())
    status = MigNodeStatus(gpus=gpus).model_dump(by_alias=True, exclude_none=True, mode="json")
    patch = tmp / f"{name}.json"
    patch.write_text(json.dumps({"status": status}))
    bed.kubectl(
        "patch", "mignode", name, "--subresource=status", "--type=merge", "--patch-file", str(patch)
    )


def test_hostile_nodes_are_left_out_and_a_sound_node_is_served(
    cluster: Testbed, operator: RunningOperator, tmp_path: Path
) -> None:
    for name, (gpus, _) in HOSTILE.items():
        cluster.add_node(name, LABELS)
        _put_status_from_file(cluster, name, gpus, tmp_path)
    add_mignode(cluster, "sound", LABELS)
    for i, profile in enumerate(("3g.40gb", "3g.40gb")):
        pending_claim(cluster, f"hostile-claim-{i}", profile, LABELS, pod=f"hostile-pod-{i}")
    apply(cluster, policy_body("hostile", LABELS, reconfiguration={"batchWindowSeconds": 0}))

    spec = planned_spec(cluster, "sound")
    assert [i["profile"] for i in spec["gpus"][0]["instances"]] == ["3g.40gb", "3g.40gb"]

    def excluded() -> dict[str, Any]:
        status = policy_status(cluster, "hostile")
        (condition,) = [c for c in status.get("conditions", []) if c["type"] == "NodesExcluded"]
        assert condition["status"] == "True"
        return {"status": status, "condition": condition}

    got = eventually(excluded)
    assert got["status"]["nodes"] == 1
    message = got["condition"]["message"]
    assert got["condition"]["reason"] == "InvalidNodeStatus"
    assert message.startswith(f"{len(HOSTILE)} node(s) not planned: ")
    for name, (_, words) in HOSTILE.items():
        assert f"{name}: {words}" in message
        assert "spec" not in get(cluster, "mignode", name)

        def warned(name: str = name) -> dict[str, Any]:
            (event,) = events(cluster, name, reason="NodeExcluded")
            return event

        event = eventually(warned)
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "MigNode"
        assert words in event["message"]

    # The agent comes back sound: the node is planned again and the condition clears.
    put_mignode(cluster, "hostile-overlap", [gpu_status(0, [])])

    def cleared() -> dict[str, Any]:
        status = policy_status(cluster, "hostile")
        assert status["nodes"] == 2
        (condition,) = [c for c in status["conditions"] if c["type"] == "NodesExcluded"]
        assert "hostile-overlap" not in condition["message"]
        return status

    eventually(cleared)
