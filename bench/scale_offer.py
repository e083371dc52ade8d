"""bench/scale.py --allocation offer: what offer mode changes in a size, and its figures.

In offer mode (docs/offer-mode.md) the operator runs with `--offer-publishing` and both
policies ask for `allocation: Offer`. Each node's pool lists the placements migpart would
create; kube-scheduler allocates one at once, the operator's relay adds it to the MigNode
spec, the agent creates it, the relay writes `instance-ready` into the claim's
`status.devices`, and the scheduler's PreBind (which polls every 5 s) binds the pod. No kubelet
takes part, as in reactive mode: nothing calls NodePrepareResources, and nothing needs to.

Before the burst the harness waits until both policies report Offer in `status.allocation`
(a testbed that does not serve partitionable devices and binding conditions, 1.34 and 1.35,
keeps them Reactive: the run stops with `OfferNotServed`, saying so) and until every node's
pool offers placements (devices with `bindingConditions`). Before the baseline it switches the
policies to Reactive and waits until no pool is in offer form: the baseline's pods can then
only get the instances the burst created, so the baseline is the control plane alone, as in
reactive mode. Left offering, the scheduler would send most of them to other nodes' placements
(nodes score alike) and the operator would create instances again.

It reports how many claims were allocated a placement not created yet (served from the offer)
and how many pods went PodScheduled=False/Unschedulable on the way (those a round serves
instead), by request kind, and the target: at 1,000 nodes with kube-scheduler's default API
QPS, every pod bound within 1.1 x the baseline's time.
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
from bench.scale_cluster import MERGE_PATCH, POOLS, Tracker, node_names, policy_name
from migpart.api.models import GROUP, POLICY_PLURAL, VERSION
from migpart.dra import DRIVER
from migpart.testbed.build import kube_version

if TYPE_CHECKING:
    from bench.scale_report import Burst, Result
    from bench.scale_run import Size

TARGET_RATIO = 1.1  # every pod bound within this multiple of the baseline's time
TARGET_NODES = 1000
SLICES_PER_PAGE = 100  # a node's pool in offer form is about 200 devices in 5 slices
ZONED = "with a zone selector"


class OfferNotServed(RuntimeError):
    """The testbed's API server does not serve offer mode: the policies stay Reactive."""


# ---------------------------------------------------------------- what the pools say


@dataclass
class Pools:
    """What the listed ResourceSlices of our driver say of each node's pool (pool = node)."""

    offering: set[str] = field(default_factory=set)  # a device waits for a binding condition
    counted: set[str] = field(default_factory=set)  # a slice declares counter sets

    def add(self, slice_: Mapping[str, Any]) -> None:
        spec = slice_.get("spec") or {}
        if spec.get("driver") != DRIVER:
            return
        pool = str((spec.get("pool") or {}).get("name"))
        if any(d.get("bindingConditions") for d in spec.get("devices") or []):
            self.offering.add(pool)
        if spec.get("sharedCounters"):
            self.counted.add(pool)


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


async def await_pools(size: Size, res: Any, offering: bool) -> None:
    """Until every node's pool offers placements (`offering`), or no pool is in offer form."""
    nodes = set(node_names(size.nodes))
    form = "offer" if offering else "reactive"
    deadline = time.monotonic() + 120 + 0.5 * size.nodes
    while True:
        pools = await list_pools(res)
        left = nodes - pools.offering if offering else pools.offering | pools.counted
        if not left:
            return
        size.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out waiting for every node's pool in {form} form: {len(left)} nodes "
                f"not yet, e.g. {', '.join(sorted(left)[:3])}"
            )
        await asyncio.sleep(2.0)


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


async def await_mode(size: Size, custom: Any, mode: str) -> None:
    """Until both policies report `mode` (Offer, Reactive) in effect; `OfferNotServed` when
    Offer was asked for and they report Reactive."""
    deadline = time.monotonic() + 120
    while True:
        reported = await allocations(custom)
        if all(a.get("mode") == mode for a in reported.values()):
            return
        if mode == "Offer" and all(a.get("mode") for a in reported.values()):
            why = "; ".join(
                f"{n}: {a['mode']} ({a.get('reason', '')})" for n, a in reported.items()
            )
            raise OfferNotServed(
                f"this testbed (Kubernetes {kube_version()}) does not serve offer mode, the "
                f"policies run Reactive: {why}. Offer mode needs partitionable devices and "
                "binding conditions (on by default from 1.36): MIGPART_K8S_VERSION=1.37.2"
            )
        size.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for the policies to report {mode}: {reported}")
        await asyncio.sleep(1.0)


async def offer(size: Size, custom: Any, res: Any) -> None:
    """Before the burst: the policies in Offer, every node's pool offering placements."""
    await await_mode(size, custom, "Offer")
    await await_pools(size, res, offering=True)


async def publish_reactively(size: Size, custom: Any, res: Any) -> None:
    """Before the baseline: the policies switched to Reactive, no pool in offer form."""
    for pool in POOLS:
        await raw(
            custom.patch_cluster_custom_object(
                GROUP,
                VERSION,
                POLICY_PLURAL,
                policy_name(pool),
                {"spec": {"allocation": "Reactive"}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )
    await await_mode(size, custom, "Reactive")
    await await_pools(size, res, offering=False)


# ---------------------------------------------------------------- figures


def tally(tracker: Tracker) -> dict[str, Counter[str]]:
    """Per request kind (and for the pods with a zone selector): pods, claims served from the
    offer, pods that went Unschedulable, pods bound."""
    out: dict[str, Counter[str]] = {}
    for name, plan in sorted(tracker.plans.items()):
        for group in [plan.kind] + ([ZONED] if plan.zone else []):
            counts = out.setdefault(group, Counter())
            counts["pods"] += 1
            counts["offered"] += name in tracker.offered
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
    print(
        f"    offer mode: {len(tracker.offered)} of {r.pods} claims allocated a placement not "
        f"created yet (served from the offer); {len(tracker.unschedulable)} pods went "
        f"PodScheduled=False/Unschedulable on the way (served by a round); other "
        f"PodScheduled=False verdicts: {_verdicts(tracker)}"
    )
    kinds = tally(tracker)
    parts = ", ".join(
        f"{kind} {c['offered']}/{c['unschedulable']}/{c['pods']}" for kind, c in kinds.items()
    )
    print(f"      by kind (served from the offer / Unschedulable / pods): {parts}")
    if r.baseline is not None:
        base = r.baseline.tracker
        print(
            "      baseline (policies switched to Reactive first: only the burst's instances "
            f"published): {len(base.offered)} claims allocated a placement, "
            f"{len(base.unschedulable)} pods Unschedulable"
        )
    print(
        f"    offer mode / baseline, all bound: x{ratio(r):.2f} (target at {TARGET_NODES:,} "
        f"nodes with kube-scheduler's default API QPS: <= x{TARGET_RATIO})",
        flush=True,
    )


def target(results: Iterable[Result], scheduler_qps: int) -> None:
    """The offer-mode target, met or NOT met (or not run: another size, or another QPS)."""
    what = (
        f"target {TARGET_NODES} nodes, offer mode, kube-scheduler's default API QPS, every pod "
        f"bound within x{TARGET_RATIO} of the baseline"
    )
    r = next((r for r in results if r.nodes == TARGET_NODES), None)
    if r is None or scheduler_qps:
        print(f"{what}: not run (needs --sizes {TARGET_NODES} --scheduler-qps 0)")
        return
    value = ratio(r)
    print(f"{what}: x{value:.2f}, {'met' if value <= TARGET_RATIO else 'NOT met'}", flush=True)
