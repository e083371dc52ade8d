"""What an offering node's stable pool lists (`stable_pool`, pure): each GPU's counters for every
catalog model, two placements share a counter exactly when NVML cannot hold both, the order
given, devices that do not change with allocations or instances, held devices always listed,
unusable placements tainted NoExecute, and the pool split within the API server's limits."""

from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any

import pytest

from migpart.api.models import FailedInstance, MigNode, MigNodeStatus
from migpart.mig import Instance
from migpart.mig.catalog import CATALOG
from migpart.mig.layout import enumerate_layouts, layout_problems
from migpart.mig.profiles import ModelTable, device_name
from migpart.offer.pool import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_COUNTERS_PER_CONSUMPTION,
    MAX_COUNTERS_PER_SET,
    MAX_DEVICES_PER_SLICE,
    UNUSABLE_TAINT,
    consumed_counters,
    counter_set_name,
    gpu_counters,
    node_gpus,
    stable_pool,
)
from migpart.planning.listing import planner_order
from migpart.planning.model import DeviceRef, PolicyView
from migpart.slices.content import DeviceCache, SliceContent, instance_device, slice_name
from migpart.testing.builders import H100, gpu_status
from tests.unit.kube.factories import gpu
from tests.unit.kube.factories import spec_node as node

MODELS = sorted(CATALOG)


def every_placement(table: ModelTable, gpus: int) -> list[DeviceRef]:
    return [
        DeviceRef(i, p.name, s) for i in range(gpus) for p in table.profiles for s in p.placements
    ]


def devices(pool: list[SliceContent]) -> list[dict[str, Any]]:
    return [d for s in pool for d in s.devices]


def names(pool: list[SliceContent]) -> list[str]:
    return [str(d["name"]) for d in devices(pool)]


def by_name(pool: list[SliceContent]) -> dict[str, dict[str, Any]]:
    return {str(d["name"]): d for d in devices(pool)}


def fits(table: ModelTable, placements: list[Instance]) -> bool:
    """Whether the placements' counters together stay within one GPU's counters."""
    capacity = gpu_counters(table)
    used: dict[str, int] = {}
    for inst in placements:
        for name, n in consumed_counters(table.profile(inst.profile), inst.start).items():
            used[name] = used.get(name, 0) + n
    return all(n <= capacity[name] for name, n in used.items())


@pytest.mark.parametrize("model", MODELS)
def test_two_placements_fit_the_counters_exactly_when_nvml_can_hold_both(model: str) -> None:
    """Memory overlap, compute slices and instance limits: the counters say no where the
    layout rules do, for every pair of placements of every catalog model."""
    table = CATALOG[model]
    placements = [Instance(p.name, s) for p in table.profiles for s in p.placements]
    assert len(gpu_counters(table)) <= MAX_COUNTERS_PER_SET
    for a, b in combinations_with_replacement(placements, 2):
        both = [a, b] if a != b else [a]
        assert fits(table, both) == (layout_problems(table, both) == []), (a, b)


@pytest.mark.parametrize("model", ["NVIDIA H100 80GB HBM3", "NVIDIA A30"])
def test_every_valid_layout_fits_the_counters(model: str) -> None:
    table = CATALOG[model]
    for layout in enumerate_layouts(table, frozenset()):
        assert fits(table, sorted(layout)), layout


def test_a_gpus_counters_are_its_memory_slices_compute_and_limited_profiles() -> None:
    table = CATALOG[H100]
    assert gpu_counters(table) == {
        **{f"memory-slice-{k}": 1 for k in range(8)},
        "compute-slices": 7,
        "instances-1g10gbme": 1,
    }
    three = table.profile("3g.40gb")
    assert consumed_counters(three, 4) == {
        **{f"memory-slice-{k}": 1 for k in range(4, 8)},
        "compute-slices": 3,
    }


def test_the_pool_lists_the_order_given_and_nothing_else() -> None:
    n = node([gpu(0, ("3g.40gb", 4, "Prepared")), gpu(1, ("1g.10gb", 0, "Free"))])
    order = [DeviceRef(1, "1g.10gb", 1), DeviceRef(0, "3g.40gb", 0), DeviceRef(1, "1g.10gb", 0)]
    pool = stable_pool(n, order)
    # an instance the order lacks is not listed: no claim holds it (else `held` names it)
    assert names(pool) == ["gpu-1-1g10gb-1", "gpu-0-3g40gb-0", "gpu-1-1g10gb-0"]
    assert by_name(pool)["gpu-0-3g40gb-0"]["consumesCounters"][0]["counterSet"] == (
        counter_set_name(0)
    )


def test_a_placement_is_the_reactive_device_without_instance_attributes_plus_counters() -> None:
    """Same name, attributes and capacity as the instance it becomes, less what only an
    instance has (its UUID, `created`): selectors on the profile work alike, and making or
    destroying the instance changes nothing in the pool."""
    g = gpu(0, ("3g.40gb", 4, "Free"))
    [device] = devices(stable_pool(node([g]), [DeviceRef(0, "3g.40gb", 4)]))
    reactive = instance_device(g, g.instances[0])
    attributes = {k: v for k, v in reactive["attributes"].items() if k not in ("uuid", "created")}
    assert device["attributes"] == attributes
    assert device["capacity"] == reactive["capacity"]
    assert set(device) == {"name", "attributes", "capacity", "consumesCounters"}


def test_instances_made_destroyed_or_used_leave_the_pool_as_it_was() -> None:
    """The design's point: what the agent does at prepare and what claims hold rewrites
    nothing (same digests, so the publisher writes no new generation)."""
    order = every_placement(CATALOG[H100], 2)
    empty = stable_pool(node([gpu(0), gpu(1)]), order)
    busy = node([gpu(0, ("3g.40gb", 4, "Prepared"), ("1g.10gb", 0, "Busy")), gpu(1)])
    used = stable_pool(busy, order, held={"gpu-0-3g40gb-4", "gpu-0-1g10gb-0"})
    assert [s.digest for s in used] == [s.digest for s in empty]


def test_devices_claims_hold_are_listed_after_the_order_where_it_lacks_them() -> None:
    n = node([gpu(0)])
    pool = stable_pool(
        n, [DeviceRef(0, "1g.10gb", 0)], held={"gpu-0-3g40gb-4", "gpu-9-1g10gb-0", "x"}
    )
    # a name of no placement of the node's GPUs is not its device: left out
    assert names(pool) == ["gpu-0-1g10gb-0", "gpu-0-3g40gb-4"]


def unusable_node() -> MigNode:
    failed = FailedInstance(gpu=0, profile="3g.40gb", start=4, reason="NvmlError", message="x")
    return MigNode(
        metadata={"name": "n"},
        status=MigNodeStatus(gpus=[gpu(0)], failed_instances=[failed]),
    )


def test_a_placement_the_agent_cannot_make_is_tainted_no_execute() -> None:
    order = [DeviceRef(0, "3g.40gb", 0), DeviceRef(0, "3g.40gb", 4)]
    listed = by_name(stable_pool(unusable_node(), order))
    assert listed["gpu-0-3g40gb-4"]["taints"] == [UNUSABLE_TAINT]
    assert UNUSABLE_TAINT["effect"] == "NoExecute"
    assert "taints" not in listed["gpu-0-3g40gb-0"]


def test_without_device_taints_an_unusable_placement_is_left_out_unless_held() -> None:
    order = [DeviceRef(0, "3g.40gb", 0), DeviceRef(0, "3g.40gb", 4)]
    assert names(stable_pool(unusable_node(), order, taints=False)) == ["gpu-0-3g40gb-0"]
    held = stable_pool(unusable_node(), order, held={"gpu-0-3g40gb-4"}, taints=False)
    assert names(held) == ["gpu-0-3g40gb-0", "gpu-0-3g40gb-4"]  # its counters must count


def test_gpus_without_mig_and_unknown_placements_are_left_out() -> None:
    n = node([gpu(0, mig=False), gpu(1)])
    order = [DeviceRef(0, "7g.80gb", 0), DeviceRef(2, "7g.80gb", 0), DeviceRef(1, "9g.1gb", 0)]
    pool = stable_pool(n, order)
    assert names(pool) == []
    assert [cs["name"] for s in pool for cs in s.counter_sets or []] == [counter_set_name(1)]
    assert set(node_gpus(n)) == {1}


def test_an_unavailable_node_gets_one_empty_slice_that_is_not_created() -> None:
    pool = stable_pool(node([gpu(0, ("1g.10gb", 0, "Free"))]), [], available=False)
    assert len(pool) == 1
    assert pool[0].devices == []
    assert not pool[0].create


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", [8, 16])
def test_every_placement_of_a_full_node_fits_the_api_servers_limits(model: str, gpus: int) -> None:
    n = MigNode(
        metadata={"name": "n1", "uid": "u"},
        status=MigNodeStatus(gpus=[gpu_status(i, model=model) for i in range(gpus)]),
    )
    order = planner_order(node_gpus(n), PolicyView())
    pool = stable_pool(n, order)
    assert [s.name for s in pool] == [slice_name("n1", i) for i in range(len(pool))]
    assert sorted(s.name for s in pool) == [s.name for s in pool]  # the scheduler's order
    assert {s.pool_slices for s in pool} == {len(pool)}
    sets = [cs for s in pool for cs in s.counter_sets or []]
    assert [cs["name"] for cs in sets] == [counter_set_name(i) for i in range(gpus)]
    for s in pool:
        assert (s.counter_sets is None) or s.devices == []  # never both in one slice
        assert len(s.counter_sets or []) <= MAX_COUNTER_SETS_PER_SLICE
        assert len(s.devices) <= MAX_DEVICES_PER_SLICE
        assert s.names == {str(d["name"]) for d in s.devices}
        spec = s.body(1)["spec"]
        assert ("sharedCounters" in spec) != ("devices" in spec)
    # what the scheduler checks of a pool: every consumed counter exists in its set
    counters = {cs["name"]: cs["counters"] for cs in sets}
    for device in devices(pool):
        [consumption] = device["consumesCounters"]
        assert len(consumption["counters"]) <= MAX_COUNTERS_PER_CONSUMPTION
        assert set(consumption["counters"]) <= set(counters[consumption["counterSet"]])
    assert names(pool) == [device_name(r.gpu, r.profile, r.start) for r in order]


def test_the_cache_changes_nothing_but_the_work() -> None:
    n = node([gpu(0, ("3g.40gb", 4, "Free")), gpu(1)])
    order = every_placement(CATALOG[H100], 2)
    cache = DeviceCache()
    first = stable_pool(n, order, cache=cache)
    again = stable_pool(n, order, cache=cache)
    assert [(s.digest, s.devices) for s in again] == [(s.digest, s.devices) for s in first]
    assert [s.digest for s in stable_pool(n, order)] == [s.digest for s in first]


def test_two_nodes_placements_share_every_part_but_the_gpus_uuid() -> None:
    """At 1,000 nodes a pool of 200 placements each is 200,000 devices that differ across
    nodes only in `parentUUID`: their capacity, counters and attribute values are one object
    each (`slices.content.interned`), which cut the operator's memory for them 3.3x. Equal
    content all the same: a shared part is never changed in place."""
    order = every_placement(CATALOG[H100], 1)
    a = by_name(stable_pool(node([gpu_status(0, uuid="GPU-a")]), order))
    b = by_name(stable_pool(node([gpu_status(0, uuid="GPU-b")]), order))
    for name, device in a.items():
        other = b[name]
        assert device is not other
        assert device["attributes"] is not other["attributes"]
        assert device["capacity"] is other["capacity"]
        assert device["consumesCounters"] is other["consumesCounters"]
        for key, value in device["attributes"].items():
            assert (value is other["attributes"][key]) == (key != "parentUUID"), key
