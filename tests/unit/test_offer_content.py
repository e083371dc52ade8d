"""What a node's pool lists in offer mode (`offer_slices`, pure): each GPU's counters for every
catalog model, two placements share a counter exactly when NVML cannot hold both, the offer's
order, every existing or allocated device always listed, leaving instances tainted, and the
pool split within the API server's limits."""

from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any

import pytest

from migpart.api.models import MigNode, MigNodeStatus
from migpart.mig import Instance
from migpart.mig.catalog import CATALOG
from migpart.mig.layout import enumerate_layouts, layout_problems
from migpart.mig.profiles import ModelTable, device_name
from migpart.offer_content import (
    CREATED_ATTRIBUTE,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_COUNTERS_PER_CONSUMPTION,
    MAX_COUNTERS_PER_SET,
    MAX_DEVICES_PER_SLICE,
    WITHDRAWN_TAINT,
    consumed_counters,
    counter_set_name,
    gpu_counters,
    offer_slices,
)
from migpart.slice_content import DeviceCache, SliceContent, instance_device, slice_name
from migpart.testing.builders import H100, gpu_status
from tests.unit.kube.factories import gpu
from tests.unit.kube.factories import spec_node as node

MODELS = sorted(CATALOG)


def every_placement(table: ModelTable, gpus: int) -> list[tuple[int, Instance]]:
    return [
        (i, Instance(p.name, s)) for i in range(gpus) for p in table.profiles for s in p.placements
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


def test_the_offer_comes_first_in_its_order_then_every_existing_instance() -> None:
    n = node([gpu(0, ("3g.40gb", 4, "Prepared")), gpu(1, ("1g.10gb", 0, "Free"))])
    offer = [(1, Instance("1g.10gb", 1)), (0, Instance("3g.40gb", 0)), (1, Instance("1g.10gb", 0))]
    pool = offer_slices(n, offer)
    assert names(pool) == [
        "gpu-1-1g10gb-1",
        "gpu-0-3g40gb-0",
        "gpu-1-1g10gb-0",  # offered, and existing: created, with its uuid
        "gpu-0-3g40gb-4",  # used: not offered, still listed (its counters count)
    ]
    listed = by_name(pool)
    assert listed["gpu-1-1g10gb-0"]["attributes"][CREATED_ATTRIBUTE] == {"bool": True}
    assert listed["gpu-1-1g10gb-0"]["attributes"]["uuid"] == {"string": "MIG-1-1g.10gb-0"}
    assert listed["gpu-1-1g10gb-1"]["attributes"][CREATED_ATTRIBUTE] == {"bool": False}
    assert listed["gpu-1-1g10gb-1"]["attributes"]["uuid"] == {"string": ""}
    assert listed["gpu-0-3g40gb-4"]["consumesCounters"][0]["counterSet"] == counter_set_name(0)


def test_a_placement_is_the_reactive_device_plus_its_counters() -> None:
    """Same name and attributes as the instance it becomes: selectors work alike."""
    g = gpu(0, ("3g.40gb", 4, "Free"))
    [device] = devices(offer_slices(node([g]), [(0, Instance("3g.40gb", 4))]))
    reactive = instance_device(g, g.instances[0])
    assert {k: v for k, v in device.items() if k != "consumesCounters"} == reactive


def test_devices_allocated_claims_hold_are_listed_offered_or_not() -> None:
    n = node([gpu(0)])
    pool = offer_slices(
        n, [(0, Instance("1g.10gb", 0))], allocated={"gpu-0-3g40gb-4", "gpu-9-1g10gb-0", "x"}
    )
    # a name of no placement of the node's GPUs is not its device: left out
    assert names(pool) == ["gpu-0-1g10gb-0", "gpu-0-3g40gb-4"]
    assert by_name(pool)["gpu-0-3g40gb-4"]["attributes"][CREATED_ATTRIBUTE] == {"bool": False}


def test_leaving_free_instances_stay_listed_with_the_withdrawn_taint() -> None:
    gpus = [
        gpu(0, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Prepared")),
        gpu(1, ("7g.80gb", 0, "Free")),
    ]
    # the spec keeps nothing on GPU 0 and GPU 1's 7g is withdrawn by the destroy protocol
    n = node(gpus, {0: [], 1: [("7g.80gb", 0)]})
    listed = by_name(offer_slices(n, [], withdrawn={"gpu-1-7g80gb-0"}))
    assert listed["gpu-0-3g40gb-0"]["taints"] == [WITHDRAWN_TAINT]
    assert listed["gpu-1-7g80gb-0"]["taints"] == [WITHDRAWN_TAINT]
    assert "taints" not in listed["gpu-0-3g40gb-4"]  # in use: the agent keeps it


def test_gpus_without_mig_and_unknown_offers_are_left_out() -> None:
    n = node([gpu(0, mig=False), gpu(1)])
    pool = offer_slices(
        n, [(0, Instance("7g.80gb", 0)), (2, Instance("7g.80gb", 0)), (1, Instance("9g.1gb", 0))]
    )
    assert names(pool) == []
    assert [cs["name"] for s in pool for cs in s.counter_sets or []] == [counter_set_name(1)]


def test_an_unavailable_node_gets_one_empty_slice_that_is_not_created() -> None:
    pool = offer_slices(node([gpu(0, ("1g.10gb", 0, "Free"))]), [], available=False)
    assert len(pool) == 1
    assert pool[0].devices == []
    assert not pool[0].create


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", [8, 16])
def test_every_placement_of_a_full_node_fits_the_api_servers_limits(model: str, gpus: int) -> None:
    table = CATALOG[model]
    n = MigNode(
        metadata={"name": "n1", "uid": "u"},
        status=MigNodeStatus(gpus=[gpu_status(i, model=model) for i in range(gpus)]),
    )
    offer = every_placement(table, gpus)
    pool = offer_slices(n, offer)
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
    assert names(pool) == [device_name(g, x.profile, x.start) for g, x in offer]


def test_the_cache_changes_nothing_but_the_work() -> None:
    n = node([gpu(0, ("3g.40gb", 4, "Free")), gpu(1)], {0: [("3g.40gb", 4)]})
    offer = every_placement(CATALOG[H100], 2)
    cache = DeviceCache()
    first = offer_slices(n, offer, cache=cache)
    again = offer_slices(n, offer, cache=cache)
    assert [(s.digest, s.devices) for s in again] == [(s.digest, s.devices) for s in first]
    assert [s.digest for s in offer_slices(n, offer)] == [s.digest for s in first]
    tainted = offer_slices(n, offer, withdrawn={"gpu-0-3g40gb-4"}, cache=cache)
    assert [s.digest for s in tainted] != [s.digest for s in first]
