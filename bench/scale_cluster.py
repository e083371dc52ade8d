"""bench/scale.py's cluster: its objects (nodes, the seeded workload, the claims, pods and
policies), what it follows (MigNodes, claims, Leases, pods) and the calls that create the
burst. The processes it measures: bench/scale_processes.py; raw API calls and watches:
bench/scale_api.py."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.scale_api import raw
from migpart.api.leases import LEASE_DURATION_S, lease_node
from migpart.api.models import GROUP, MIGNODE_PLURAL, VERSION
from migpart.api.selectors import MANAGED_LABEL
from migpart.testbed import Testbed
from migpart.testbed.run import ready_node_status
from migpart.testing.builders import (
    POOL_LABEL,
    ClaimBuilder,
    PodBuilder,
    PolicyBuilder,
    profile_is,
)
from migpart.testing.invariants import DestroyedWhileAllocated, allocated_devices, present_devices

BENCH = Path(__file__).resolve().parent
H100 = "NVIDIA H100 80GB HBM3"
GPUS_PER_NODE = 8
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
SAME_GPU_PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb"]  # two of them fit one GPU
NAMESPACE = "scale"
POOLS = ("a", "b")
ZONE_LABEL = "topology.kubernetes.io/zone"
ZONE = "zone-1"
OPERATOR_USER = "migpart-operator"
MERGE_PATCH = "application/merge-patch+json"
CREATE_CONCURRENCY = 50
# The agents' process runs at this nice value (when the benchmark may set it: root).
AGENTS_NICE = -5
SEED = 7
# The operator is quiet when it used less than this share of a core over QUIET_WINDOW_S.
QUIET_CORES = 0.05
QUIET_WINDOW_S = 2.0
# kube-scheduler's own API client limit (default 50 requests/s) would bind at most ~15 pods/s
# here (a claim status write, a binding and events per pod): the scheduler's setting, not
# migpart's speed. Large clusters raise it; so does this benchmark, and says so.
SCHEDULER_QPS = 500

TARGET_BOUND_S = 30.0
TARGET_CPU_S = 30.0
TARGET_RSS_MIB = 1024.0
TARGET_IDLE_PCT = 2.0
TARGET_GROWTH = 12.0

AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
# one entry per request, written when it arrives (watches included)
omitStages: [ResponseStarted, ResponseComplete, Panic]
rules:
- level: Metadata
  users: [{OPERATOR_USER}]
- level: None
"""


# ---------------------------------------------------------------- the cluster's objects


def node_names(n: int) -> list[str]:
    return [f"scale-{i:04d}" for i in range(n)]


def node_labels(i: int, name: str) -> dict[str, str]:
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/mig.capable": "true",
        MANAGED_LABEL: "true",
        POOL_LABEL: POOLS[i % 2],
    }
    if i % 8 < 2:  # a quarter of the nodes, in both pools
        labels[ZONE_LABEL] = ZONE
    return labels


@dataclass(frozen=True, slots=True)
class PodPlan:
    """One pod of the burst and its claim (same name)."""

    name: str
    pool: str
    profile: str
    count: int
    same_gpu: bool
    zone: str | None

    @property
    def kind(self) -> str:
        """What its claim asks for, as the report names it."""
        if self.same_gpu:
            return "two on one GPU"
        return "two devices" if self.count == 2 else "one device"


def workload(m: int, seed: int = SEED) -> list[PodPlan]:
    """The burst's M pods: 80 % one device, 10 % two, 10 % two on one GPU; a tenth with a
    zone selector; pools alternate."""
    rng = random.Random(seed)
    pods = []
    for i in range(m):
        kind = rng.random()
        if kind < 0.1:
            count, same_gpu, profile = 2, False, rng.choice(PROFILES)
        elif kind < 0.2:
            count, same_gpu, profile = 2, True, rng.choice(SAME_GPU_PROFILES)
        else:
            count, same_gpu, profile = 1, False, rng.choice(PROFILES)
        zone = ZONE if rng.random() < 0.1 else None
        pods.append(PodPlan(f"p{i:05d}", POOLS[i % 2], profile, count, same_gpu, zone))
    return pods


def claim_body(p: PodPlan) -> dict[str, Any]:
    claim = ClaimBuilder(p.name).request(profile_is(p.profile), count=p.count)
    if p.same_gpu:
        claim.same_gpu("gpu")
    return claim.obj()


def pod_body(p: PodPlan) -> dict[str, Any]:
    selector = {POOL_LABEL: p.pool, **({ZONE_LABEL: p.zone} if p.zone else {})}
    pod = PodBuilder(p.name).claim(p.name).node_selector(selector)
    return pod.spec(terminationGracePeriodSeconds=0).obj()


def policy_name(pool: str) -> str:
    return f"pool-{pool}"


def policy_body(pool: str, nodes: int, allocation: str | None = None) -> dict[str, Any]:
    """The policy of one pool; `allocation` (Offer, Reactive) is left out unless given: the
    policy's default, Auto, runs Reactive unless the operator publishes offers."""
    policy = PolicyBuilder(policy_name(pool)).spec(mode="Active").pool({POOL_LABEL: pool})
    reconfiguration = {"batchWindowSeconds": 1, "maxConcurrentNodes": max(1, min(1024, nodes))}
    if allocation is not None:
        policy.spec(allocation=allocation)
    return policy.spec(reconfiguration=reconfiguration).obj()


# ---------------------------------------------------------------- what the harness follows


@dataclass
class Monitor:
    """Follows MigNodes and claims: which nodes reported their GPUs, which the operator marked
    Stale, and (`ledger`) every allocated device that vanished from its MigNode after it was
    allocated, ordered by etcd revisions (migpart.testing.invariants)."""

    reported: set[str] = field(default_factory=set)
    ledger: DestroyedWhileAllocated = field(default_factory=DestroyedWhileAllocated)
    stale: set[str] = field(default_factory=set)  # nodes the operator marked Stale

    def on_mignode(self, kind: str, obj: dict[str, Any]) -> None:
        node = obj["metadata"]["name"]
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Stale" and c.get("status") == "True" for c in conditions):
            self.stale.add(node)
        if len((obj.get("status") or {}).get("gpus", [])) == GPUS_PER_NODE:
            self.reported.add(node)
        self.ledger.on_mignode(kind, obj)

    def on_claim(self, kind: str, obj: dict[str, Any]) -> None:
        self.ledger.on_claim(kind, obj)


@dataclass
class LeaseGaps:
    """Follows the agents' Leases: the longest gap between two renewals of one node (by the
    agents' own renewTime), so that a node the operator took out of service can be told
    apart as late agent or late operator. Reset at the start of each burst."""

    last: dict[str, datetime] = field(default_factory=dict)
    worst_s: float = 0.0
    late: set[str] = field(default_factory=set)  # nodes with a gap over the lease duration

    def on_lease(self, kind: str, obj: dict[str, Any]) -> None:
        node = lease_node(obj)
        renew = (obj.get("spec") or {}).get("renewTime")
        if node is None or not renew or kind == "DELETED":
            return
        at = datetime.fromisoformat(renew.replace("Z", "+00:00"))
        before = self.last.get(node)
        self.last[node] = at
        if before is not None:
            gap = (at - before).total_seconds()
            self.worst_s = max(self.worst_s, gap)
            if gap > LEASE_DURATION_S:
                self.late.add(node)

    def reset(self) -> None:
        self.worst_s, self.late = 0.0, set()


@dataclass
class Tracker:
    """Follows the burst's pods: when each was created (client side, just before the call),
    first marked Unschedulable, and bound."""

    expected: int
    created: dict[str, float] = field(default_factory=dict)
    unschedulable: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    all_bound: asyncio.Event = field(default_factory=asyncio.Event)
    plans: dict[str, PodPlan] = field(default_factory=dict)
    # pod -> the first other reason of PodScheduled=False (e.g. a binding that failed)
    not_scheduled: dict[str, str] = field(default_factory=dict)

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name not in self.created or kind == "DELETED":
            return  # a pod of another burst
        now = time.monotonic()
        for c in (obj.get("status") or {}).get("conditions", []):
            if c.get("type") != "PodScheduled" or c.get("status") != "False":
                continue
            if c.get("reason") == "Unschedulable":
                self.unschedulable.setdefault(name, now)
            else:
                self.not_scheduled.setdefault(name, str(c.get("reason")))
        if name not in self.bound and (obj.get("spec") or {}).get("nodeName"):
            self.bound[name] = now
            if len(self.bound) >= self.expected:
                self.all_bound.set()

    def delays(self, stamps: dict[str, float]) -> list[float]:
        return [stamps[n] - t0 for n, t0 in self.created.items() if n in stamps]


MIGNODES = (GROUP, VERSION, MIGNODE_PLURAL)


async def bounded(coros: Iterable[Awaitable[None]], limit: int) -> None:
    """Await all of `coros`, at most `limit` at a time."""
    gate = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[None]) -> None:
        async with gate:
            await coro

    await asyncio.gather(*(one(c) for c in coros))


async def create_node(core: Any, name: str, labels: dict[str, str]) -> None:
    """A Ready, schedulable Node with no kubelet behind it (as Testbed.add_node, by API)."""
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    await raw(core.create_node(body, _preload_content=False))
    status = {"status": ready_node_status()}
    await raw(
        core.patch_node_status(name, status, _content_type=MERGE_PATCH, _preload_content=False)
    )
    # the API server taints new Nodes not-ready; no node lifecycle controller runs here
    await raw(
        core.patch_node(
            name, {"spec": {"taints": None}}, _content_type=MERGE_PATCH, _preload_content=False
        )
    )


async def create_pod(core: Any, res: Any, p: PodPlan, tracker: Tracker) -> None:
    await raw(
        res.create_namespaced_resource_claim(NAMESPACE, claim_body(p), _preload_content=False)
    )
    tracker.created[p.name] = time.monotonic()
    tracker.plans[p.name] = p
    await raw(core.create_namespaced_pod(NAMESPACE, pod_body(p), _preload_content=False))


async def missing_at_end(res: Any, custom: Any) -> list[str]:
    """Allocated devices that are not in their node's MigNode status now (reactive mode: an
    offering node makes its instances at prepare, and no kubelet prepares here)."""
    claims = await raw(res.list_namespaced_resource_claim(NAMESPACE, _preload_content=False))
    mignodes = await raw(custom.list_cluster_custom_object(*MIGNODES, _preload_content=False))
    present = {m["metadata"]["name"]: present_devices(m) for m in mignodes["items"]}
    return sorted(
        f"{node}/{device} (claim {c['metadata']['name']})"
        for c in claims["items"]
        for node, device in allocated_devices(c)
        if device not in present.get(node, set())
    )


async def scheduler_attempts(testbed: Testbed) -> Counter[str]:
    """kube-scheduler's scheduling attempts so far, by result (scheduled, unschedulable,
    error), from its /metrics."""
    url = f"https://127.0.0.1:{testbed.ports['kube-scheduler']}/metrics"
    headers = {"Authorization": f"Bearer {testbed.token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=headers, ssl=False) as resp,
    ):
        text = await resp.text()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("scheduler_schedule_attempts_total{"):
            labels, _, value = line.rpartition(" ")
            result = re.search(r'result="([^"]*)"', labels)
            out[result.group(1) if result else "?"] += int(float(value))
    return out


WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def slice_writes(requests: Counter[str]) -> int:
    """The ResourceSlice writes among `audit_requests`' counts ("verb resource" keys)."""
    return sum(
        n
        for key, n in requests.items()
        if key.partition(" ")[0] in WRITE_VERBS and key.partition(" ")[2] == "resourceslices"
    )


def audit_requests(log: Path, user: str, since: float, until: float) -> Counter[str]:
    """The requests of `user` received in [since, until] (epoch seconds), by verb and
    resource, from the API server's audit log (one entry per request, see AUDIT_POLICY)."""
    out: Counter[str] = Counter()
    if not log.exists():
        return out
    with log.open() as lines:
        for line in lines:
            entry = json.loads(line)
            if (entry.get("user") or {}).get("username") != user:
                continue
            received = datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp()
            if since <= received <= until:
                ref = entry.get("objectRef") or {}
                what = "/".join(filter(None, (ref.get("resource"), ref.get("subresource"))))
                out[f"{entry['verb']} {what or entry['requestURI']}"] += 1
    return out
