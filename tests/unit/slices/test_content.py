"""What a node's ResourceSlice lists (`node_slices`, pure: no client, no I/O), and that each
device is exactly what selectors are judged against (the planner's virtual device), for every
profile of the real H100 and H200 tables."""

from __future__ import annotations

import pytest

from migpart.api.models import (
    MigNode,
)
from migpart.kube.cel import device_from_slice, virtual_device
from migpart.mig import builtin_table
from migpart.slices.content import (
    DIGEST_ANNOTATION,
    SLICE_LABELS,
    DeviceCache,
    SliceContent,
    instance_device,
    node_slices,
    slice_name,
    wanted_devices,
)
from migpart.slices.dra import DRIVER, RESOURCE_GROUP, RESOURCE_VERSION
from migpart.testing.builders import H100
from tests.unit.kube.factories import gpu
from tests.unit.kube.factories import spec_node as node


def content(n: MigNode, withdrawn: tuple[str, ...] = (), available: bool = True) -> SliceContent:
    """The node's one slice (one per pool until offer mode)."""
    [only] = node_slices(n, withdrawn, available)
    return only


def names(n: MigNode, withdrawn: tuple[str, ...] = ()) -> list[str]:
    return [str(d["name"]) for d in content(n, withdrawn).devices]


def test_created_instances_are_published_sorted_without_a_spec() -> None:
    n = node(
        [gpu(1, ("7g.80gb", 0, "Free")), gpu(0, ("3g.40gb", 4, "Free"), ("1g.10gb", 0, "Free"))]
    )
    assert names(n) == ["gpu-0-1g10gb-0", "gpu-0-3g40gb-4", "gpu-1-7g80gb-0"]


def test_a_free_instance_the_spec_drops_is_not_published_a_used_one_is() -> None:
    gpus = [gpu(0, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Prepared"), ("1g.10gb", 6, "Busy"))]
    # the plan keeps nothing on GPU 0: the free instance leaves, the used ones stay
    assert names(node(gpus, {0: []})) == ["gpu-0-1g10gb-6", "gpu-0-3g40gb-4"]


def test_a_gpu_the_spec_does_not_mention_is_published_as_is() -> None:
    n = node([gpu(0, ("7g.80gb", 0, "Free")), gpu(1, ("7g.80gb", 0, "Free"))], {0: []})
    assert names(n) == ["gpu-1-7g80gb-0"]


def test_a_spec_without_a_plan_id_wants_nothing_and_drops_nothing() -> None:
    """The agent leaves such a spec alone (`MigNodeSpec.desired`), so every created instance
    stays published: nothing was withdrawn for it."""
    n = node([gpu(0, ("7g.80gb", 0, "Free"))], {0: []})
    assert n.spec is not None
    unplanned = n.model_copy(update={"spec": n.spec.model_copy(update={"plan_id": None})})
    assert names(unplanned) == ["gpu-0-7g80gb-0"]
    assert wanted_devices(unplanned) == {"gpu-0-7g80gb-0"}
    assert wanted_devices(n) == set()


def test_withdrawn_devices_are_left_out_even_when_in_use() -> None:
    n = node([gpu(0, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Prepared"))])
    assert names(n, ("gpu-0-3g40gb-0",)) == ["gpu-0-3g40gb-4"]


def test_gpus_without_mig_publish_nothing() -> None:
    assert names(node([gpu(0, ("7g.80gb", 0, "Free"), mig=False)])) == []


def test_an_unavailable_node_gets_an_empty_slice_that_is_not_created() -> None:
    n = node([gpu(0, ("1g.10gb", 0, "Free"))])
    held = content(n, available=False)
    assert held.devices == []
    assert held.names == frozenset()
    assert not held.create
    assert held.digest == content(node([])).digest
    assert content(n).create


def test_digest_changes_exactly_when_the_content_does() -> None:
    a = content(node([gpu(0, ("1g.10gb", 0, "Free"))]))
    b = content(node([gpu(0, ("1g.10gb", 0, "Busy"))]))  # state is not published
    c = content(node([gpu(0, ("1g.10gb", 1, "Free"))]))
    assert a.digest == b.digest != c.digest


def test_the_body_is_a_complete_slice_of_the_nodes_pool() -> None:
    n = node([gpu(0, ("1g.10gb", 0, "Free"))]).model_copy(
        update={"metadata": {"name": "n", "uid": "u1"}}
    )
    c = content(n)
    body = c.body(4, "99")
    assert body["apiVersion"] == f"{RESOURCE_GROUP}/{RESOURCE_VERSION}"
    assert body["metadata"]["name"] == slice_name("n") == c.name
    assert body["metadata"]["labels"] == SLICE_LABELS
    assert body["metadata"]["annotations"] == {DIGEST_ANNOTATION: c.digest}
    assert body["metadata"]["resourceVersion"] == "99"
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert body["spec"]["driver"] == DRIVER
    assert body["spec"]["pool"] == {"name": "n", "generation": 4, "resourceSliceCount": 1}
    assert body["spec"]["devices"] == c.devices
    assert "resourceVersion" not in c.body(1)["metadata"]


@pytest.mark.parametrize("model", [H100, "NVIDIA H200"])
def test_published_devices_are_what_selectors_are_judged_against(model: str) -> None:
    table = builtin_table(model)
    for profile in table.profiles:
        start = profile.placements[-1]
        status = gpu(3, (profile.name, start, "Free"), model=model)
        published = instance_device(status, status.instances[0])
        expected = virtual_device(
            table,
            profile.name,
            gpu_index=3,
            start=start,
            parent_uuid="GPU-3",
            uuid=f"MIG-3-{profile.name}-{start}",
        )
        assert device_from_slice(DRIVER, published) == expected, profile.name


def test_an_instance_of_a_profile_the_table_lacks_is_published_without_capacity() -> None:
    full = gpu(0, ("1g.10gb", 0, "Free"))
    status = full.model_copy(update={"profiles": [p for p in full.profiles if p.name != "1g.10gb"]})
    device = instance_device(status, status.instances[0])
    assert device["attributes"]["profile"] == {"string": "1g.10gb"}
    assert device["capacity"] == {}


def test_the_device_cache_gives_what_building_each_device_gives() -> None:
    """Devices and digest from the cache are those built afresh, instance for instance; an
    instance of a new uuid, or of a profile whose reported capacity differs, is built again."""
    cache = DeviceCache()
    layouts = [
        [("1g.10gb", s, "Free") for s in range(7)],
        [("3g.40gb", 0, "Busy"), ("2g.20gb", 4, "Free"), ("1g.10gb", 6, "Prepared")],
        [("7g.80gb", 0, "Free")],
    ]
    for round_ in range(4):  # each GPU has each layout once, then the first one again
        n = node([gpu(i, *layouts[(i + round_) % 3]) for i in range(4)])
        [cached] = node_slices(n, frozenset(), True, cache)
        fresh = content(n)  # a cache of its own
        assert cached.devices == fresh.devices
        assert cached.digest == fresh.digest
    # 11 instances per GPU, of which 1g.10gb at 6 twice (Free, then Prepared: the same device)
    assert len(cache._entries) == 4 * 10
    other = gpu(0, ("1g.10gb", 0, "Free"))
    bigger = other.profiles[0].model_copy(update={"memory_mib": 1})
    changed = other.model_copy(update={"profiles": [bigger, *other.profiles[1:]]})
    device, _ = cache.get(changed, changed.instances[0])
    assert device["capacity"]["memory"] == {"value": str(1024 * 1024)}
