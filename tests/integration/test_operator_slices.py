"""The operator publishes each node's ResourceSlice from MigNode.status (real API server)."""

from __future__ import annotations

import time

import pytest

from migpart.controller.core.state import OperatorState
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from tests.integration.conftest import (
    RunningOperator,
    eventually,
    get_or_none,
    gpu_status,
    put_mignode,
)

pytestmark = pytest.mark.integration


def _slice(bed: Testbed, node: str) -> dict | None:
    return get_or_none(bed, "resourceslice", f"{node}-{DRIVER}")


def _published(bed: Testbed, node: str, devices: int) -> dict:
    """Wait for the node's slice to list `devices` devices. put_mignode creates the MigNode and
    then writes its status, so the slice can exist, empty, for a moment before that."""

    def listed() -> dict:
        got = _slice(bed, node)
        assert got is not None
        assert len(got["spec"].get("devices") or []) == devices
        return got

    return eventually(listed)


def _published_node(bed: Testbed, suffix: str, instance: tuple[str, int]) -> tuple[str, dict]:
    """Node slices-SUFFIX (labelled migpart-test=SUFFIX) whose MigNode reports one instance on
    GPU 0, and the node's slice once published with it."""
    node = f"slices-{suffix}"
    bed.add_node(node, {"migpart-test": suffix})
    put_mignode(bed, node, [gpu_status(0, [instance])])
    return node, _published(bed, node, 1)


def test_status_change_publishes_slice_with_next_generation(
    cluster: Testbed, operator: RunningOperator
) -> None:
    node, first = _published_node(cluster, "c", ("1g.10gb", 0))
    spec = first["spec"]
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == node
    assert spec["pool"]["name"] == node
    assert spec["pool"]["resourceSliceCount"] == 1
    assert [d["name"] for d in spec["devices"]] == ["gpu-0-1g10gb-0"]
    device = spec["devices"][0]
    assert device["attributes"]["profile"] == {"string": "1g.10gb"}
    assert device["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert device["attributes"]["parentUUID"] == {"string": "GPU-00000000-test"}
    assert device["attributes"]["uuid"] == {"string": "MIG-0-1g.10gb-0"}
    assert device["attributes"]["gpuIndex"] == {"int": 0}
    assert device["attributes"]["placementStart"] == {"int": 0}
    assert set(device["capacity"]) >= {"memory", "multiprocessors", "computeSlices", "memorySlices"}
    generation = spec["pool"]["generation"]

    # the agent reports a second instance: one more device, generation + 1
    put_mignode(cluster, node, [gpu_status(0, [("1g.10gb", 0), ("1g.10gb", 1)])])

    second = _published(cluster, node, 2)
    assert second["spec"]["pool"]["generation"] == generation + 1
    assert sorted(d["name"] for d in second["spec"]["devices"]) == [
        "gpu-0-1g10gb-0",
        "gpu-0-1g10gb-1",
    ]
    # written by the operator: the pool is the node's, and the API server accepted it as is
    owner = second["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("MigNode", node)

    # The journal entry is made once the write returns, which can be after this test reads it.
    def journalled() -> bool:
        publishes = [e for e in operator.steps(node) if e.step == "slice_published"]
        assert [e.detail for e in publishes][-1] == f"generation {generation + 1}"
        return True

    eventually(journalled)


def test_unchanged_device_set_keeps_generation(cluster: Testbed, operator: RunningOperator) -> None:
    node, first = _published_node(cluster, "c2", ("2g.20gb", 0))
    generation = first["spec"]["pool"]["generation"]
    # a status write that changes no device (a condition), then one that does
    cluster.kubectl(
        "patch",
        "mignode",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Test"}]}}',
    )
    put_mignode(cluster, node, [gpu_status(0, [("2g.20gb", 0), ("2g.20gb", 2)])])

    second = _published(cluster, node, 2)
    assert second["spec"]["pool"]["generation"] == generation + 1


def test_a_lost_slice_is_published_again_and_mignodes_carry_no_finalizer(
    cluster: Testbed, operator: RunningOperator
) -> None:
    node, _ = _published_node(cluster, "r", ("3g.40gb", 0))
    # Someone deletes it (or a write failed): the periodic resync writes it again, unasked.
    cluster.kubectl("delete", "resourceslice", f"{node}-{DRIVER}")

    again = _published(cluster, node, 1)
    assert [d["name"] for d in again["spec"]["devices"]] == ["gpu-0-3g40gb-0"]
    # Nothing of the operator's holds a MigNode back from deletion while it is down.
    mignode = get_or_none(cluster, "mignode", node)
    assert mignode is not None
    assert not mignode["metadata"].get("finalizers")


def test_the_resync_reads_no_slice_that_is_as_it_should_be(
    cluster: Testbed, operator: RunningOperator
) -> None:
    """The publisher knows the slices from its watch: at 1,000 nodes a GET per node and
    resync would be a steady load on the API server for nothing."""
    node, _ = _published_node(cluster, "w", ("1g.10gb", 0))
    state: OperatorState = operator.memo.state
    reads = state.publisher.reads
    time.sleep(3)  # three resyncs at the fixture's 1 s period
    assert state.publisher.reads == reads
    # and a slice deleted by someone else comes back (from the watch's DELETED event)
    cluster.kubectl("delete", "resourceslice", f"{node}-{DRIVER}")
    assert [d["name"] for d in _published(cluster, node, 1)["spec"]["devices"]] == [
        "gpu-0-1g10gb-0"
    ]
