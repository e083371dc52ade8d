"""Offer mode's stable pools on the real API server: the worst case of every catalog model (8
GPUs, every placement listed, an unusable one tainted NoExecute) written by the slice
publisher, read back as one pool at one generation, then changed and shrunk.

On Kubernetes 1.36+ the server keeps the partitionable-device fields (counter sets, consumed
counters, taints). On 1.34 their feature gates are off (alpha) and the server accepts the
slices but drops those fields silently: a counter-set slice is stored empty and devices consume
nothing (docs/offer-mode.md "API server limits"). Offer mode must not run there; this test pins
that behaviour down rather than skipping.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, ResourceV1Api

from migpart.api.models import FailedInstance, MigNode, MigNodeStatus
from migpart.kube.slice_publisher import SlicePublisher
from migpart.mig.catalog import CATALOG
from migpart.mig.profiles import device_name
from migpart.offer.pool import UNUSABLE_TAINT, stable_pool
from migpart.planning.model import DeviceRef
from migpart.slices.content import slice_name
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from migpart.testing.builders import ClaimBuilder, PodBuilder, gpu_status, profile_is
from tests.integration.conftest import apply, eventually, get
from tests.pools import every_placement, offering

pytestmark = pytest.mark.integration

GPUS = 8
NODE_LABEL = "migpart-test"
# the partitionable-device fields are served (beta, on by default) from this version
PARTITIONABLE = (1, 36)


def partitionable() -> bool:
    major, minor, _ = (int(x) for x in kube_version().split("."))
    return (major, minor) >= PARTITIONABLE


def whole(model: str) -> str:
    """The model's profile of the whole GPU (7g.80gb on an H100)."""
    return max(CATALOG[model].profiles, key=lambda p: p.memory_slices).name


def full_node(name: str, model: str, unusable: bool = False) -> MigNode:
    """`GPUS` GPUs of `model`; GPU 0 has one free instance of the whole GPU; `unusable`: the
    agent reports it cannot make GPU 1's whole-GPU placement."""
    gpus = [gpu_status(0, (whole(model), 0, "Free"), model=model)]
    gpus += [gpu_status(i, model=model) for i in range(1, GPUS)]
    failed = [FailedInstance(gpu=1, profile=whole(model), start=0, reason="NvmlError")]
    status = MigNodeStatus(gpus=gpus, failed_instances=failed if unusable else [])
    return MigNode(metadata={"name": name}, status=status)


async def stored_pool(api: ApiClient, node: str) -> list[dict[str, Any]]:
    """The node's slices as the API server stores them, by name."""
    listed: Any = await ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={node}"
    )
    slices = [api.sanitize_for_serialization(s) for s in listed.items]
    return sorted(slices, key=lambda s: str(s["metadata"]["name"]))


@pytest.mark.parametrize("model", sorted(CATALOG))
async def test_the_worst_case_pool_of_every_model_is_accepted(
    cluster: Testbed, api: ApiClient, model: str
) -> None:
    node = "offer-" + "".join(c if c.isalnum() else "-" for c in model.lower()).strip("-")
    offer = every_placement(model, GPUS)
    publisher = SlicePublisher(api, slices=offering(offer))
    mig = full_node(node, model, unusable=True)
    publisher.observe(mig)
    unusable = device_name(1, whole(model), 0)
    result = await publisher.publish(node)
    assert result.written
    expected = stable_pool(mig, offer)
    stored = await stored_pool(api, node)
    assert [s["metadata"]["name"] for s in stored] == [
        slice_name(node, i) for i in range(len(expected))
    ]
    assert {s["spec"]["pool"]["generation"] for s in stored} == {result.generation}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {len(expected)}
    devices = [d for s in stored for d in s["spec"].get("devices") or []]
    assert len(devices) == len(offer)
    [tainted] = [d for d in devices if d["name"] == unusable]
    if partitionable():
        assert [s["spec"].get("sharedCounters") is not None for s in stored] == [
            c.counter_sets is not None for c in expected
        ]
        assert all(d["consumesCounters"] for d in devices)
        assert [(t["key"], t["effect"]) for t in tainted["taints"]] == [
            (UNUSABLE_TAINT["key"], UNUSABLE_TAINT["effect"])
        ]
        # the pool is stable: an instance made and then allocated changes nothing
        made = MigNode(
            metadata={"name": node},
            status=MigNodeStatus(
                gpus=[gpu_status(0, (whole(model), 0, "Prepared"), model=model)]
                + [gpu_status(i, model=model) for i in range(1, GPUS)],
                failed_instances=mig.status.failed_instances if mig.status else [],
            ),
        )
        publisher.observe(made)
        assert not (await publisher.publish(node)).written
    else:
        # 1.34: accepted, but the gated fields are gone
        assert not any(s["spec"].get("sharedCounters") for s in stored)
        assert not any(d.get("consumesCounters") or d.get("taints") for d in devices)
        assert stored[0]["spec"].get("devices") in (None, [])


async def test_a_changed_pool_is_rewritten_at_one_generation_and_a_smaller_one_shrinks(
    cluster: Testbed, api: ApiClient
) -> None:
    model = sorted(CATALOG)[0]
    node = "offer-shrinks"
    offer = every_placement(model, GPUS)
    publisher = SlicePublisher(api, slices=offering(offer))
    publisher.observe(full_node(node, model))
    first = await publisher.publish(node)
    # the policy now allows a quarter of it: fewer slices
    offer[:] = offer[: len(offer) // 4]
    publisher.invalidate(node)
    second = await publisher.publish(node)
    assert second.generation == first.generation + 1
    stored = await stored_pool(api, node)
    assert {s["spec"]["pool"]["generation"] for s in stored} == {second.generation}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {len(stored)}
    assert len(stored) < len(stable_pool(full_node(node, model), every_placement(model, GPUS)))
    assert second.devices == {d["name"] for s in stored for d in s["spec"].get("devices") or []}
    # nothing changed: nothing written
    assert not (await publisher.publish(node)).written


def scheduled_pod(bed: Testbed, name: str, namespace: str, claim: str, expression: str) -> None:
    """A claim with one request matching `expression`, and a pod on node `offer-sched` using
    it, left to the real kube-scheduler."""
    apply(bed, ClaimBuilder(claim, namespace).request(expression).obj())
    pod = PodBuilder(name, namespace).claim(claim).node_selector({NODE_LABEL: "offer-sched"})
    apply(bed, pod.obj())


def allocated(bed: Testbed, claim: str, namespace: str) -> list[str]:
    """The devices the scheduler allocated to the claim (waits for the allocation)."""

    def devices() -> list[str]:
        body = get(bed, "resourceclaim", claim, "-n", namespace)
        results = ((body.get("status") or {}).get("allocation") or {}).get("devices", {})
        names = [r["device"] for r in results.get("results") or []]
        assert names, f"{claim} not allocated yet"
        return names

    return eventually(devices)


def unschedulable(bed: Testbed, pod: str, namespace: str) -> bool:
    """Whether the scheduler tried the pod and found no node (waits for its verdict)."""

    def verdict() -> bool:
        conditions = (get(bed, "pod", pod, "-n", namespace).get("status") or {}).get(
            "conditions"
        ) or []
        # no PodScheduled condition yet: the scheduler has not tried the pod
        scheduled = next((c for c in conditions if c["type"] == "PodScheduled"), {})
        return scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"

    return bool(eventually(verdict))


async def test_the_scheduler_allocates_in_offer_order_and_never_two_overlapping_placements(
    cluster: Testbed, api: ApiClient
) -> None:
    """kube-scheduler itself on a stable pool: 4 H100s (100 placements, so the first ones
    listed sit in the second device slice), GPU 3's placements listed first, each GPU's in
    reverse table order (the whole GPU first). A claim for any device gets the first
    offered (GPU 3 whole); one for a 1g.10gb on GPU 3 then finds no room on 1.36+ (the whole
    GPU holds every memory slice counter), and one for any 1g.10gb gets the first offered on
    GPU 2. On 1.34 the counters are dropped: the overlapping placement is allocated (and the
    allocator keeps no slice order, so only GPU-pinned claims are asserted there)."""
    node, namespace = "offer-sched", "offer-sched"
    cluster.add_node(node, {NODE_LABEL: node})
    cluster.kubectl("create", "namespace", namespace)
    model = next(m for m in CATALOG if m.startswith("NVIDIA H100 80GB"))
    table = CATALOG[model]
    placements = [(p.name, s) for p in table.profiles for s in p.placements]
    offer = [
        DeviceRef(g, name, start) for g in (3, 2, 1, 0) for name, start in reversed(placements)
    ]
    publisher = SlicePublisher(api, slices=offering(offer))
    publisher.observe(
        MigNode(
            metadata={"name": node},
            status=MigNodeStatus(gpus=[gpu_status(i, model=model) for i in range(4)]),
        )
    )
    await publisher.publish(node)
    whole_gpu = device_name(3, whole(model), 0)
    assert slice_name(node, 2) in {s["metadata"]["name"] for s in await stored_pool(api, node)}

    # 1.34's allocator keeps no slice order (1.35+ sorts them by name): pick GPU 3 there
    whole_on_3 = f'{profile_is(whole(model))} && device.attributes["{DRIVER}"].gpuIndex == 3'
    scheduled_pod(cluster, "any", namespace, "any", "true" if partitionable() else whole_on_3)
    assert allocated(cluster, "any", namespace) == [whole_gpu]
    small = f'{profile_is("1g.10gb")} && device.attributes["{DRIVER}"].gpuIndex == 3'
    scheduled_pod(cluster, "overlapping", namespace, "overlapping", small)
    if not partitionable():
        [overlapping] = allocated(cluster, "overlapping", namespace)
        assert overlapping.startswith(device_name(3, "1g.10gb", 0)[:-1])
        return
    assert unschedulable(cluster, "overlapping", namespace)
    scheduled_pod(cluster, "elsewhere", namespace, "elsewhere", profile_is("1g.10gb"))
    assert allocated(cluster, "elsewhere", namespace) == [device_name(2, "1g.10gb", 6)]
