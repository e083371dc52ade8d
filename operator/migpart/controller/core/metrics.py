"""Prometheus metrics of one operator instance (own registry: several operators may run in
one test process without clashing in the global registry).

Series whose labels are known up front are created at zero (both unavailability reasons at
start, a policy's counters when its planning loop starts): an alert on `increase()` then sees
the first event too, and a scrape shows every series a dashboard or an alert reads.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from migpart.api.models import UnavailableReason
from migpart.process_metrics import register_process_metrics

ROUND_FAILURE_KINDS = ("temporary", "permanent")


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.pending_requests = Gauge(
            "migpart_pending_requests",
            "Pending claim requests per policy (unallocated claims of pods not yet scheduled)",
            ["policy"],
            registry=self.registry,
        )
        self.plan_duration = Histogram(
            "migpart_plan_duration_seconds",
            "Time the planner took for one policy round",
            ["policy"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0),
        )
        self.repartitions = Counter(
            "migpart_repartitions_total",
            "MigNode specs written with a new plan",
            ["policy"],
            registry=self.registry,
        )
        self.rounds = Counter(
            "migpart_rounds_total",
            "Planning rounds run for the policy (a round plans only when its inputs changed)",
            ["policy"],
            registry=self.registry,
        )
        self.slice_publishes = Counter(
            "migpart_resourceslice_publishes_total",
            "ResourceSlice writes (each one bumps the pool generation)",
            registry=self.registry,
        )
        self.round_failures = Counter(
            "migpart_round_failures_total",
            "Policy rounds that failed (kind: temporary or permanent); the next round retries",
            ["policy", "kind"],
            registry=self.registry,
        )
        self.unavailable_nodes = Gauge(
            "migpart_unavailable_nodes",
            "Nodes left out of planning and publishing (reason: LeaseExpired, PluginNotRegistered)",
            ["reason"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "migpart_leader",
            "1 while this operator holds the leader election Lease (or runs without election)",
            registry=self.registry,
        )
        self.leadership_changes = Counter(
            "migpart_leadership_changes_total",
            "Times this operator started or stopped leading",
            registry=self.registry,
        )
        self.fenced_writes = Counter(
            "migpart_fenced_writes_total",
            "Writes refused because this operator no longer held the term they were decided "
            "under (write: spec, slice, withdrawal, restore, conditions, policy status, event)",
            ["write"],
            registry=self.registry,
        )
        self.destroy_aborted = Counter(
            "migpart_destroy_aborted",
            "Devices the destroy protocol kept because a claim was allocated to them",
            registry=self.registry,
        )
        for reason in get_args(UnavailableReason):
            self.unavailable_nodes.labels(reason).set(0)
        register_process_metrics(self.registry)

    def start_policy(self, policy: str) -> None:
        """Create a policy's series at zero when its planning loop starts."""
        self.pending_requests.labels(policy)
        self.plan_duration.labels(policy)
        self.repartitions.labels(policy)
        self.rounds.labels(policy)
        for kind in ROUND_FAILURE_KINDS:
            self.round_failures.labels(policy, kind)

    def forget_policy(self, policy: str) -> None:
        """Drop a policy's gauge and histogram series when its planning loop ends (policy
        deleted, or the operator stopping), so a deleted policy does not report pending
        requests forever.
        Counters stay: they only ever count what happened."""
        for metric in (self.pending_requests, self.plan_duration):
            with contextlib.suppress(KeyError):
                metric.remove(policy)
