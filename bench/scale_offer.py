"""bench/scale.py --allocation offer: what offer mode changes in a size, and its figures.

In offer mode (docs/offer-mode.md) the operator runs with `--offer-publishing` and both
policies ask for `allocation: Offer`. Every node then publishes one stable pool: every
placement the policy allows on each of its 8 H100s (about 200 devices), as partitionable
devices consuming their GPU's counters. kube-scheduler allocates a placement and binds the pod
at once; the instance is made when kubelet prepares the claim. No kubelet runs here, so nothing
is prepared and the fleet (bench/scale_fleet.py) does no work for the burst: pods bind with no
agent and no operator work at all. That is the design, and what this run measures: the
operator writes nothing during the burst (its slice writes per pod are counted, target at most
0.05) and kube-scheduler does the rest. `destroyed-in-use` is followed as in reactive mode (an
allocated placement has no instance to lose here); "missing at the end" is not counted, since
every allocated placement's instance is made only at prepare.

Before the burst the harness waits until both policies report Offer in `status.allocation` (a
testbed that does not serve partitionable devices, 1.34 and 1.35, keeps them Reactive: the run
stops with `OfferNotServed`, saying so) and until every node's pool is published in offer form
(counter sets, and devices that consume them).

The baseline, the control plane alone: the burst's pods and claims are deleted, the operator
is stopped, and the same pods are created again on the same pools. Why that one: the pools are
what kube-scheduler works on (200 devices a node, its filter walks them for each node it
tries), so a baseline on other slices would measure another scheduler load; and reactive
mode's baseline (the policies switched to Reactive, only existing instances published) has
nothing to publish here, since no instance was made. With the operator left running, the
second burst would be the first one again (the pools are not rewritten either way). Stopped,
nothing but the control plane touches the cluster, so migpart's burst over the baseline's is
what the operator's presence costs while the stable pools serve a burst. Beside that ratio the
report prints each component's CPU in both bursts (the baseline's has no operator). Whether
offer mode binds no later than reactive mode is read from two runs on the same fleet,
`--allocation offer` and `--allocation reactive` at the same sizes (docs/benchmarks.md).

It also counts, by request kind, the pods served from the pool (bound and never
`PodScheduled=False/Unschedulable`: no round took part) and those that went Unschedulable.
Targets, at 300 and 1,000 nodes with kube-scheduler's default API QPS (`--scheduler-qps 0`):
every pod bound within 1.1 x the baseline's time, slice writes at most 0.05 per pod.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.scale_api import raw
from bench.scale_cluster import POOLS, Tracker, node_names, policy_name
from migpart.api.models import GROUP, POLICY_PLURAL, VERSION
from migpart.slices.dra import DRIVER
from migpart.testbed.build import kube_version

if TYPE_CHECKING:
    from bench.scale_report import Burst, Result
    from bench.scale_run import Size

TARGET_RATIO = 1.1  # every pod bound within this multiple of the baseline's time
TARGET_SLICE_WRITES_PER_POD = 0.05
TARGET_NODES = (300, 1000)
# Waiting for the policies' mode and every pool (setup, not measured): at 1,000 nodes on a
# shared 2-core machine the operator took over 10 minutes to publish the pools.
SETUP_S = 120.0
SETUP_S_PER_NODE = 1.5
SLICES_PER_PAGE = 100  # a node's stable pool is about 200 devices in 5 slices
ZONED = "with a zone selector"


class OfferNotServed(RuntimeError):
    """The testbed's API server does not serve offer mode: the policies stay Reactive."""


# ---------------------------------------------------------------- what the pools say


@dataclass
class Pools:
    """What the listed ResourceSlices of our driver say of each node's pool (pool = node)."""

    counted: set[str] = field(default_factory=set)  # a slice declares counter sets
    consuming: set[str] = field(default_factory=set)  # a device consumes counters

    def add(self, slice_: Mapping[str, Any]) -> None:
        spec = slice_.get("spec") or {}
        if spec.get("driver") != DRIVER:
            return
        pool = str((spec.get("pool") or {}).get("name"))
        if spec.get("sharedCounters"):
            self.counted.add(pool)
        if any(d.get("consumesCounters") for d in spec.get("devices") or []):
            self.consuming.add(pool)

    @property
    def offering(self) -> set[str]:
        """The pools in offer form: counter sets, and devices that consume them."""
        return self.counted & self.consuming


async def list_pools(res: Any) -> Pools:
    """Every slice, a page at a time (at 1,000 nodes the slices hold some 200,000 devices)."""
    pools = Pools()
    token = ""
    while True:
        more = {"_continue": token} if token else {}
        page = await raw(
            res.list_resource_slice(limit=SLICES_PER_PAGE, _preload_content=False, **more)
        )
        for item in page["items"]:
            pools.add(item)
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return pools


async def await_pools(size: Size, res: Any) -> None:
    """Until every node's pool is published in offer form."""
    nodes = set(node_names(size.nodes))
    deadline = time.monotonic() + SETUP_S + SETUP_S_PER_NODE * size.nodes
    while True:
        left = nodes - (await list_pools(res)).offering
        if not left:
            return
        size.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out waiting for every node's stable pool: {len(left)} nodes not yet, "
                f"e.g. {', '.join(sorted(left)[:3])}"
            )
        # each look lists every node's pool (some 200,000 devices at 1,000 nodes): not often
        await asyncio.sleep(2.0 + size.nodes / 100)


# ---------------------------------------------------------------- the policies' mode


async def allocations(custom: Any) -> dict[str, dict[str, Any]]:
    """Policy name -> its status.allocation ({} until the operator reported one)."""
    out = {}
    for pool in POOLS:
        name = policy_name(pool)
        body = await raw(
            custom.get_cluster_custom_object(
                GROUP, VERSION, POLICY_PLURAL, name, _preload_content=False
            )
        )
        out[name] = dict((body.get("status") or {}).get("allocation") or {})
    return out


async def offer(size: Size, custom: Any, res: Any) -> None:
    """Before the burst: both policies in Offer (`OfferNotServed` when they report another
    mode), every node's stable pool published. Not measured; on a loaded machine the first
    publication of every pool (about 5 slices a node) takes minutes, hence the bound."""
    deadline = time.monotonic() + SETUP_S + SETUP_S_PER_NODE * size.nodes
    while True:
        reported = await allocations(custom)
        if all(a.get("mode") == "Offer" for a in reported.values()):
            break
        if all(a.get("mode") for a in reported.values()):
            why = "; ".join(
                f"{n}: {a['mode']} ({a.get('reason', '')})" for n, a in reported.items()
            )
            raise OfferNotServed(
                f"this testbed (Kubernetes {kube_version()}) does not serve offer mode, the "
                f"policies run Reactive: {why}. Offer mode needs partitionable devices (on by "
                "default from 1.36): MIGPART_K8S_VERSION=1.37.2"
            )
        size.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for the policies to report Offer: {reported}")
        await asyncio.sleep(1.0)
    await await_pools(size, res)


# ---------------------------------------------------------------- figures


def tally(tracker: Tracker) -> dict[str, Counter[str]]:
    """Per request kind (and for the pods with a zone selector): pods, pods served from the
    pool (bound, never Unschedulable), pods that went Unschedulable, pods bound."""
    out: dict[str, Counter[str]] = {}
    for name, plan in sorted(tracker.plans.items()):
        for group in [plan.kind] + ([ZONED] if plan.zone else []):
            counts = out.setdefault(group, Counter())
            counts["pods"] += 1
            counts["served"] += name in tracker.bound and name not in tracker.unschedulable
            counts["unschedulable"] += name in tracker.unschedulable
            counts["bound"] += name in tracker.bound
    return out


def all_bound_s(burst: Burst, pods: int) -> float:
    """First create until the last bind (infinite when some pod was not bound)."""
    bound = burst.bound_s
    return max(bound) if bound and len(bound) == pods else math.inf


def ratio(r: Result) -> float:
    """migpart's all-bound time over the baseline's (nan without a baseline)."""
    if r.baseline is None:
        return math.nan
    first, base = all_bound_s(r.first, r.pods), all_bound_s(r.baseline, r.pods)
    return first / base if math.isfinite(first) and math.isfinite(base) and base > 0 else math.inf


def _verdicts(tracker: Tracker) -> str:
    other = Counter(tracker.not_scheduled.values())
    return ", ".join(f"{reason} {n}" for reason, n in sorted(other.items())) or "none"


def report(r: Result) -> None:
    """Offer mode's lines after a size's report."""
    tracker = r.first.tracker
    kinds = tally(tracker)
    served = sum(c["served"] for kind, c in kinds.items() if kind != ZONED)
    print(
        f"    offer mode: {served} of {r.pods} pods served from the pool (bound, never "
        f"Unschedulable); {len(tracker.unschedulable)} went PodScheduled=False/Unschedulable; "
        f"other PodScheduled=False verdicts: {_verdicts(tracker)}"
    )
    parts = ", ".join(
        f"{kind} {c['served']}/{c['unschedulable']}/{c['pods']}" for kind, c in kinds.items()
    )
    print(f"      by kind (served from the pool / Unschedulable / pods): {parts}")
    if r.baseline is not None:
        print(
            "      baseline (the same pools, the operator stopped): "
            f"{len(r.baseline.tracker.unschedulable)} pods Unschedulable"
        )
    print(
        f"    offer mode / baseline, all bound: x{ratio(r):.2f}; slice writes per pod "
        f"{r.slice_writes / r.pods:.3f}",
        flush=True,
    )


def target(results: Iterable[Result], scheduler_qps: int) -> None:
    """The offer-mode targets per size, met or NOT met (or not run: another size, another
    QPS)."""
    by_nodes = {r.nodes: r for r in results}
    for nodes in TARGET_NODES:
        what = f"target {nodes} nodes, offer mode, kube-scheduler's default API QPS"
        r = by_nodes.get(nodes)
        if r is None or scheduler_qps:
            print(f"{what}: not run (needs --sizes {nodes} --scheduler-qps 0)")
            continue
        value = ratio(r)
        met = "met" if value <= TARGET_RATIO else "NOT met"
        print(
            f"{what}, every pod bound within x{TARGET_RATIO} of the baseline: x{value:.2f}, {met}"
        )
        per_pod = r.slice_writes / r.pods
        met = "met" if per_pod <= TARGET_SLICE_WRITES_PER_POD else "NOT met"
        print(
            f"{what}, slice writes per pod <= {TARGET_SLICE_WRITES_PER_POD}: {per_pod:.3f} "
            f"({r.slice_writes}), {met}",
            flush=True,
        )
