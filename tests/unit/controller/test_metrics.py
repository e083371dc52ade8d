"""The operator's metrics forget a deleted policy's gauges but keep its counters."""

from __future__ import annotations

from migpart.controller.metrics import Metrics


def exposed(metrics: Metrics, policy: str) -> set[str]:
    return {
        sample.name
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.labels.get("policy") == policy
    }


def test_forget_policy_drops_gauge_and_histogram_only() -> None:
    metrics = Metrics()
    metrics.pending_requests.labels("gone").set(3)
    metrics.plan_duration.labels("gone").observe(0.01)
    metrics.repartitions.labels("gone").inc()
    metrics.pending_requests.labels("kept").set(1)

    metrics.forget_policy("gone")
    metrics.forget_policy("never-seen")  # no series: nothing to do, no error

    assert exposed(metrics, "gone") == {
        "migpart_repartitions_total",
        "migpart_repartitions_created",
    }
    assert exposed(metrics, "kept") == {"migpart_pending_requests"}
