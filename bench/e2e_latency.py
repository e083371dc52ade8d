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
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from migpart.api.models import (
    GROUP,
    MIGNODE_PLURAL,
    POLICY_PLURAL,
    VERSION,
    GpuSpec,
    MigInstanceSpec,
    MigNodeSpec,
)
from migpart.demo.cluster import LocalCluster
from migpart.dra import DRIVER, INSTANCE_READY, allocation_results, awaiting_binding, ours
from migpart.kube.objects import patch_mignode_spec
from migpart.mig import device_name
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from migpart.testing.builders import POOL_LABEL, ClaimBuilder, PodBuilder, PolicyBuilder, profile_is

PROFILES = ["3g.40gb", "1g.10gb", "2g.20gb", "1g.20gb", "4g.40gb", "7g.80gb"]
# offer-existing: the free instances laid out on GPU 0 (memory slices 4-7, 0-1, 2), which
# its pods take
EXISTING = (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2))
NAMESPACE = "bench"
TARGET_P50_S = 3.0
MODES = ("reactive", "offer-new", "offer-existing")
PHASES = {
    "reactive": (
        "unschedulable",
        "batching",
        "planning",
        "protocol",
        "agent",
        "publish",
        "scheduler",
        "kubelet",
    ),
    "offer-new": ("allocated", "relay", "agent", "ready", "bound", "kubelet"),
    "offer-existing": ("allocated", "bound", "kubelet"),
}


@dataclass(frozen=True)
class Sample:
    total: float
    phases: dict[str, float]
    # offer mode: the pod was marked Unschedulable on the way (it went the reactive way)
    unschedulable: bool = False
    # offer mode: the claim was allocated a placement not created yet (binding conditions)
    placement: bool = False


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


# ------------------------------------------------------------------------------ reactive


async def reactive_pod(api: client.ApiClient, node: str, i: int) -> Sample:
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    profile = PROFILES[i % len(PROFILES)]
    name = f"{node}-{i}"
    template: Any = ClaimBuilder(name).request(profile_is(profile)).template()
    await res.create_namespaced_resource_claim_template(NAMESPACE, template)
    before = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
    old_plan = (before.get("spec") or {}).get("planId")
    published = await slice_devices(res, node)
    pod: Any = PodBuilder(name).claim_template(name).node_selector({POOL_LABEL: node}).ends().obj()
    t0 = time.monotonic()
    await core.create_namespaced_pod(NAMESPACE, pod)
    t_unschedulable = t_withdrawn = t_plan = t_agent = t_slice = t_bound = t_running = 0.0
    new_plan = None
    while not t_running:
        now = time.monotonic()
        if now - t0 > 120:
            raise TimeoutError(f"pod {name} not served in 120 s")
        # each state is stamped when the read that shows it returns
        mn = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
        seen = time.monotonic()
        plan = (mn.get("spec") or {}).get("planId")
        if not t_plan and plan and plan != old_plan:
            t_plan, new_plan = seen, plan
        if t_plan and not t_agent and (mn.get("status") or {}).get("observedPlanId") == new_plan:
            t_agent = seen
        if not t_plan and not t_withdrawn and published - await slice_devices(res, node):
            t_withdrawn = time.monotonic()
        if t_agent and not t_slice:
            names = await slice_devices(res, node)
            if any(n.split("-")[2] == profile.replace(".", "") for n in names):
                t_slice = time.monotonic()
        body = await core.read_namespaced_pod(name, NAMESPACE)
        seen = time.monotonic()
        if not t_unschedulable and unschedulable(body):
            t_unschedulable = seen
        if body.status.phase == "Running":
            t_running = seen
            t_bound = t_bound or seen
        elif not t_bound and body.spec.node_name and body.status.resource_claim_statuses:
            claim = await res.read_namespaced_resource_claim(
                body.status.resource_claim_statuses[0].resource_claim_name, NAMESPACE
            )
            if claim.status and claim.status.allocation:
                t_bound = time.monotonic()
        await asyncio.sleep(0.05)
    await core.delete_namespaced_pod(name, NAMESPACE)
    await wait_unprepared(api, node, name)
    planning = await plan_seconds(custom, node, new_plan) if new_plan else 0.0
    t_plan = t_plan or t_bound
    # polled: a step seen in the same poll as a later one counts as done when that one was
    t_withdrawn = min(t_withdrawn or t_plan, t_plan)
    t_unschedulable = min(t_unschedulable or t_withdrawn, t_withdrawn)
    t_agent = t_agent or t_plan
    t_slice = t_slice or t_agent
    values = (
        t_unschedulable - t0,
        max(0.0, t_withdrawn - t_unschedulable - planning),
        planning,
        t_plan - t_withdrawn,
        t_agent - t_plan,
        t_slice - t_agent,
        t_bound - t_slice,
        t_running - t_bound,
    )
    return Sample(t_running - t0, dict(zip(PHASES["reactive"], values, strict=True)))


async def slice_devices(res: client.ResourceV1Api, node: str) -> set[str]:
    slices = await res.list_resource_slice(field_selector=f"spec.nodeName={node}")
    return {d.name for s in slices.items for d in s.spec.devices or []}


async def plan_seconds(custom: client.CustomObjectsApi, policy: str, plan_id: str) -> float:
    """How long the planner took for `plan_id`, from the policy's status.lastPlan.

    The status is written after the spec, so it can lag the pod being bound by a moment.
    """
    for _ in range(200):
        body = await custom.get_cluster_custom_object(GROUP, VERSION, POLICY_PLURAL, policy)
        last = (body.get("status") or {}).get("lastPlan") or {}
        if last.get("planId") == plan_id:
            return float(last["durationMillis"]) / 1000
        await asyncio.sleep(0.05)
    raise TimeoutError(f"policy {policy} never reported plan {plan_id} in status.lastPlan")


# ------------------------------------------------------------------------------ offer mode


async def offer_pod(api: client.ApiClient, node: str, name: str, profile: str, new: bool) -> Sample:
    """One pod of an offer series (`new`: offer-new's phases, else offer-existing's)."""
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    template: Any = ClaimBuilder(name).request(profile_is(profile)).template()
    await res.create_namespaced_resource_claim_template(NAMESPACE, template)
    pod: Any = PodBuilder(name).claim_template(name).node_selector({POOL_LABEL: node}).ends().obj()
    order = PHASES["offer-new" if new else "offer-existing"]
    seen: dict[str, float] = {}
    device = ""
    placement = went_reactive = False
    t0 = time.monotonic()
    await core.create_namespaced_pod(NAMESPACE, pod)
    while "kubelet" not in seen:
        if time.monotonic() - t0 > 120:
            raise TimeoutError(f"pod {name} not served in 120 s")
        # read in the order things happen: claim, MigNode, pod; stamped when the read returns
        if "ready" not in seen and not (device and not new):
            claims = await res.list_namespaced_resource_claim(NAMESPACE)
            stamp = time.monotonic()
            for item in claims.items:  # the pod's claim: the previous one is gone
                claim = api.sanitize_for_serialization(item)
                for result in ours(allocation_results(claim), node):
                    seen.setdefault("allocated", stamp)
                    device = result.device
                    placement = any(d.device == device for d in awaiting_binding(claim))
                if device and new and ready(claim, device):
                    seen["ready"] = stamp
        if new and device and "agent" not in seen:
            mn = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
            stamp = time.monotonic()
            if device in wanted(mn):
                seen.setdefault("relay", stamp)
            if device in created(mn):
                seen["agent"] = stamp
        body = await core.read_namespaced_pod(name, NAMESPACE)
        stamp = time.monotonic()
        went_reactive = went_reactive or unschedulable(body)
        if body.spec.node_name:
            seen.setdefault("bound", stamp)
        if body.status.phase == "Running":
            seen["kubelet"] = stamp
        await asyncio.sleep(0.05)
    events = await core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    )
    went_reactive = went_reactive or bool(events.items)
    await core.delete_namespaced_pod(name, NAMESPACE)
    await wait_unprepared(api, node, name)
    return Sample(seen["kubelet"] - t0, phases(t0, seen, order), went_reactive, placement)


def phases(t0: float, seen: Mapping[str, float], order: Sequence[str]) -> dict[str, float]:
    """Durations of the phases in `order` from the moment each was seen to end; a phase not
    seen, or seen after a later one (polled), ends when the next one did."""
    ends: dict[str, float] = {}
    later = seen[order[-1]]
    for name in reversed(order):
        later = min(seen.get(name, later), later)
        ends[name] = later
    out: dict[str, float] = {}
    start = t0
    for name in order:
        out[name] = ends[name] - start
        start = ends[name]
    return out


def ready(claim: Mapping[str, Any], device: str) -> bool:
    """Whether the claim's status.devices says `device` is ready (the relay's condition)."""
    return any(
        c.get("type") == INSTANCE_READY and c.get("status") == "True"
        for d in (claim.get("status") or {}).get("devices") or []
        if d.get("driver") == DRIVER and d.get("device") == device
        for c in d.get("conditions") or []
    )


def wanted(mignode: Mapping[str, Any]) -> set[str]:
    """The device names of the instances the MigNode spec wants."""
    return {
        device_name(g["index"], i["profile"], i["start"])
        for g in (mignode.get("spec") or {}).get("gpus") or []
        for i in g.get("instances") or []
    }


def created(mignode: Mapping[str, Any], free: bool = False) -> set[str]:
    """The device names of the instances the agent reports created (`free`: and Free)."""
    return {
        device_name(g["index"], i["profile"], i["start"])
        for g in (mignode.get("status") or {}).get("gpus") or []
        for i in g.get("instances") or []
        if i.get("uuid") and (i.get("state") == "Free" or not free)
    }


async def pool(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    """Every device of our slices of the node."""
    slices = await client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={node}"
    )
    return [
        api.sanitize_for_serialization(d)
        for s in slices.items
        if s.spec.driver == DRIVER
        for d in s.spec.devices or []
    ]


async def lay_out(api: client.ApiClient, node: str, layout: Sequence[tuple[str, int]]) -> None:
    """Make GPU 0 of the node hold exactly `layout`, free, and its pool list exactly those
    instances (untainted) beside its offered placements; not timed. Writes the MigNode spec
    (a merge patch: leaderTerm stays) only if the node holds something else."""
    custom = client.CustomObjectsApi(api)
    want = {device_name(0, profile, start) for profile, start in layout}
    mn = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
    if created(mn) == want == created(mn, free=True):
        return
    plan = f"bench-{time.monotonic_ns()}"
    instances = [MigInstanceSpec(profile=profile, start=start) for profile, start in layout]
    await patch_mignode_spec(
        api, node, MigNodeSpec(plan_id=plan, gpus=[GpuSpec(index=0, instances=instances)])
    )
    for _ in range(1200):
        mn = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
        status = mn.get("status") or {}
        if status.get("observedPlanId") == plan and created(mn, free=True) == want:
            devices = await pool(api, node)
            listed = {d["name"] for d in devices if d["attributes"]["created"]["bool"]}
            if listed == want and not any(d.get("taints") for d in devices):
                return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"node {node} did not come to layout {sorted(want)} in 120 s")


# ------------------------------------------------------------------------------ series


def unschedulable(pod: Any) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


async def wait_unprepared(api: client.ApiClient, node: str, pod: str) -> None:
    """Until the deleted pod and its claim are gone and no instance of the node is still
    prepared."""
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    for _ in range(1200):
        pods = await core.list_namespaced_pod(NAMESPACE, field_selector=f"metadata.name={pod}")
        claims = await res.list_namespaced_resource_claim(NAMESPACE)
        mn = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
        states = [
            i["state"]
            for g in (mn.get("status") or {}).get("gpus", [])
            for i in g.get("instances", [])
        ]
        if not pods.items and not claims.items and all(s == "Free" for s in states):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"pod {pod} or its claim still there, or its instance prepared, after 120 s")


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
