"""The demo's pods on the simulator: the conversion, the end-of-replay measures, the line."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from migpart.demo.compare import (
    NVML_CALLS_PER_GPU,
    Measured,
    comparison_line,
    device_classes,
    measure,
    measured,
    sim_config,
    sim_pods,
    simulated,
)
from migpart.demo.replay import Stats, claim_templates
from migpart.demo.run import DemoRun
from migpart.demo.trace import TracePod
from migpart.mig import lookup_table
from tests.crosscheck import TOLERANCE, crosscheck_run

H100 = lookup_table("NVIDIA H100 80GB HBM3")


def run_of(*pods: TracePod, duration_s: float = 60.0, nodes: int = 1, gpus: int = 1) -> DemoRun:
    return DemoRun(H100, pods, duration_s, nodes=nodes, gpus_per_node=gpus)


def test_sim_pods_keep_times_and_take_the_claims_profiles() -> None:
    pods = [
        TracePod("A-1", "1g.10gb", 1, 0.0, 10.0),
        TracePod("B-2", "3g.40gb", 1, 2.5, 7.0),  # second template in order: by memory
        TracePod("C-3", "7g.80gb", 4, 3.0, 5.0),
    ]
    templates = claim_templates(pods, H100)
    policy = run_of(*pods).policy().spec.policy_view()
    got = sim_pods(pods, templates, H100, policy, device_classes())
    assert [(p.name, p.arrival_s, p.duration_s, p.count) for p in got] == [
        ("a-1", 0.0, 10.0, 1),
        ("b-2", 2.5, 7.0, 1),
        ("c-3", 3.0, 5.0, 4),
    ]
    assert got[0].profiles == ("1g.10gb",)
    # at least 40 GB, smallest first, as the operator derives it from the CEL selector
    assert got[1].profiles == ("3g.40gb", "4g.40gb", "7g.80gb")
    assert got[2].profiles == ("7g.80gb",)


def test_sim_config_takes_the_runs_policy_and_latency() -> None:
    run = DemoRun(H100, (), 60.0, nodes=3, gpus_per_node=4, sim_latency_ms=20.0)
    config = sim_config(run)
    assert (config.nodes, config.gpus_per_node) == (3, 4)
    assert config.migpart.batch_window_s == run.batch_window_s
    assert config.migpart.max_concurrent_nodes == run.max_concurrent_nodes
    assert config.actuation_s == pytest.approx(NVML_CALLS_PER_GPU * 0.020)
    assert config.migpart.spares_total == 0
    assert config.migpart.hold_used is None


def test_measured_at_the_end_of_the_replay() -> None:
    # One GPU, actuation 0.15 s: p1 starts at 0.15 and leaves at 20.15, then p2 starts at
    # 20.3 (after a create); p3 would start only after p2 leaves, past the replay's end at
    # 30 s. First-fit destroys p1's 7g when it leaves; p2's would go only after the end.
    run = run_of(
        TracePod("p1", "7g.80gb", 1, 0.0, 20.0),
        TracePod("p2", "7g.80gb", 1, 1.0, 20.0),
        TracePod("p3", "7g.80gb", 1, 25.0, 20.0),
        duration_s=30.0,
    )
    got = simulated(run)
    assert list(got) == ["all-balanced", "first-fit", "migpart", "offer"]
    assert got["all-balanced"] == Measured(3, 0, 0.0, 0, 0)
    first_fit = got["first-fit"]
    assert (first_fit.served, first_fit.creates, first_fit.destroys) == (2, 2, 1)
    assert first_fit.mean_wait_s == pytest.approx((0.15 + 19.3) / 2)
    migpart = got["migpart"]
    # the planner keeps the free 7g for the next pod: one create, no destroy
    assert (migpart.served, migpart.creates, migpart.destroys) == (2, 1, 0)
    offer = got["offer"]
    # p2 is allocated p1's free 7g the instant p1 leaves: one create, no destroy
    assert (offer.served, offer.creates, offer.destroys) == (2, 1, 0)
    assert offer.mean_wait_s == pytest.approx((0.15 + 19.15) / 2)


def test_comparison_line_reads_policy_by_policy() -> None:
    sim = {
        "all-balanced": Measured(24, 20, 12.08, 0, 0),
        "first-fit": Measured(24, 24, 4.0, 24, 24),
    }
    stats = Stats(created=24, served=24, waits_s=[3.0, 3.6], creates=9, destroys=5)
    assert comparison_line(sim, measured(stats)) == (
        "simulator, same 24 pods: all-balanced served 20/24, mean wait 12.1 s, "
        "0 creates+destroys; first-fit served 24/24, mean wait 4.0 s, 48 creates+destroys; "
        "this run: served 24/24, mean wait 3.3 s, 14 creates+destroys"
    )


def test_summary_names_plans_and_instance_changes() -> None:
    stats = Stats(created=2, served=2, waits_s=[1.0, 2.0], repartitions=3, creates=4, destroys=1)
    assert stats.summary() == (
        "served 2/2 pods, mean wait 1.5 s, repartitions 3 (5 MIG creates+destroys), "
        "destroyed-in-use 0"
    )


def test_crosscheck_tolerance_covers_the_simulators_timing() -> None:
    # The e2e cross-check's stretch, with the timing the simulator leaves out made worse than
    # on the testbed: every arrival up to 3 s late, a changed GPU taking up to 4 s.
    run = crosscheck_run()
    config = sim_config(run)
    templates = claim_templates(run.pods, run.table)
    pods = sim_pods(run.pods, templates, run.table, config.planner_policy, device_classes())
    base = measure(config, "migpart", pods, run.duration_s)
    assert base.served == len(pods)
    for seed in range(20):
        rng = random.Random(seed)
        late = [replace(p, arrival_s=p.arrival_s + rng.uniform(0.0, 3.0)) for p in pods]
        for actuation_s in (0.15, 2.0, 4.0):
            got = measure(replace(config, actuation_s=actuation_s), "migpart", late, 60.0)
            assert got.served == len(pods), (seed, actuation_s)
            assert abs(got.changes - base.changes) <= TOLERANCE, (seed, actuation_s, got)
