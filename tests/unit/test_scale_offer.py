"""bench/scale.py in offer mode (bench/scale_offer.py, bench/scale_cluster.py): what the
harness reads from slices, pods and the audit log, and how it counts them by request kind."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from bench import scale_cluster as CLUSTER
from bench import scale_offer as OFFER
from bench import scale_report as REPORT
from migpart.api.models import MigNode, MigNodeStatus
from migpart.offer.pool import node_gpus, stable_pool
from migpart.planning.listing import planner_order
from migpart.planning.model import PolicyView
from migpart.testing.builders import PodBuilder, SliceBuilder, gpu_status


def _plan(name: str, count: int = 1, same_gpu: bool = False, zone: str | None = None) -> Any:
    return CLUSTER.PodPlan(name, "a", "1g.10gb", count, same_gpu, zone)


def _tracker(*plans: Any) -> Any:
    tracker = CLUSTER.Tracker(len(plans))
    for p in plans:
        tracker.created[p.name] = 0.0
        tracker.plans[p.name] = p
    return tracker


def test_a_pool_offers_when_it_has_counter_sets_and_devices_consuming_them() -> None:
    pools = OFFER.Pools()
    pools.add(SliceBuilder("n1-counters", "node-1").counter_set("gpu-0", {"compute": 7}).obj())
    pools.add(SliceBuilder("n1", "node-1").device("gpu-0-1g.10gb-6").consumes("gpu-0", {}).obj())
    pools.add(SliceBuilder("n2", "node-2").device("gpu-0-7g.80gb-0").obj())  # reactive
    pools.add(SliceBuilder("n3-counters", "node-3").counter_set("gpu-0", {"compute": 7}).obj())
    other = SliceBuilder("x", "node-4").device("d").spec(driver="other.example.com")
    pools.add(other.consumes("c", {"n": 1}).obj())
    other = SliceBuilder("y", "node-4").counter_set("c", {"n": 1}).spec(driver="other.example.com")
    pools.add(other.obj())
    assert pools.offering == {"node-1"}  # node-3: counters published, devices not yet


def test_the_stable_pool_of_a_node_is_in_offer_form() -> None:
    gpus = [gpu_status(i, model=CLUSTER.H100) for i in range(CLUSTER.GPUS_PER_NODE)]
    node = MigNode(metadata={"name": "node-1"}, status=MigNodeStatus(gpus=gpus))
    pool = stable_pool(node, planner_order(node_gpus(node), PolicyView()))
    pools = OFFER.Pools()
    for content in pool:
        pools.add(content.body(generation=1))
    assert pools.offering == {"node-1"}
    assert len(pool) <= OFFER.SLICES_PER_PAGE


def test_the_kind_of_a_pod_is_what_its_claim_asks_for() -> None:
    assert _plan("p", 1).kind == "one device"
    assert _plan("p", 2).kind == "two devices"
    assert _plan("p", 2, same_gpu=True).kind == "two on one GPU"


def test_the_policy_asks_for_an_allocation_only_when_given() -> None:
    assert "allocation" not in CLUSTER.policy_body("a", 10)["spec"]
    assert CLUSTER.policy_body("a", 10, "Offer")["spec"]["allocation"] == "Offer"


def test_pods_served_from_the_pool_and_pods_sent_back_are_counted_by_kind() -> None:
    one, two, same = _plan("p1"), _plan("p2", 2, zone="zone-1"), _plan("p3", 2, same_gpu=True)
    tracker = _tracker(one, two, same)
    tracker.on_pod("MODIFIED", PodBuilder("p1", "scale").spec(nodeName="n1").obj())
    tracker.on_pod("MODIFIED", PodBuilder("p2", "scale").unschedulable().obj())
    tracker.on_pod("MODIFIED", PodBuilder("p2", "scale").spec(nodeName="n2").obj())
    failed = {"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}
    tracker.on_pod("MODIFIED", PodBuilder("p3", "scale").status(conditions=[failed]).obj())
    tracker.on_pod("MODIFIED", PodBuilder("elsewhere", "scale").spec(nodeName="n1").obj())
    assert set(tracker.bound) == {"p1", "p2"}
    assert set(tracker.unschedulable) == {"p2"}
    assert tracker.not_scheduled == {"p3": "SchedulerError"}
    kinds = OFFER.tally(tracker)
    assert kinds["one device"] == Counter(pods=1, served=1, bound=1)
    assert kinds["two devices"] == Counter(pods=1, unschedulable=1, bound=1)
    assert kinds[OFFER.ZONED] == Counter(pods=1, unschedulable=1, bound=1)
    assert kinds["two on one GPU"] == Counter(pods=1)


def test_slice_writes_are_the_write_verbs_on_resourceslices() -> None:
    requests = Counter(
        {
            "update resourceslices": 3,
            "create resourceslices": 2,
            "delete resourceslices": 1,
            "list resourceslices": 9,
            "watch resourceslices": 1,
            "patch mignodes": 4,
            "patch resourceclaims/status": 5,
        }
    )
    assert CLUSTER.slice_writes(requests) == 6
    assert CLUSTER.slice_writes(Counter()) == 0


def _burst(bound_s: list[float]) -> Any:
    tracker = CLUSTER.Tracker(len(bound_s))
    for i, t in enumerate(bound_s):
        tracker.created[f"p{i}"] = 0.0
        tracker.bound[f"p{i}"] = t
    return REPORT.Burst(tracker, 0.0, 0.0, 0.0, 0.0, {}, Counter(), 0.0, 0, 0)


def test_the_ratio_is_of_the_last_binds_and_infinite_when_a_pod_was_not_bound() -> None:
    first, base = _burst([1.0, 11.0]), _burst([2.0, 10.0])
    result: Any = type("R", (), {"pods": 2, "first": first, "baseline": base})()
    assert OFFER.ratio(result) == 1.1
    result.first = _burst([1.0])
    assert math.isinf(OFFER.ratio(result))
    result.baseline = None
    assert math.isnan(OFFER.ratio(result))
