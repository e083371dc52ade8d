"""How the real kube-scheduler allocates partitionable devices: the facts offer mode stands on
(docs/offer-mode.md#how-kube-scheduler-allocates-partitionable-devices), observed rather than
read.

Each test gives one kubelet-less Node a pool of two hand-built ResourceSlices (one with the
GPU's counter set, one with counter-consuming devices: a slice may carry only one of the two),
then creates claims and pods one after the other and reads what the scheduler allocated. On
1.36 and 1.37 partitionable devices and device taints are on by default; on 1.34 they are off
and the API server drops their fields, which the same tests observe instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from migpart.offer.pool import UNUSABLE_TAINT
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from migpart.testing.builders import ClaimBuilder, PodBuilder, SliceBuilder, profile_is
from tests.integration.conftest import apply, eventually, get

pytestmark = pytest.mark.integration

NS = "default"
GPU = "gpu-0"
COMPUTE = "compute-slices"
# On by default from 1.36 (kube_features.go); the testbed sets no feature gates.
PARTITIONABLE = tuple(int(p) for p in kube_version().split(".")[:2]) >= (1, 36)


def memory(first: int, count: int) -> dict[str, int]:
    return {f"memory-slice-{k}": 1 for k in range(first, first + count)}


# (device, profile, first memory slice, memory slices, compute slices)
Placement = tuple[str, str, int, int, int]
SEVEN = ("gpu-0-7g80gb-0", "7g.80gb", 0, 8, 7)
THREE_LOW = ("gpu-0-3g40gb-0", "3g.40gb", 0, 4, 3)
THREE_HIGH = ("gpu-0-3g40gb-4", "3g.40gb", 4, 4, 3)


def publish(
    bed: Testbed,
    node: str,
    placements: list[Placement],
    generation: int = 1,
    **device_fields: Any,
) -> None:
    """The node's pool: GPU 0's counter set, and `placements` as devices in this order."""
    bed.add_node(node)
    counters = SliceBuilder(f"{node}-counters", node, generation)
    counters.counter_set(GPU, {**memory(0, 8), COMPUTE: 7})
    devices = SliceBuilder(f"{node}-devices", node, generation)
    for name, profile, first, count, compute in placements:
        devices.device(name, profile=profile).consumes(
            GPU, {**memory(first, count), COMPUTE: compute}, **device_fields
        )
    for body in (counters, devices):
        body.spec(pool={"name": node, "generation": generation, "resourceSliceCount": 2})
        apply(bed, body.obj())


def claim_and_pod(bed: Testbed, name: str, node: str, *selectors: str) -> None:
    apply(bed, ClaimBuilder(name, NS).request(*selectors).obj())
    pod = PodBuilder(name, NS).container("main").claim(name)
    apply(bed, pod.node_selector({"kubernetes.io/hostname": node}).obj())


def allocated(bed: Testbed, claim: str) -> str:
    """The device the scheduler gave `claim` ('' while none)."""
    allocation = get(bed, "resourceclaim", claim, "-n", NS).get("status", {}).get("allocation")
    results = ((allocation or {}).get("devices") or {}).get("results") or []
    return str(results[0]["device"]) if results else ""


def unschedulable(bed: Testbed, pod: str) -> bool:
    conditions = get(bed, "pod", pod, "-n", NS).get("status", {}).get("conditions") or []
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
    )


def stored(bed: Testbed, node: str) -> Mapping[str, Any]:
    return get(bed, "resourceslice", f"{node}-devices")["spec"]["devices"][0]


@pytest.fixture(autouse=True)
def clean(cluster: Testbed) -> Any:
    yield
    cluster.kubectl("delete", "pods", "--all", "-n", NS, "--force", "--grace-period=0")
    cluster.kubectl("delete", "resourceclaims", "--all", "-n", NS, "--wait=false")


def test_the_api_server_keeps_partitionable_fields_only_where_served(cluster: Testbed) -> None:
    publish(cluster, "fields", [THREE_LOW], taints=[dict(UNUSABLE_TAINT)])
    device = stored(cluster, "fields")
    assert ("consumesCounters" in device) == PARTITIONABLE
    assert ("taints" in device) == PARTITIONABLE
    counters = get(cluster, "resourceslice", "fields-counters")["spec"]
    assert ("sharedCounters" in counters) == PARTITIONABLE


def test_the_scheduler_takes_devices_in_published_order_not_by_name(cluster: Testbed) -> None:
    published = [
        ("gpu-0-1g10gb-6", "1g.10gb", 6, 1, 1),
        ("gpu-0-1g10gb-3", "1g.10gb", 3, 1, 1),
        ("gpu-0-1g10gb-0", "1g.10gb", 0, 1, 1),
    ]
    publish(cluster, "order", published)
    for i, placement in enumerate(published):
        claim_and_pod(cluster, f"order-{i}", "order", profile_is("1g.10gb"))
        assert eventually(lambda i=i: allocated(cluster, f"order-{i}")) == placement[0]


def test_a_departing_pods_successor_gets_the_device_it_left(cluster: Testbed) -> None:
    """First fit in a fixed order hands the next claim of a profile the first free device:
    the one a departed pod left, whose instance an offering node kept (warm reuse), not a
    new placement further down the list."""
    published = [
        ("gpu-0-1g10gb-6", "1g.10gb", 6, 1, 1),
        ("gpu-0-1g10gb-5", "1g.10gb", 5, 1, 1),
        ("gpu-0-1g10gb-4", "1g.10gb", 4, 1, 1),
    ]
    publish(cluster, "reuse", published)
    for name in ("reuse-a", "reuse-b"):
        claim_and_pod(cluster, name, "reuse", profile_is("1g.10gb"))
        eventually(lambda name=name: allocated(cluster, name))
    assert allocated(cluster, "reuse-a") == published[0][0]
    cluster.kubectl("delete", "pod", "reuse-a", "-n", NS, "--force", "--grace-period=0")
    cluster.kubectl("delete", "resourceclaim", "reuse-a", "-n", NS, "--wait=true")
    claim_and_pod(cluster, "reuse-c", "reuse", profile_is("1g.10gb"))
    assert eventually(lambda: allocated(cluster, "reuse-c")) == published[0][0]
    assert allocated(cluster, "reuse-b") == published[1][0]


def test_placements_sharing_a_counter_are_never_both_allocated(cluster: Testbed) -> None:
    publish(cluster, "overlap", [SEVEN, THREE_HIGH, THREE_LOW])
    claim_and_pod(cluster, "whole", "overlap")
    assert eventually(lambda: allocated(cluster, "whole")) == SEVEN[0]
    claim_and_pod(cluster, "half", "overlap")
    if PARTITIONABLE:
        eventually(lambda: unschedulable(cluster, "half"))
        assert allocated(cluster, "half") == ""
    else:  # no counters: the 3g.40gb that overlaps the 7g.80gb is allocated too
        assert eventually(lambda: allocated(cluster, "half")) == THREE_HIGH[0]


def test_counters_of_an_allocated_device_that_left_the_slice_are_free_again(
    cluster: Testbed,
) -> None:
    publish(cluster, "left", [SEVEN, THREE_HIGH])
    claim_and_pod(cluster, "kept", "left")
    assert eventually(lambda: allocated(cluster, "kept")) == SEVEN[0]
    claim_and_pod(cluster, "later", "left")
    if PARTITIONABLE:
        eventually(lambda: unschedulable(cluster, "later"))
    # the allocated 7g.80gb leaves the slice; its claim keeps it
    publish(cluster, "left", [THREE_HIGH], generation=2)
    # the scheduler counts only devices still in the pool: the overlapping 3g.40gb is free
    assert eventually(lambda: allocated(cluster, "later")) == THREE_HIGH[0]
    assert allocated(cluster, "kept") == SEVEN[0]


def test_a_placement_tainted_unusable_is_passed_over(cluster: Testbed) -> None:
    """Offer mode's taint of a placement the agent cannot make (offer/pool.py UNUSABLE_TAINT)."""
    bed, node = cluster, "tainted"
    bed.add_node(node)
    devices = SliceBuilder(f"{node}-devices", node).device(THREE_LOW[0], profile="3g.40gb")
    devices.taint(UNUSABLE_TAINT["key"], UNUSABLE_TAINT["effect"])
    apply(bed, devices.device(THREE_HIGH[0], profile="3g.40gb").obj())
    claim_and_pod(bed, "untainted", node)
    # DRADeviceTaints: beta (on) from 1.36, GA in 1.37; alpha (off) in 1.34, taint dropped
    expected = THREE_HIGH[0] if PARTITIONABLE else THREE_LOW[0]
    assert eventually(lambda: allocated(bed, "untainted")) == expected
