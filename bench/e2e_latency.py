"""Reaction time of migpart end to end, on the testbed with the real scheduler, in reactive and
in offer mode.

For each pod it measures the time from the pod's creation to the pod Running on the node's real
kubelet (testbed kubelet, fake container runtime), split into where that time goes. Three
series, each at simulated NVML latency 0 and `--latency-ms`:

`reactive` (policy `allocation: Reactive`): the pod's claim no current layout serves, so

- unschedulable: pod created -> kube-scheduler marked it PodScheduled=False/Unschedulable
  (the resourceclaim controller makes the claim from its template, the scheduler tries once);
  before that the pod is not pending demand for anyone,
- batching: marked Unschedulable -> the operator acted on the plan (withdrew the instances it
  destroys from the slice, or else wrote the new MigNode.spec.planId), less the planning time
  (the watch event, the batch window, the round's other work),
- planning: the planner itself (the policy's status.lastPlan.durationMillis),
- protocol: the destroy protocol, withdrawn -> new planId written (its grace period
  `--withdraw-grace-seconds` and the confirming read); zero for plans that destroy nothing,
- agent: planId written -> the agent reports it converged (status.observedPlanId),
- publish: converged -> the new device is in the node's ResourceSlice,
- scheduler: device published -> pod bound with its claim allocated (scheduler retry),
- kubelet: bound -> pod Running (the kubelet saw the pod, called the agent's
  NodePrepareResources, which wrote the CDI spec, and started the container).

One GPU per node, each pod asking a profile other than the free instance the previous pod
left, so every pod needs a repartition (most of them a destroy).

`offer-new` (policy `allocation: Offer`, docs/offer-mode.md): the node's pool offers placements
not created yet; the pod's profile has no instance on the node, so kube-scheduler allocates an
offered placement at once and waits in PreBind for its binding condition:

- allocated: pod created -> the claim is allocated (the placement, with binding conditions),
- relay: -> the operator's relay wrote the placement into the MigNode spec,
- agent: -> the agent reports the instance created (with its MIG device UUID),
- ready: -> the relay wrote `instance-ready` into the claim's status.devices,
- bound: -> pod bound (kube-scheduler's PreBind polls the claim every 5 s),
- kubelet: -> pod Running.

In offer mode a pod's instance stays after the pod, free and listed, and nothing destroys a
free instance unless a pod needs its space and goes Unschedulable (a reactive round). So that
every offer-new pod needs a new placement on an empty GPU, the bench empties the GPU before
each pod, outside the timed window: it writes the MigNode spec with no instances (as an
administrator editing the spec would; the next planId the relay derives from it), waits until
the agent destroyed the free instance and the pool lists no instance. Without that, the
second pod of a profile would take the first one's free instance (offer-existing), and the
GPU fills with free instances until pods can only go the reactive way.

`offer-existing` (offer mode): before the series the bench lays out free instances of
3g.40gb, 2g.20gb and 1g.10gb on the GPU (the same spec write, as if left by earlier pods), and
each pod asks one of those profiles: kube-scheduler allocates the free instance, which needs no
binding condition, so nothing is created: allocated, bound, kubelet. The layout is checked
again before every pod.

Offer series count the pods that were marked Unschedulable (or got a `FailedScheduling`
Event): those went the reactive way. On a Kubernetes version that does not serve offers
(1.34: no partitionable devices, no binding conditions) the offer policies run Reactive
(status.allocation.mode) and the offer series are skipped with a line saying so.

Each series runs on its own node and policy (node, policy and pool label `<mode>-fast` or
`<mode>-slow`), added before the series and removed after it, so only the measured node runs;
one operator, started with `--offer-publishing`, serves all. Between pods the pod is deleted
and the next one starts only once the pod and its claim are gone and the kubelet unprepared
the claim (the instance is Free again), so each sample starts from a quiet node. Phases are
read by polling every 50 ms, each state stamped when the read that shows it returns; a phase
seen in the same poll as a later one counts as done when that one was.

Usage: `python -m bench.e2e_latency [--pods 50] [--latency-ms 500]
[--modes reactive,offer-new,offer-existing]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes_asyncio import config

from bench.e2e_latency_pods import (
    NAMESPACE,
    PHASES,
    PROFILES,
    Sample,
    lay_out,
    offer_pod,
    reactive_pod,
)
from migpart.demo.cluster import LocalCluster
from migpart.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from migpart.testing.builders import POOL_LABEL, PolicyBuilder

# offer-existing: the free instances laid out on GPU 0 (memory slices 4-7, 0-1, 2), which
# its pods take
EXISTING = (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2))
TARGET_P50_S = 3.0
MODES = ("reactive", "offer-new", "offer-existing")


@dataclass(frozen=True)
class Series:
    mode: str
    speed: str  # "fast" (no NVML latency) or "slow"
    latency_ms: float

    @property
    def node(self) -> str:
        """The series' node, policy and pool label value."""
        return f"{self.mode}-{self.speed}"


@dataclass
class Outcome:
    series: Series
    samples: list[Sample] = field(default_factory=list)
    skipped: str = ""


# ------------------------------------------------------------------------------ series


async def run_series(cluster: LocalCluster, series: Series, pods: int) -> list[Sample]:
    api = await config.new_client_from_config(config_file=str(cluster.testbed.kubeconfig))
    node = series.node
    samples: list[Sample] = []
    try:
        for i in range(pods):
            if series.mode == "reactive":
                samples.append(await reactive_pod(api, node, i))
            elif series.mode == "offer-new":
                await lay_out(api, node, ())
                profile = PROFILES[i % len(PROFILES)]
                samples.append(await offer_pod(api, node, f"{node}-{i}", profile, new=True))
            else:
                await lay_out(api, node, EXISTING)
                profile = EXISTING[i % len(EXISTING)][0]
                samples.append(await offer_pod(api, node, f"{node}-{i}", profile, new=False))
        return samples
    finally:
        await api.close()


def allocation_mode(testbed: Testbed, policy: str) -> dict[str, str]:
    """The policy's status.allocation ({mode, reason}), {} until the operator wrote it."""
    body = json.loads(testbed.kubectl("get", "gpupartitionpolicy", policy, "-o", "json"))
    return dict((body.get("status") or {}).get("allocation") or {})


def published(testbed: Testbed, node: str, offering: bool) -> bool:
    """Whether the node's pool is published: a slice of ours (the operator counts the node
    available), and when `offering`, one that lists a placement not created yet."""
    items = json.loads(testbed.kubectl("get", "resourceslices", "-o", "json"))["items"]
    mine = [s for s in items if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER]
    offered = any(d.get("bindingConditions") for s in mine for d in s["spec"].get("devices") or [])
    return bool(mine) and (offered or not offering)


def measure(cluster: LocalCluster, series: Series, pods: int) -> Outcome:
    """Add the series' node, run its pods, remove the node."""
    testbed, node = cluster.testbed, series.node
    if series.mode != "reactive":
        cluster.wait_for(
            f"policy {node}'s allocation mode", lambda: bool(allocation_mode(testbed, node))
        )
        allocation = allocation_mode(testbed, node)
        if allocation["mode"] != "Offer":
            return Outcome(
                series,
                skipped=(
                    f"policy {node} runs {allocation['mode']} ({allocation['reason']}): "
                    f"offer mode is not served on Kubernetes {kube_version()}; run on 1.37.2"
                ),
            )
    cluster.add_gpu_node(node, "NVIDIA H100 80GB HBM3:1", {POOL_LABEL: node}, series.latency_ms)
    try:
        cluster.wait_for(
            f"MigNode {node}", lambda: node in testbed.kubectl("get", "mignodes", "-o", "name")
        )
        offering = series.mode != "reactive"
        cluster.wait_for(f"{node}'s pool", lambda: published(testbed, node, offering))
        samples = asyncio.run(run_series(cluster, series, pods))
        cluster.check_alive()
    finally:
        cluster.remove_gpu_node(node)
    return Outcome(series, samples)


# ------------------------------------------------------------------------------ report


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(outcome: Outcome) -> None:
    series = outcome.series
    label = f"{series.mode} at NVML latency {series.latency_ms:.0f} ms"
    if outcome.skipped:
        print(f"{label}: skipped: {outcome.skipped}")
        return
    samples = outcome.samples
    totals = [s.total for s in samples]
    print(
        f"{label}: {len(samples)} pods  p50 {statistics.median(totals):.2f} s  "
        f"p95 {pct(totals, 0.95):.2f} s  max {max(totals):.2f} s"
    )
    for part in PHASES[series.mode]:
        values = [s.phases[part] for s in samples]
        print(
            f"    {part:<13} median {statistics.median(values):6.3f} s   "
            f"p95 {pct(values, 0.95):6.3f} s"
        )
    if series.mode != "reactive":
        went = sum(s.unschedulable for s in samples)
        new = sum(s.placement for s in samples)
        print(
            f"    Unschedulable on the way (went the reactive way): {went} of {len(samples)}; "
            f"allocated a placement not created yet: {new} of {len(samples)}"
        )


def summary(outcomes: Sequence[Outcome], speeds: Sequence[tuple[str, float]]) -> None:
    head = "".join(f"  {f'{latency:.0f} ms p50 / p95':>22}" for _, latency in speeds)
    print(f"{'mode':<15}{head}")
    for mode in dict.fromkeys(o.series.mode for o in outcomes):
        cells = []
        for speed, _ in speeds:
            found = [o for o in outcomes if o.series.mode == mode and o.series.speed == speed]
            if not found or found[0].skipped:
                cells.append(f"  {'skipped':>22}")
                continue
            totals = [s.total for s in found[0].samples]
            text = f"{statistics.median(totals):.2f} / {pct(totals, 0.95):.2f} s"
            cells.append(f"  {text:>22}")
        print(f"{mode:<15}{''.join(cells)}")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pods", type=int, default=50, help="pods per mode and latency")
    p.add_argument(
        "--latency-ms",
        type=float,
        default=500.0,
        help="realistic simulated NVML latency per GPU/compute instance operation",
    )
    p.add_argument("--batch-window", type=int, default=0)
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (default all)",
    )
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes: choose among {', '.join(MODES)}")
    speeds = (("fast", 0.0), ("slow", args.latency_ms))
    all_series = [Series(mode, speed, latency) for mode in modes for speed, latency in speeds]
    work = Path(tempfile.mkdtemp(prefix="migpart-bench-"))
    testbed = Testbed(work / "testbed")
    cluster = LocalCluster(testbed, work)
    try:
        testbed.start()
        cluster.install()
        testbed.kubectl("create", "namespace", NAMESPACE)
        for series in all_series:
            policy = (
                PolicyBuilder(series.node)
                .pool({POOL_LABEL: series.node})
                .spec(
                    allocation="Reactive" if series.mode == "reactive" else "Offer",
                    reconfiguration={
                        "batchWindowSeconds": args.batch_window,
                        "maxConcurrentNodes": 1,
                    },
                )
            )
            testbed.kubectl("apply", "-f", "-", input=json.dumps(policy.obj()))
        cluster.start_operator("--offer-publishing")
        print(
            f"e2e latency through the real kubelet (Kubernetes {kube_version()}), batch window "
            f"{args.batch_window} s, one H100 per node, operator with --offer-publishing, "
            f"logs in {work / 'logs'}",
            flush=True,
        )
        outcomes = []
        for series in all_series:
            outcome = measure(cluster, series, args.pods)
            report(outcome)
            sys.stdout.flush()
            outcomes.append(outcome)
        cluster.check_alive()
        print()
        summary(outcomes, speeds)
        for outcome in outcomes:
            if outcome.series.speed == "fast" and not outcome.skipped:
                p50 = statistics.median(s.total for s in outcome.samples)
                met = "met" if p50 < TARGET_P50_S else "NOT met"
                print(
                    f"target p50 < {TARGET_P50_S:.0f} s at zero NVML latency, "
                    f"{outcome.series.mode}: {p50:.2f} s, {met}"
                )
    finally:
        cluster.stop()
        testbed.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
