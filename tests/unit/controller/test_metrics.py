"""The operator's metrics forget a deleted policy's gauges but keep its counters."""

from __future__ import annotations

from migpart.controller.core.metrics import Metrics


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


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }


def test_unavailability_reasons_exist_at_zero_from_the_start() -> None:
    found = samples(Metrics())
    assert found[("migpart_unavailable_nodes", (("reason", "LeaseExpired"),))] == 0
    assert found[("migpart_unavailable_nodes", (("reason", "PluginNotRegistered"),))] == 0


def test_a_started_policy_has_its_series_at_zero() -> None:
    metrics = Metrics()
    metrics.start_policy("p")
    found = samples(metrics)
    for name in ("migpart_pending_requests", "migpart_repartitions_total", "migpart_rounds_total"):
        assert found[(name, (("policy", "p"),))] == 0, name
    assert found[("migpart_plan_duration_seconds_count", (("policy", "p"),))] == 0
    for kind in ("temporary", "permanent"):
        assert found[("migpart_round_failures_total", (("kind", kind), ("policy", "p")))] == 0


def test_build_info_and_process_metrics_are_on_the_operators_registry() -> None:
    found = samples(Metrics())
    (labels,) = [dict(k[1]) for k in found if k[0] == "migpart_build_info"]
    assert set(labels) == {"version", "revision", "python_version"}
    assert labels["version"] == __import__("migpart").__version__
    names = {name for name, _ in found}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
