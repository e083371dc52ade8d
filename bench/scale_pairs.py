"""bench/scale.py --election-pairs K: the operator's CPU with leader election on and off, paired
in one control plane.

Two separate runs of bench/scale.py differ by more than election costs: the 1,000-node burst
takes the operator 24 to 36 s of CPU from one run to the next on this machine, mostly from how
rounds and Lease renewals fall under load. So the comparison is paired: ONE testbed and ONE set
of N Nodes, then 2K bursts of the same pods, alternating the operator's `--leader-elect` and
`--no-leader-elect` in ABBA order (on-off, off-on, ...), so that a drift of the control plane
(etcd growing, caches warming) falls on both sides alike.

Before each burst the cluster is set back to where the first one started: the burst's pods and
claims deleted, the operator and the agents stopped, every MigNode deleted (its slices go with
it: they are owned), and the agents started again on GPUs without MIG instances (a new state
directory); then the operator of the turn starts, is left to go quiet, and its idle CPU is
measured before and after the burst. Each burst therefore does the same work: every claim
needs a repartition.

It prints one line per burst, then per setting the medians of the operator's burst CPU, its
idle CPU before and after, all-bound time and API requests, and on/off as ratios (target: within
5 %). `destroyed-in-use` is followed through every burst, as in a plain run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from bench.scale_api import raw
from bench.scale_cluster import (
    CREATE_CONCURRENCY,
    MIGNODES,
    OPERATOR_USER,
    PodPlan,
    audit_requests,
    bounded,
    create_node,
    node_labels,
    node_names,
)
from bench.scale_run import Size
from migpart.slices.dra import RESOURCE_GROUP, RESOURCE_VERSION

SLICES = (RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")


@dataclass
class Sample:
    """One burst of a pair."""

    leader_elect: bool
    operator_cpu_s: float
    idle_before_pct: float
    idle_after_pct: float
    all_bound_s: float  # first create until the last pod was bound (nan: not all bound)
    api_requests: int
    stale: int

    @property
    def setting(self) -> str:
        return "on" if self.leader_elect else "off"


@dataclass
class Pairs:
    """Every burst of a paired run; `ok` when all were bound and nothing in use was lost."""

    nodes: int
    samples: list[Sample] = field(default_factory=list)
    destroyed_in_use: list[str] = field(default_factory=list)
    all_bound: bool = True

    @property
    def ok(self) -> bool:
        return self.all_bound and not self.destroyed_in_use


def order(pairs: int) -> list[bool]:
    """ABBA: on, off, off, on, on, off, ... (True: leader election on)."""
    out: list[bool] = []
    for i in range(pairs):
        out += [True, False] if i % 2 == 0 else [False, True]
    return out


async def _gone(size: Size, list_call: Any, what: str) -> None:
    deadline = time.monotonic() + 120 + 0.2 * size.nodes
    while (await raw(list_call()))["items"]:
        size.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what} to be deleted")
        await asyncio.sleep(1.0)


async def reset(size: Size, core: Any, res: Any, custom: Any) -> None:
    """Back to GPUs without instances: no pods, claims, operator, MigNodes or slices; the
    agents started again on fresh GPUs and reporting."""
    await size.clear(core, res)
    size.children.stop_one("operator")
    size.children.stop_one("agents")
    await raw(custom.delete_collection_cluster_custom_object(*MIGNODES, _preload_content=False))
    await _gone(
        size,
        lambda: custom.list_cluster_custom_object(*MIGNODES, limit=1, _preload_content=False),
        "the MigNodes",
    )
    # the garbage collector deletes the slices the MigNodes owned
    await _gone(
        size,
        lambda: custom.list_cluster_custom_object(*SLICES, limit=1, _preload_content=False),
        "the ResourceSlices",
    )
    size.monitor.reported.clear()
    await size.start_agents()


def body(size: Size) -> Any:
    """The paired run, for `run_size(..., body=body)`."""

    async def run(core: Any, res: Any, custom: Any, pods: list[PodPlan]) -> Pairs:
        names = node_names(size.nodes)
        await bounded(
            (create_node(core, n, node_labels(i, n)) for i, n in enumerate(names)),
            CREATE_CONCURRENCY,
        )
        await size.start_agents()
        await size.create_policies(custom)
        out = Pairs(size.nodes)
        turns = order(size.args.election_pairs)
        for turn, leader_elect in enumerate(turns):
            if turn:
                await reset(size, core, res, custom)
            operator = await size.start_operator(leader_elect)
            idle_before = await size.idle_pct(operator)
            batch = [replace(p, name=f"{p.name}-{turn}") for p in pods]
            burst = await size.burst(core, res, batch, operator)
            bound = burst.all_bound
            out.all_bound &= bound
            idle_after = await size.idle_pct(operator) if bound else float("nan")
            requests = audit_requests(
                size.audit_log, OPERATOR_USER, burst.wall_started, burst.wall_ended
            )
            sample = Sample(
                leader_elect=leader_elect,
                operator_cpu_s=burst.cpu_s["operator"],
                idle_before_pct=idle_before,
                idle_after_pct=idle_after,
                all_bound_s=max(burst.bound_s) if bound and burst.bound_s else float("nan"),
                api_requests=sum(requests.values()),
                stale=burst.stale,
            )
            out.samples.append(sample)
            print(
                f"  burst {turn + 1}/{len(turns)} election {sample.setting:<3}  operator CPU "
                f"{sample.operator_cpu_s:6.1f} s  idle {idle_before:4.2f} / {idle_after:4.2f} %"
                f"  all bound {sample.all_bound_s:6.1f} s  API requests {sample.api_requests}"
                f"  stale nodes {sample.stale}",
                flush=True,
            )
        out.destroyed_in_use = [str(v) for v in size.monitor.ledger.violations]
        return out

    return run


def report(p: Pairs) -> None:
    """Medians per setting and on/off ratios; the 5 % target, met or NOT met."""

    def med(setting: bool, attr: str) -> float:
        values = [getattr(s, attr) for s in p.samples if s.leader_elect is setting]
        return statistics.median(values) if values else float("nan")

    print(f"{p.nodes} nodes, {len(p.samples) // 2} pairs (medians)")
    rows = [
        ("operator CPU over the burst (s)", "operator_cpu_s"),
        ("idle CPU before the burst (%)", "idle_before_pct"),
        ("idle CPU after the burst (%)", "idle_after_pct"),
        ("all bound (s)", "all_bound_s"),
        ("operator API requests", "api_requests"),
    ]
    for label, attr in rows:
        on, off = med(True, attr), med(False, attr)
        ratio = on / off if off else float("nan")
        print(f"  {label:<34} on {on:8.2f}  off {off:8.2f}  on/off {ratio:5.3f}")
    # A burst in which nodes went Stale measured an overloaded machine (the agents' Leases
    # lapsed, and the operator took those nodes out of service and back), not election: said,
    # with the medians over the other bursts beside the medians over all.
    disturbed = [i + 1 for i, s in enumerate(p.samples) if s.stale]
    if disturbed:
        clean = [s for s in p.samples if not s.stale]
        print(f"  disturbed bursts (nodes went Stale): {disturbed}; undisturbed bursts only:")
        for label, attr in rows:
            on_values = [getattr(s, attr) for s in clean if s.leader_elect]
            off_values = [getattr(s, attr) for s in clean if not s.leader_elect]
            if on_values and off_values:
                on, off = statistics.median(on_values), statistics.median(off_values)
                print(f"    {label:<32} on {on:8.2f}  off {off:8.2f}  on/off {on / off:5.3f}")
    burst = med(True, "operator_cpu_s") / med(False, "operator_cpu_s")
    idle = (med(True, "idle_before_pct") + med(True, "idle_after_pct")) / (
        med(False, "idle_before_pct") + med(False, "idle_after_pct")
    )
    for what, ratio in (("burst CPU", burst), ("idle CPU", idle)):
        verdict = "met" if abs(ratio - 1.0) <= 0.05 else "NOT met"
        print(f"  target: {what} with election within 5 % of without: {ratio:.3f} ({verdict})")
    lost = len(p.destroyed_in_use)
    print(f"  destroyed-in-use {lost}; all bound in every burst: {p.all_bound}")
