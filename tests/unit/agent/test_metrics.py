"""The agent's metrics: instances per GPU, GPUs by model and lost, its node's counters at zero
from the start, and the build and process metrics on its own registry."""

from __future__ import annotations

import pytest

from migpart import REVISION_ENV, __version__
from migpart.agent.metrics import AgentMetrics
from migpart.api.models import GpuStatus, InstanceStateName, MigInstanceStatus, MigNodeStatus

H100 = "NVIDIA H100 80GB HBM3"


def samples(metrics: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }


def gpu(index: int, *instances: tuple[str, int, InstanceStateName]) -> GpuStatus:
    return GpuStatus(
        index=index,
        uuid=f"GPU-{index}",
        model=H100,
        mig_enabled=True,
        compute_slices=7,
        memory_slices=8,
        instances=[
            MigInstanceStatus(profile=p, start=s, uuid=f"MIG-{index}-{s}", state=state)
            for p, s, state in instances
        ],
    )


def test_instances_are_counted_per_gpu_and_state() -> None:
    metrics = AgentMetrics("n1")
    metrics.observe_status(
        MigNodeStatus(
            gpus=[
                gpu(0, ("1g.10gb", 0, "Free"), ("1g.10gb", 1, "Prepared"), ("3g.40gb", 4, "Free")),
                gpu(1),
            ],
            lost_gpus=[2],
        )
    )
    found = samples(metrics)

    def per_gpu(index: int, state: str) -> float:
        key = (("gpu", str(index)), ("node", "n1"), ("state", state))
        return found[("migpart_agent_gpu_mig_instances", key)]

    assert (per_gpu(0, "Free"), per_gpu(0, "Prepared"), per_gpu(0, "Busy")) == (2, 1, 0)
    assert (per_gpu(1, "Free"), per_gpu(1, "Prepared"), per_gpu(1, "Busy")) == (0, 0, 0)
    assert found[("migpart_agent_gpus", (("model", H100), ("node", "n1")))] == 2
    assert found[("migpart_agent_lost_gpus", (("node", "n1"),))] == 1
    assert (
        "migpart_agent_gpu_mig_instances",
        (("gpu", "2"), ("node", "n1"), ("state", "Free")),
    ) not in found


def test_a_gpu_that_went_away_loses_its_series() -> None:
    metrics = AgentMetrics("n1")
    metrics.observe_status(MigNodeStatus(gpus=[gpu(0), gpu(1)]))
    metrics.observe_status(MigNodeStatus(gpus=[gpu(0)], lost_gpus=[1]))
    gpus = {
        dict(k[1])["gpu"] for k in samples(metrics) if k[0] == "migpart_agent_gpu_mig_instances"
    }
    assert gpus == {"0"}


def test_the_nodes_counters_and_histogram_exist_at_zero_from_the_start() -> None:
    found = samples(AgentMetrics("n1"))
    node = (("node", "n1"),)
    assert found[("migpart_agent_status_write_failures_total", node)] == 0
    assert found[("migpart_agent_lease_renewal_failures_total", node)] == 0
    assert found[("migpart_agent_reconcile_duration_seconds_count", node)] == 0
    assert found[("migpart_agent_lost_gpus", node)] == 0
    for kind in ("create", "destroy"):
        assert found[("migpart_agent_mig_operations_total", (("kind", kind), ("node", "n1")))] == 0


def test_build_info_names_version_revision_and_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REVISION_ENV, "0123abc")
    found = samples(AgentMetrics("n1"))
    (build,) = [(dict(k[1]), v) for k, v in found.items() if k[0] == "migpart_build_info"]
    labels, value = build
    assert value == 1
    assert labels["version"] == __version__
    assert labels["revision"] == "0123abc"
    assert labels["python_version"].count(".") == 2


def test_process_metrics_are_served_by_each_agent() -> None:
    """Two agents in one process (tests, the demo) each serve them from their own registry."""
    for node in ("a", "b"):
        page = AgentMetrics(node).exposition().decode()
        assert "process_cpu_seconds_total " in page
        assert "process_resident_memory_bytes " in page
        assert "python_info{" in page


def test_a_status_replaces_the_series_of_the_last_one_without_clearing_them_first() -> None:
    """Series the new status lacks are removed; series it keeps are never absent (a scrape
    between a clear and a set would have seen no instance at all)."""
    metrics = AgentMetrics("n1")
    metrics.observe_status(MigNodeStatus(gpus=[gpu(0, ("1g.10gb", 0, "Free")), gpu(1)]))
    removed: list[tuple[str, ...]] = []
    remove = metrics.instances.remove
    metrics.instances.remove = lambda *labels: (removed.append(labels), remove(*labels))[-1]  # type: ignore[method-assign]
    metrics.observe_status(MigNodeStatus(gpus=[gpu(0, ("3g.40gb", 4, "Free"))]))
    found = samples(metrics)
    profiles = {
        dict(labels)["profile"] for name, labels in found if name == "migpart_agent_mig_instances"
    }
    assert profiles == {"3g.40gb"}
    assert removed == [("n1", "1g.10gb", "Free")]
    assert not any(
        name == "migpart_agent_gpu_mig_instances" and dict(labels)["gpu"] == "1"
        for name, labels in found
    )
