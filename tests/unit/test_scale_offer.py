"""bench/scale.py in offer mode (bench/scale_offer.py, bench/scale_cluster.py): what the
harness reads from slices, claims and pods, and how it counts them by request kind."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from bench import scale_cluster as CLUSTER
from bench import scale_offer as OFFER
from bench import scale_report as REPORT
from migpart.dra import DRIVER, INSTANCE_READY, placement_device_fields
from migpart.testing.builders import ClaimBuilder, PodBuilder, SliceBuilder


def _plan(name: str, count: int = 1, same_gpu: bool = False, zone: str | None = None) -> Any:
    return CLUSTER.PodPlan(name, "a", "1g.10gb", count, same_gpu, zone)


def _tracker(*plans: Any) -> Any:
    tracker = CLUSTER.Tracker(len(plans))
    for p in plans:
        tracker.created[p.name] = 0.0
        tracker.plans[p.name] = p
    return tracker


def _claim(name: str, offered: bool, ready: bool = False) -> dict[str, Any]:
    claim = ClaimBuilder(name, "scale").allocated("node-1", "gpu-0-1g.10gb-6", offered=offered)
    body: dict[str, Any] = claim.obj()
    if ready:
        condition = {"type": INSTANCE_READY, "status": "True"}
        body["status"]["devices"] = [
            {
                "driver": DRIVER,
                "pool": "node-1",
                "device": "gpu-0-1g.10gb-6",
                "conditions": [condition],
            }
        ]
    return body


def test_a_pool_offers_when_a_device_waits_for_a_binding_condition() -> None:
    pools = OFFER.Pools()
    pools.add(SliceBuilder("n1-counters", "node-1").counter_set("gpu-0", {"compute": 7}).obj())
    offered = SliceBuilder("n1", "node-1").device("gpu-0-1g.10gb-6")
    pools.add(offered.consumes("gpu-0", {"compute": 1}, **placement_device_fields()).obj())
    pools.add(SliceBuilder("n2", "node-2").device("gpu-0-7g.80gb-0").obj())
    other = SliceBuilder("x", "node-3").device("d").spec(driver="other.example.com")
    pools.add(other.consumes("c", {"n": 1}, **placement_device_fields()).obj())
    assert pools.offering == {"node-1"}
    assert pools.counted == {"node-1"}


def test_the_kind_of_a_pod_is_what_its_claim_asks_for() -> None:
    assert _plan("p", 1).kind == "one device"
    assert _plan("p", 2).kind == "two devices"
    assert _plan("p", 2, same_gpu=True).kind == "two on one GPU"


def test_the_policy_asks_for_an_allocation_only_when_given() -> None:
    assert "allocation" not in CLUSTER.policy_body("a", 10)["spec"]
    assert CLUSTER.policy_body("a", 10, "Offer")["spec"]["allocation"] == "Offer"


def test_claims_served_from_the_offer_and_pods_sent_back_are_counted_by_kind() -> None:
    one, two, same = _plan("p1"), _plan("p2", 2, zone="zone-1"), _plan("p3", 2, same_gpu=True)
    tracker = _tracker(one, two, same)
    tracker.on_claim("MODIFIED", _claim("p1", offered=True))
    tracker.on_claim("MODIFIED", _claim("p2", offered=False))
    tracker.on_claim("MODIFIED", _claim("elsewhere", offered=True))  # another burst's
    tracker.on_pod("MODIFIED", PodBuilder("p2", "scale").unschedulable().obj())
    failed = {"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}
    tracker.on_pod("MODIFIED", PodBuilder("p3", "scale").status(conditions=[failed]).obj())
    assert tracker.offered == {"p1"}
    assert set(tracker.unschedulable) == {"p2"}
    assert tracker.not_scheduled == {"p3": "SchedulerError"}
    kinds = OFFER.tally(tracker)
    assert kinds["one device"] == Counter(pods=1, offered=1)
    assert kinds["two devices"] == Counter(pods=1, unschedulable=1)
    assert kinds[OFFER.ZONED] == Counter(pods=1, unschedulable=1)
    assert kinds["two on one GPU"] == Counter(pods=1)


def test_a_placement_not_reported_ready_is_not_missing() -> None:
    waiting = _claim("p1", offered=True)
    assert CLUSTER.not_created_yet(waiting) == {("node-1", "gpu-0-1g.10gb-6")}
    assert CLUSTER.not_created_yet(_claim("p1", offered=True, ready=True)) == set()
    assert CLUSTER.not_created_yet(_claim("p1", offered=False)) == set()


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
