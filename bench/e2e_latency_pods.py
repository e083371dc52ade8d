"""One pod of `bench.e2e_latency`, measured: created, followed by polling every 50 ms until
Running, its phases stamped (the phases of each mode: `bench/e2e_latency.py`'s docstring), then
deleted and waited out until its node is quiet again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from migpart.api.models import GROUP, MIGNODE_PLURAL, POLICY_PLURAL, VERSION
from migpart.mig import device_name
from migpart.slices.dra import allocation_results, ours
from migpart.testing.builders import POOL_LABEL, ClaimBuilder, PodBuilder, profile_is

NAMESPACE = "bench"
# what the reactive and offer-new pods ask, in turn: each a profile other than the last one's
PROFILES = ["3g.40gb", "1g.10gb", "2g.20gb", "1g.20gb", "4g.40gb", "7g.80gb"]
# where the time of each mode's pod goes, in order
OFFER_PHASES = ("allocated", "bound", "kubelet")
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
    "offer-new": OFFER_PHASES,
    "offer-existing": OFFER_PHASES,
}


@dataclass(frozen=True)
class Sample:
    total: float
    phases: dict[str, float]
    # offer mode: the pod was marked Unschedulable on the way (it went the reactive way)
    unschedulable: bool = False
    # offer mode: no instance was at the allocated placement when the pod was created (the
    # agent made it at prepare)
    new: bool = False
    # offer mode: an instance the node had before the pod was gone after it (prepare destroyed
    # a free instance in the new placement's way)
    made_room: bool = False


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


async def offer_pod(api: client.ApiClient, node: str, name: str, profile: str) -> Sample:
    """One pod of an offer series: kube-scheduler allocates the first placement of `profile`
    in the node's pool and binds at once; the agent makes its instance when kubelet prepares
    the claim (reusing one already there, destroying free ones in its way)."""
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    custom = client.CustomObjectsApi(api)
    template: Any = ClaimBuilder(name).request(profile_is(profile)).template()
    await res.create_namespaced_resource_claim_template(NAMESPACE, template)
    pod: Any = PodBuilder(name).claim_template(name).node_selector({POOL_LABEL: node}).ends().obj()
    before = created(await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node))
    seen: dict[str, float] = {}
    device = ""
    went_reactive = False
    t0 = time.monotonic()
    await core.create_namespaced_pod(NAMESPACE, pod)
    while "kubelet" not in seen:
        if time.monotonic() - t0 > 120:
            raise TimeoutError(f"pod {name} not served in 120 s")
        # read in the order things happen: claim, pod; stamped when the read returns
        if not device:
            claims = await res.list_namespaced_resource_claim(NAMESPACE)
            stamp = time.monotonic()
            for item in claims.items:  # the pod's claim: the previous one is gone
                for result in ours(allocation_results(api.sanitize_for_serialization(item)), node):
                    seen.setdefault("allocated", stamp)
                    device = result.device
        body = await core.read_namespaced_pod(name, NAMESPACE)
        stamp = time.monotonic()
        went_reactive = went_reactive or unschedulable(body)
        if body.spec.node_name:
            seen.setdefault("bound", stamp)
        if body.status.phase == "Running":
            seen["kubelet"] = stamp
        await asyncio.sleep(0.05)
    # Not timed: until the agent reports the instance prepared, so that the wait below sees
    # it go Free. A status written before the claim was recorded (a pass that read NVML
    # while prepare ran) shows it Free already: a next pod sent on that would find the
    # instance still prepared at its own prepare, and kubelet retries that a minute later.
    for _ in range(1200):
        mn = await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node)
        if device in created(mn) - created(mn, free=True):
            break
        await asyncio.sleep(0.1)
    await core.delete_namespaced_pod(name, NAMESPACE)
    await wait_unprepared(api, node, name)
    after = created(await custom.get_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL, node))
    return Sample(
        seen["kubelet"] - t0,
        phases(t0, seen, OFFER_PHASES),
        unschedulable=went_reactive,
        new=device not in before,
        made_room=bool(before - after),
    )


async def failed_scheduling(api: client.ApiClient, prefix: str) -> set[str]:
    """The pods named `prefix`... that got a FailedScheduling Event (read at the end of a
    series: the scheduler records its Events asynchronously, and they outlive the pod)."""
    events = await client.CoreV1Api(api).list_namespaced_event(
        NAMESPACE, field_selector="reason=FailedScheduling,involvedObject.kind=Pod"
    )
    return {
        e.involved_object.name
        for e in events.items
        if e.involved_object.name and e.involved_object.name.startswith(prefix)
    }


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


def created(mignode: Mapping[str, Any], free: bool = False) -> set[str]:
    """The device names of the instances the agent reports created (`free`: and Free)."""
    return {
        device_name(g["index"], i["profile"], i["start"])
        for g in (mignode.get("status") or {}).get("gpus") or []
        for i in g.get("instances") or []
        if i.get("uuid") and (i.get("state") == "Free" or not free)
    }


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
