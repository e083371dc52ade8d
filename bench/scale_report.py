"""bench/scale.py's figures: what a burst and a size measured, and how they are printed (one
line per size, the baseline, the growth between sizes, the targets)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass

from bench.scale_cluster import (
    GPUS_PER_NODE,
    OPERATOR_USER,
    TARGET_BOUND_S,
    TARGET_CPU_S,
    TARGET_GROWTH,
    TARGET_IDLE_PCT,
    TARGET_RSS_MIB,
    Tracker,
)
from migpart.api.leases import LEASE_DURATION_S


@dataclass
class Burst:
    """What one burst measured."""

    tracker: Tracker
    created_s: float  # creating every claim and pod took this long
    wall_s: float  # first create until the operator was quiet after the last bind
    wall_started: float
    wall_ended: float
    cpu_s: dict[str, float]  # per component
    attempts: Counter[str]  # kube-scheduler's attempts, by result
    lease_gap_s: float  # the longest gap between two renewals of one agent's Lease
    late_leases: int  # agents whose Lease went unrenewed longer than its duration
    stale: int  # nodes the operator marked Stale (Lease not seen renewed in time)

    @property
    def bound_s(self) -> list[float]:
        return self.tracker.delays(self.tracker.bound)

    @property
    def all_bound(self) -> bool:
        return self.tracker.all_bound.is_set()


@dataclass
class Result:
    nodes: int
    pods: int
    latency_ms: float
    timeout_s: float
    bound_s: list[float]
    unschedulable_s: list[float]
    operator_cpu_s: float
    rss_peak_mib: float
    rss_now_mib: float
    api_requests: int
    api_top: list[tuple[str, int]]
    idle_before_pct: float
    idle_after_pct: float
    idle_s: float
    burst_wall_s: float
    cpu_s: dict[str, float]
    scheduler_attempts: Counter[str]
    destroyed_in_use: list[str]
    missing_at_end: list[str]
    setup_s: dict[str, float]
    created_s: float
    first: Burst  # migpart's burst (the figures above are its)
    # the same pods once more, every instance they need already there (None: not run)
    baseline: Burst | None
    allocation: str = "reactive"  # or "offer" (bench/scale_offer.py)
    slice_writes: int = 0  # the operator's ResourceSlice writes over the burst (audit log)

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def all_bound(self) -> bool:
        return len(self.bound_s) == self.pods


# ---------------------------------------------------------------- report

COMPONENTS = (
    "operator",
    "kube-apiserver",
    "etcd",
    "kube-scheduler",
    "kube-controller-manager",
    "agents",
    "harness",
)


def percentile(values: list[float], q: float) -> float:
    """Nearest rank; values missing from a full set count as infinite."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.inf


def seconds(value: float, timeout_s: float) -> str:
    return f">{timeout_s:.0f} s" if math.isinf(value) else f"{value:.2f} s"


def report(r: Result) -> None:
    bound = r.bound_s + [math.inf] * (r.pods - len(r.bound_s))
    unbound = "" if r.all_bound else f" ({len(r.bound_s)} of {r.pods} bound)"
    print(
        f"nodes {r.nodes} gpus {r.gpus} pods {r.pods}: bound "
        f"p50 {seconds(percentile(bound, 0.5), r.timeout_s)} "
        f"p99 {seconds(percentile(bound, 0.99), r.timeout_s)} "
        f"all {seconds(max(bound), r.timeout_s)}{unbound}, "
        f"operator cpu {r.operator_cpu_s:.1f} s, rss {r.rss_peak_mib:.0f} MiB, "
        f"api requests {r.api_requests}",
        flush=True,
    )
    unsched = r.unschedulable_s
    print(
        f"    scheduler's first verdict (Unschedulable) p50 {percentile(unsched, 0.5):.2f} s "
        f"p99 {percentile(unsched, 0.99):.2f} s ({len(unsched)} pods); "
        f"pods created in {r.created_s:.1f} s"
    )
    tries = ", ".join(f"{k} {v}" for k, v in sorted(r.scheduler_attempts.items()))
    print(f"    kube-scheduler attempts over the burst: {tries or 'none'}")
    after = "n/a (not all bound)" if math.isnan(r.idle_after_pct) else f"{r.idle_after_pct:.2f} %"
    print(
        f"    idle operator cpu over {r.idle_s:.0f} s: before the burst "
        f"{r.idle_before_pct:.2f} % of one core, after it (nothing pending) {after}"
    )
    parts = ", ".join(f"{k} {r.cpu_s[k]:.1f}" for k in COMPONENTS if k in r.cpu_s)
    print(f"    cpu s over the burst ({r.burst_wall_s:.1f} s wall, 2 cores): {parts}")
    print(f"    operator rss peak {r.rss_peak_mib:.0f} MiB, now {r.rss_now_mib:.0f} MiB")
    print(
        f"    agent leases over the burst: longest renewal gap {r.first.lease_gap_s:.1f} s, "
        f"{r.first.late_leases} agents late by more than the {LEASE_DURATION_S} s duration; "
        f"nodes the operator marked Stale {r.first.stale}"
    )
    top = ", ".join(f"{k} {v}" for k, v in r.api_top)
    print(f"    operator api requests (audit log, user {OPERATOR_USER}): {top}")
    print(
        f"    slice writes over the burst {r.slice_writes} ({r.slice_writes / r.pods:.3f} per pod)"
    )
    print(
        f"    destroyed-in-use {len(r.destroyed_in_use)}, allocated devices missing at the "
        f"end {len(r.missing_at_end)}"
        + "".join(f"\n      {v}" for v in (r.destroyed_in_use + r.missing_at_end)[:10])
    )
    setup = ", ".join(f"{k} {v:.1f} s" for k, v in r.setup_s.items())
    print(f"    setup (not measured): {setup}", flush=True)
    report_baseline(r)


def report_baseline(r: Result) -> None:
    """The baseline burst and migpart's burst against it."""
    base = r.baseline
    if base is None:
        return
    bound = base.bound_s + [math.inf] * (r.pods - len(base.bound_s))
    first = r.bound_s + [math.inf] * (r.pods - len(r.bound_s))
    parts = ", ".join(f"{k} {base.cpu_s[k]:.1f}" for k in COMPONENTS if k in base.cpu_s)
    tries = ", ".join(f"{k} {v}" for k, v in sorted(base.attempts.items()))
    what = (
        "on the same pools, the operator stopped"
        if r.allocation == "offer"
        else "with every instance they need already there"
    )
    print(
        f"    baseline, the same pods again {what} "
        f"(the control plane alone on this machine): bound p50 "
        f"{seconds(percentile(bound, 0.5), r.timeout_s)} "
        f"p99 {seconds(percentile(bound, 0.99), r.timeout_s)} "
        f"all {seconds(max(bound), r.timeout_s)}; pods created in {base.created_s:.1f} s; "
        f"kube-scheduler attempts: {tries or 'none'}"
    )
    print(f"      cpu s ({base.wall_s:.1f} s wall): {parts}")

    def ratio(a: float, b: float) -> str:
        return "n/a" if math.isinf(a) or math.isinf(b) or b <= 0 else f"x{a / b:.2f}"

    print(
        f"    migpart / baseline: bound p50 {ratio(percentile(first, 0.5), percentile(bound, 0.5))}"
        f", all {ratio(max(first), max(bound))}; migpart adds "
        f"{max(first) - max(bound):.1f} s to the last bind",
        flush=True,
    )


def growth(results: list[Result]) -> None:
    steps = list(itertools.pairwise(results))
    if len(results) > 2:
        steps.append((results[0], results[-1]))
    parts = []
    for a, b in steps:
        cpu = b.operator_cpu_s / a.operator_cpu_s if a.operator_cpu_s else math.inf
        req = b.api_requests / a.api_requests if a.api_requests else math.inf
        parts.append(
            f"{a.nodes} -> {b.nodes} nodes (claims x{b.pods / a.pods:.1f}): operator cpu "
            f"x{cpu:.1f}, api requests x{req:.1f}, rss x{b.rss_peak_mib / a.rss_peak_mib:.1f}"
        )
    if parts:
        print("growth: " + "; ".join(parts))


def targets(results: list[Result]) -> None:
    by_nodes = {r.nodes: r for r in results}

    def line(what: str, value: str, met: bool) -> None:
        print(f"target {what}: {value}, {'met' if met else 'NOT met'}")

    if results and results[0].latency_ms:
        print("(the targets are stated for zero NVML latency)")
    for nodes in (1000, 300):
        r = by_nodes.get(nodes)
        if r is None:
            print(f"target {nodes} nodes: not run")
            continue
        worst = max(r.bound_s + [math.inf] * (r.pods - len(r.bound_s)))
        floor = ""
        if r.baseline is not None:
            base = max(r.baseline.bound_s + [math.inf] * (r.pods - len(r.baseline.bound_s)))
            floor = f" (baseline: all {seconds(base, r.timeout_s)})"
        line(
            f"{nodes} nodes, every pod bound <= {TARGET_BOUND_S:.0f} s after creation",
            f"all {seconds(worst, r.timeout_s)}{floor}",
            worst <= TARGET_BOUND_S,
        )
        line(
            f"{nodes} nodes, operator cpu for the burst <= {TARGET_CPU_S:.0f} s",
            f"{r.operator_cpu_s:.1f} s",
            r.operator_cpu_s <= TARGET_CPU_S,
        )
        if nodes == 1000:
            line(
                f"{nodes} nodes, operator rss <= {TARGET_RSS_MIB:.0f} MiB",
                f"{r.rss_peak_mib:.0f} MiB",
                r.rss_peak_mib <= TARGET_RSS_MIB,
            )
            idle = max(r.idle_before_pct, r.idle_after_pct)
            line(
                f"{nodes} nodes, idle operator < {TARGET_IDLE_PCT:.0f} % of one core",
                f"{idle:.2f} % (the worse of before and after the burst)",
                idle < TARGET_IDLE_PCT,
            )
    small, large = by_nodes.get(100), by_nodes.get(1000)
    if small and large:
        ratio = large.operator_cpu_s / small.operator_cpu_s if small.operator_cpu_s else math.inf
        line(
            f"growth 100 -> 1000 nodes, operator cpu per burst <= x{TARGET_GROWTH:.0f}",
            f"x{ratio:.1f}",
            ratio <= TARGET_GROWTH,
        )
    else:
        print("target growth 100 -> 1000 nodes: not run")
