"""Slices that come back: wiped while the node is healthy (republished from the watch, at a
newer pool generation the scheduler allocates from), and never for a node that is unavailable
(expired agent Lease, or a kubelet plugin not registered)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testing.builders import PodBuilder
from tests.integration.conftest import (
    PROFILE_IS,
    apply,
    claim_body,
    eventually,
    get_or_none,
    gpu_status,
    patch_status,
    put_mignode,
    renew_lease,
    running_operator,
)

pytestmark = pytest.mark.integration

# No periodic resync during these tests: what brings a slice back is the watch.
NO_RESYNC_S = 3600.0


def _slice(bed: Testbed, node: str) -> dict[str, Any] | None:
    return get_or_none(bed, "resourceslice", f"{node}-{DRIVER}")


def _devices(got: dict[str, Any] | None) -> list[str]:
    assert got is not None
    return sorted(d["name"] for d in got["spec"].get("devices") or [])


def _generation(got: dict[str, Any] | None) -> int:
    assert got is not None
    return int(got["spec"]["pool"]["generation"])


def test_a_wiped_slice_comes_back_at_a_newer_generation_that_the_scheduler_uses(
    cluster: Testbed,
) -> None:
    node = "wipe-a"
    cluster.add_node(node, {"migpart-test": "wipe"})
    with running_operator(cluster, lease_timeout_s=3600.0, slice_resync_s=NO_RESYNC_S):
        put_mignode(cluster, node, [gpu_status(0, [("1g.10gb", 0)])])
        put_mignode(cluster, node, [gpu_status(0, [("1g.10gb", 0), ("1g.10gb", 1)])])
        before = eventually(
            lambda: len(_devices(_slice(cluster, node))) == 2 and _slice(cluster, node)
        )
        # kubelet wipes its node's slices when it starts
        cluster.kubectl("delete", "resourceslice", f"{node}-{DRIVER}")
        again = eventually(lambda: _slice(cluster, node))
        assert _devices(again) == ["gpu-0-1g10gb-0", "gpu-0-1g10gb-1"]
        assert _generation(again) > _generation(before)
        assert again["metadata"]["uid"] != before["metadata"]["uid"]

        # the real scheduler allocates from the new pool
        apply(cluster, claim_body("wipe-claim", "default", PROFILE_IS.format("1g.10gb")))
        apply(
            cluster,
            PodBuilder("wipe-pod", "default")
            .container("main", "busybox")
            .claim("wipe-claim")
            .node_selector({"migpart-test": "wipe"})
            .obj(),
        )

        def allocated() -> list[dict[str, Any]]:
            got = get_or_none(cluster, "resourceclaim", "wipe-claim", "-n", "default")
            assert got is not None
            results: list[dict[str, Any]] = (
                ((got.get("status") or {}).get("allocation") or {}).get("devices") or {}
            ).get("results") or []
            assert results
            return results

        [result] = eventually(allocated, timeout=60)
        assert result["pool"] == node
        assert result["device"] in _devices(again)


def test_an_unavailable_node_gets_no_devices_and_no_slice_back(cluster: Testbed) -> None:
    node = "wipe-stale"
    cluster.add_node(node, {"migpart-test": "wipe-stale"})
    with running_operator(cluster, lease_timeout_s=2.0, slice_resync_s=NO_RESYNC_S):
        put_mignode(cluster, node, [gpu_status(0, [("3g.40gb", 0)])])  # renews the lease once
        first = eventually(lambda: _devices(_slice(cluster, node)) and _slice(cluster, node))
        # no renewal: the node's devices are taken out of its slice ...
        emptied = eventually(
            lambda: _devices(_slice(cluster, node)) == [] and _slice(cluster, node)
        )
        assert _generation(emptied) > _generation(first)
        # ... and a slice wiped meanwhile (kubelet, 30 s after the plugin went) stays gone
        cluster.kubectl("delete", "resourceslice", f"{node}-{DRIVER}")
        time.sleep(3)  # what the watch would need to bring it back
        assert _slice(cluster, node) is None
        # the agent renews again: the devices are back, the pool at a newer generation
        renew_lease(cluster, node)
        back = eventually(lambda: _devices(_slice(cluster, node)) and _slice(cluster, node))
        assert _devices(back) == ["gpu-0-3g40gb-0"]
        assert _generation(back) > _generation(emptied)


def test_devices_wait_for_kubelet_to_register_the_plugin(cluster: Testbed) -> None:
    node = "wipe-reg"
    cluster.add_node(node, {"migpart-test": "wipe-reg"})
    with running_operator(cluster, lease_timeout_s=3600.0, slice_resync_s=NO_RESYNC_S):
        put_mignode(cluster, node, [gpu_status(0, [("2g.20gb", 0)])])
        eventually(lambda: _devices(_slice(cluster, node)))
        # an agent started with --report-registration, whose kubelet has not registered it
        patch_status(
            cluster,
            "mignode",
            node,
            {"kubeletPlugin": {"registered": False, "message": "waiting for kubelet"}},
        )
        eventually(lambda: _devices(_slice(cluster, node)) == [])
        patch_status(cluster, "mignode", node, {"kubeletPlugin": {"registered": True}})
        assert eventually(lambda: _devices(_slice(cluster, node))) == ["gpu-0-2g20gb-0"]
