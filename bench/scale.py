"""Scale of migpart end to end: N simulated GPU nodes, then M pending pods at once.

For each size N it starts a fresh testbed (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager on loopback; the binary is cached) and:

1. creates N Node objects through the API (Ready, untainted, `nvidia.com/mig.capable`), half
   in pool a and half in pool b (`migpart.io/pool`), a quarter of each with a zone label.
   Kubelets: none. Pods are bound by kube-scheduler but never run: the one light stand-in
   the project allows, at this scale only;
2. starts one process hosting the real agent of every node (bench/scale_agents.py: the real
   `serve` on the simulated NVML, 8 x H100 80GB per node, NVML latency `--latency-ms`, one
   asyncio loop and one ApiClient; at nice -5 where permitted, since it stands for N machines
   whose Lease renewals would not wait behind the control plane) and waits until every
   MigNode reports its GPUs, so that agent start-up is not part of the burst;
3. applies two GpuPartitionPolicies (pool a, pool b; Active; batch window 1 s; no spares;
   maxConcurrentNodes = the pool's size) and starts the real operator (`migpart operator`)
   as a user of its own, so that the API server's audit log counts its requests; waits until
   it is quiet and measures its idle CPU;
4. the burst: M = pods-per-node x N ResourceClaims and pods, created together (50 in
   flight), mixed with a fixed seed: one device of 1g.10gb..7g.80gb (CEL on the profile),
   two devices, two devices on one GPU (matchAttribute parentUUID), a tenth with a node
   selector on the zone label; every pod selects its pool. No GPU holds a MIG instance yet,
   so every claim needs the operator to repartition;
5. times each pod from just before its create call until a watch shows `spec.nodeName`
   (kube-scheduler binds only once the claim is allocated), until all are bound or
   `--timeout-s`;
6. reports, over the burst (first create until the operator is quiet after the last bind):
   the operator's CPU (utime+stime from /proc/<pid>/stat), its peak RSS (VmHWM), the API
   requests it made (the audit log's entries of its user), the other components' CPU; then
   the operator's idle CPU with nothing pending, and `destroyed-in-use`: allocated devices
   that vanished from their MigNode (followed by watch during the whole run, and checked
   once more at the end). No kubelet prepares the claims, so every protection of an
   allocated device is the operator's.
7. the baseline (unless `--no-baseline`): deletes the burst's pods and claims (their instances
   stay) and creates the same pods again under new names. Every instance they need exists and
   is published, so the operator repartitions nothing: this is the control plane alone
   (API server, scheduler, controller manager) serving the same burst on this machine. It
   prints that burst, and migpart's burst as a ratio to it. On a small machine the baseline
   alone may take longer than an absolute target; the ratio and the seconds migpart adds
   are what carry over to other machines.

One line per size, then the growth between sizes and the targets (met or NOT met; a
benchmark prints, it does not assert). Usage: `python bench/scale.py [--sizes 100,300,1000]
[--latency-ms 0] [--pods-per-node 2] [--timeout-s 180]`; `make bench-scale` runs 100, 300 and
1,000 nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from signal import SIGINT, SIGTERM
from typing import IO, Any

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import (
    ApiClient,
    Configuration,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    ResourceV1Api,
)

from migpart.api.leases import LEASE_DURATION_S, LEASE_NAMESPACE, lease_node
from migpart.api.models import GROUP, MIGNODE_PLURAL, POLICY_PLURAL, VERSION
from migpart.demo.cluster import LocalCluster
from migpart.testbed import Testbed, build
from migpart.testbed.run import ready_node_status, terminate_all
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
CLK_TCK = os.sysconf("SC_CLK_TCK")
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


def policy_body(pool: str, nodes: int) -> dict[str, Any]:
    policy = PolicyBuilder(f"pool-{pool}").spec(mode="Active").pool({POOL_LABEL: pool})
    reconfiguration = {"batchWindowSeconds": 1, "maxConcurrentNodes": max(1, min(1024, nodes))}
    return policy.spec(reconfiguration=reconfiguration).obj()


# ---------------------------------------------------------------- processes and /proc


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields from the 3rd (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_mib(pid: int) -> tuple[float, float]:
    """(peak, current) resident set of a process in MiB: VmHWM and VmRSS."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) / 1024  # kB
    return values.get("VmHWM", 0.0), values.get("VmRSS", 0.0)


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Children:
    """The processes this benchmark starts besides the testbed; `stop()` ends all of them."""

    logs: Path
    procs: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str]) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.procs[name] = (proc, log)
        return proc.pid

    def pid(self, name: str) -> int:
        return self.procs[name][0].pid

    def check_alive(self) -> None:
        for name, (proc, _) in self.procs.items():
            if proc.poll() is not None:
                log = self.logs / f"{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"{name} exited with {proc.returncode}; {log}:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        terminate_all(list(self.procs.values()), grace_s)
        self.procs.clear()


# ---------------------------------------------------------------- API calls, raw


class ApiError(RuntimeError):
    """An error status from the API server (raw calls do not raise the client's own)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        return self.status == 429 or self.status >= 500


async def raw(call: Awaitable[Any]) -> dict[str, Any]:
    """Await a generated client call made with `_preload_content=False`; fail on an error
    status, return the JSON body. Raw JSON spares the harness the client's model objects,
    whose CPU would be taken from the components measured on the same two cores."""
    resp = await call
    try:
        data = await resp.read()
        if not 200 <= resp.status < 300:
            what = f"{resp.method} {resp.url.path}: {resp.status} {data[:300]!r}"
            raise ApiError(resp.status, what)
        body: dict[str, Any] = json.loads(data) if data else {}
        return body
    finally:
        resp.release()


async def follow(
    list_call: Callable[..., Awaitable[Any]],
    on_event: Callable[[str, dict[str, Any]], None],
    *args: Any,
) -> None:
    """List, then watch forever (raw JSON), calling `on_event(type, object)` for every object
    of the list ("ADDED") and every event; lists again when the watch expires (410) and
    retries after a transient error (e.g. a new CRD's storage still initializing)."""
    while True:
        try:
            await _follow(list_call, on_event, *args)
        except ApiError as err:
            if not err.transient:
                raise
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1.0)


async def _follow(
    list_call: Callable[..., Awaitable[Any]],
    on_event: Callable[[str, dict[str, Any]], None],
    *args: Any,
) -> None:
    while True:
        listed = await raw(list_call(*args, _preload_content=False))
        for obj in listed["items"]:
            on_event("ADDED", obj)
        version = listed["metadata"]["resourceVersion"]
        while version:
            resp = await list_call(
                *args,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=600,
                _preload_content=False,
            )
            try:
                if not 200 <= resp.status < 300:
                    raise ApiError(resp.status, f"watch {resp.url.path}: {resp.status}")
                async for line in resp.content:
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        version = ""  # gone: list again
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        on_event(event["type"], event["object"])
            finally:
                resp.release()


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

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name not in self.created or kind == "DELETED":
            return  # a pod of another burst
        now = time.monotonic()
        if name not in self.unschedulable and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (obj.get("status") or {}).get("conditions", [])
        ):
            self.unschedulable[name] = now
        if name not in self.bound and (obj.get("spec") or {}).get("nodeName"):
            self.bound[name] = now
            if len(self.bound) >= self.expected:
                self.all_bound.set()

    def delays(self, stamps: dict[str, float]) -> list[float]:
        return [stamps[n] - t0 for n, t0 in self.created.items() if n in stamps]


# ---------------------------------------------------------------- one size


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

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def all_bound(self) -> bool:
        return len(self.bound_s) == self.pods


@dataclass
class Size:
    """One run: the testbed, the processes, the clients and followers of one size."""

    nodes: int
    args: argparse.Namespace
    testbed: Testbed
    children: Children
    work: Path
    operator_kubeconfig: Path
    audit_log: Path
    setup_s: dict[str, float] = field(default_factory=dict)
    followers: list[asyncio.Task[None]] = field(default_factory=list)
    tracker: Tracker = field(default_factory=lambda: Tracker(0))  # the burst's, once started
    monitor: Monitor = field(default_factory=Monitor)
    leases: LeaseGaps = field(default_factory=LeaseGaps)

    def check_alive(self) -> None:
        """Raise if a component, a child process or one of the harness's watches ended."""
        self.testbed.check_alive()
        self.children.check_alive()
        for task in self.followers:
            if task.done():
                task.result()  # raises what ended the watch
                raise RuntimeError("a watch of the harness ended")

    async def wait(self, what: str, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            await asyncio.sleep(0.2)

    async def quiet(self, pid: int, max_s: float) -> float:
        """Wait until `pid` is quiet (or max_s passed); return the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < max_s:
            before = cpu_seconds(pid)
            await asyncio.sleep(QUIET_WINDOW_S)
            self.check_alive()
            if cpu_seconds(pid) - before < QUIET_CORES * QUIET_WINDOW_S:
                break
        return time.monotonic() - started

    async def idle_pct(self, pid: int) -> float:
        """The share of one core `pid` used over the idle interval, in %."""
        before = cpu_seconds(pid)
        await asyncio.sleep(self.args.idle_s)
        self.check_alive()
        return 100.0 * (cpu_seconds(pid) - before) / float(self.args.idle_s)

    def cpu_all(self) -> dict[str, float]:
        pids = {**self.testbed.pids(), "agents": self.children.pid("agents")}
        pids["operator"] = self.children.pid("operator")
        out = {name: cpu_seconds(pid) for name, pid in pids.items()}
        out["harness"] = own_cpu_seconds()
        return out

    async def run(self) -> Result:
        cfg = Configuration()
        await kube_config.load_kube_config(
            config_file=str(self.testbed.kubeconfig), client_configuration=cfg
        )
        cfg.connection_pool_maxsize = CREATE_CONCURRENCY + 16
        pods = workload(self.args.pods_per_node * self.nodes)
        monitor = Monitor()
        self.monitor, self.leases = monitor, LeaseGaps()
        self.tracker = Tracker(len(pods))
        async with ApiClient(cfg) as api:
            # Any: the generated client types bodies as models and takes `_content_type` and
            # `_preload_content` through **kwargs; the harness passes dicts and reads raw JSON.
            core: Any = CoreV1Api(api)
            coordination: Any = CoordinationV1Api(api)
            res: Any = ResourceV1Api(api)
            custom: Any = CustomObjectsApi(api)
            self.followers = [
                asyncio.create_task(
                    follow(
                        coordination.list_namespaced_lease, self.leases.on_lease, LEASE_NAMESPACE
                    )
                ),
                asyncio.create_task(
                    follow(custom.list_cluster_custom_object, monitor.on_mignode, *MIGNODES)
                ),
                asyncio.create_task(
                    follow(res.list_namespaced_resource_claim, monitor.on_claim, NAMESPACE)
                ),
                asyncio.create_task(
                    follow(
                        core.list_namespaced_pod,
                        lambda kind, obj: self.tracker.on_pod(kind, obj),
                        NAMESPACE,
                    )
                ),
            ]
            try:
                return await self._run(core, res, custom, pods, monitor)
            finally:
                for task in self.followers:
                    task.cancel()
                await asyncio.gather(*self.followers, return_exceptions=True)

    async def _run(
        self,
        core: Any,
        res: Any,
        custom: Any,
        pods: list[PodPlan],
        monitor: Monitor,
    ) -> Result:
        started = time.monotonic()
        names = node_names(self.nodes)
        creates = (create_node(core, name, node_labels(i, name)) for i, name in enumerate(names))
        await bounded(creates, CREATE_CONCURRENCY)
        self.setup_s["nodes"] = time.monotonic() - started

        started = time.monotonic()
        nodes_file = self.work / "nodes.txt"
        nodes_file.write_text("\n".join(names) + "\n")
        agents = self.children.spawn(
            "agents",
            [
                sys.executable,
                str(BENCH / "scale_agents.py"),
                "--kubeconfig",
                str(self.testbed.kubeconfig),
                "--nodes-file",
                str(nodes_file),
                "--state-dir",
                str(self.work / "agents"),
                "--latency-ms",
                str(self.args.latency_ms),
            ],
        )
        # The agents stand for N machines, each with its own CPU: their Lease renewals must
        # not wait behind the control plane and the operator on this one machine.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, agents, AGENTS_NICE)
        await self.wait(
            "every agent to report its GPUs",
            lambda: len(monitor.reported) >= self.nodes,
            120 + 0.5 * self.nodes,
        )
        self.setup_s["agents"] = time.monotonic() - started

        started = time.monotonic()
        for pool in POOLS:
            await raw(
                custom.create_cluster_custom_object(
                    GROUP,
                    VERSION,
                    POLICY_PLURAL,
                    policy_body(pool, self.nodes // 2),
                    _preload_content=False,
                )
            )
        operator = self.children.spawn(
            "operator",
            [
                sys.executable,
                "-m",
                "migpart.cli",
                "operator",
                "--kubeconfig",
                str(self.operator_kubeconfig),
                "--metrics-port",
                "0",
                "--leader-elect" if self.args.leader_elect else "--no-leader-elect",
            ],
        )
        await asyncio.sleep(QUIET_WINDOW_S)  # let it get going before asking if it is quiet
        await self.quiet(operator, 60 + 0.3 * self.nodes)
        self.setup_s["operator"] = time.monotonic() - started
        idle_before = await self.idle_pct(operator)

        # the burst
        burst = await self.burst(core, res, pods, operator)
        peak_mib, now_mib = memory_mib(operator)
        tracker = burst.tracker
        idle_after = await self.idle_pct(operator) if tracker.all_bound.is_set() else math.nan
        missing = await missing_at_end(res, custom)
        self.check_alive()
        requests = audit_requests(
            self.audit_log, OPERATOR_USER, burst.wall_started, burst.wall_ended
        )

        # the baseline: the same pods again, with every instance they need already there
        baseline = None
        if self.args.baseline and tracker.all_bound.is_set():
            await self.clear(core, res)
            await self.quiet(operator, 60.0)
            again = [replace(p, name="b" + p.name[1:]) for p in pods]
            baseline = await self.burst(core, res, again, operator)
            missing += await missing_at_end(res, custom)
        return Result(
            nodes=self.nodes,
            pods=len(pods),
            latency_ms=self.args.latency_ms,
            timeout_s=self.args.timeout_s,
            bound_s=tracker.delays(tracker.bound),
            unschedulable_s=tracker.delays(tracker.unschedulable),
            operator_cpu_s=burst.cpu_s["operator"],
            rss_peak_mib=peak_mib,
            rss_now_mib=now_mib,
            api_requests=sum(requests.values()),
            api_top=requests.most_common(6),
            idle_before_pct=idle_before,
            idle_after_pct=idle_after,
            idle_s=self.args.idle_s,
            burst_wall_s=burst.wall_s,
            cpu_s=burst.cpu_s,
            scheduler_attempts=burst.attempts,
            destroyed_in_use=[str(v) for v in monitor.ledger.violations],
            missing_at_end=missing,
            setup_s=self.setup_s,
            created_s=burst.created_s,
            first=burst,
            baseline=baseline,
        )

    async def burst(self, core: Any, res: Any, pods: list[PodPlan], operator: int) -> Burst:
        """Create `pods` (and their claims) at once and follow them until all are bound (or
        the timeout), then until the operator is quiet."""
        self.tracker = tracker = Tracker(len(pods))
        self.leases.reset()
        self.monitor.stale.clear()
        attempts_before = await scheduler_attempts(self.testbed)
        cpu_before = self.cpu_all()
        wall_started = time.time()
        started = time.monotonic()
        await bounded((create_pod(core, res, p, tracker) for p in pods), CREATE_CONCURRENCY)
        created_s = time.monotonic() - started
        deadline = started + self.args.timeout_s
        while not tracker.all_bound.is_set() and time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracker.all_bound.wait(), timeout=1.0)
        await self.quiet(operator, 60.0)
        cpu_after = self.cpu_all()
        attempts = await scheduler_attempts(self.testbed)
        attempts.subtract(attempts_before)
        return Burst(
            tracker=tracker,
            created_s=created_s,
            wall_s=time.monotonic() - started,
            wall_started=wall_started,
            wall_ended=time.time(),
            cpu_s={k: cpu_after[k] - cpu_before[k] for k in cpu_after},
            attempts=+attempts,
            lease_gap_s=self.leases.worst_s,
            late_leases=len(self.leases.late),
            stale=len(self.monitor.stale),
        )

    async def clear(self, core: Any, res: Any) -> None:
        """Delete every pod (grace 0: no kubelet runs them) and claim of the burst, and wait
        until they are gone (the claims' finalizers wait for kube-controller-manager to
        release them). Their instances stay: nothing is pending, so nothing is destroyed."""
        await raw(
            core.delete_collection_namespaced_pod(
                NAMESPACE, grace_period_seconds=0, _preload_content=False
            )
        )
        await raw(
            res.delete_collection_namespaced_resource_claim(NAMESPACE, _preload_content=False)
        )
        deadline = time.monotonic() + 120 + 0.1 * self.tracker.expected
        while True:
            pods = await raw(core.list_namespaced_pod(NAMESPACE, limit=1, _preload_content=False))
            claims = await raw(
                res.list_namespaced_resource_claim(NAMESPACE, limit=1, _preload_content=False)
            )
            if not pods["items"] and not claims["items"]:
                return
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("timed out deleting the burst's pods and claims")
            await asyncio.sleep(1.0)


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
    await raw(core.create_namespaced_pod(NAMESPACE, pod_body(p), _preload_content=False))


async def missing_at_end(res: Any, custom: Any) -> list[str]:
    """Allocated devices that are not in their node's MigNode status now."""
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


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM while processes are being stopped: a second Ctrl-C must not
    cut the clean-up short (it is bounded: SIGTERM, a grace period, SIGKILL)."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (SIGINT, SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_size(nodes: int, args: argparse.Namespace, binary: Path) -> Result:
    work = Path(tempfile.mkdtemp(prefix=f"migpart-scale-{nodes}-"))
    audit_policy, audit_log = work / "audit-policy.yaml", work / "audit.log"
    audit_policy.write_text(AUDIT_POLICY)
    scheduler_args = []
    if args.scheduler_qps:
        scheduler_args = [
            f"--kube-api-qps={args.scheduler_qps}",
            f"--kube-api-burst={2 * args.scheduler_qps}",
        ]
    testbed = Testbed(
        work / "testbed",
        binary=binary,
        users={OPERATOR_USER: secrets.token_hex(16)},
        apiserver_args=[
            f"--audit-policy-file={audit_policy}",
            f"--audit-log-path={audit_log}",
            "--audit-log-maxsize=0",
        ],
        scheduler_args=scheduler_args,
    )
    children = Children(work / "logs")
    ok = False
    try:
        testbed.start()
        LocalCluster(testbed, work).install()
        testbed.kubectl("create", "namespace", NAMESPACE)
        size = Size(
            nodes,
            args,
            testbed,
            children,
            work,
            testbed.kubeconfig_for(OPERATOR_USER, work / "operator.kubeconfig"),
            audit_log,
        )
        result = asyncio.run(size.run())
        ok = result.all_bound and not result.destroyed_in_use and not result.missing_at_end
        return result
    finally:
        with signals_held():
            children.stop()
            testbed.stop()
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"    (logs and audit log kept in {work})", flush=True)


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
    print(
        "    baseline, the same pods again with every instance they need already there "
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


# ---------------------------------------------------------------- main


def sizes(text: str) -> list[int]:
    values = [int(v) for v in text.replace("_", "").split(",") if v.strip()]
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError("expected node counts >= 2, e.g. 100,300,1000")
    return values


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", type=sizes, default=[100, 300, 1000], help="node counts")
    p.add_argument("--latency-ms", type=float, default=0.0, help="simulated NVML latency")
    p.add_argument("--pods-per-node", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=180.0, help="give up binding after this")
    p.add_argument("--idle-s", type=float, default=30.0, help="idle CPU measuring interval")
    p.add_argument(
        "--scheduler-qps",
        type=int,
        default=SCHEDULER_QPS,
        help="kube-scheduler --kube-api-qps (burst twice that); 0 keeps its default of 50, "
        "under which binding 2,000 pods alone takes over a minute",
    )
    p.add_argument("--keep", action="store_true", help="keep each size's logs and audit log")
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the operator elects itself leader with a Lease, as in a cluster (default: on); "
        "--no-leader-elect measures it without, for the comparison",
    )
    p.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the baseline burst (the same pods again once every instance exists)",
    )
    args = p.parse_args()

    def interrupted(signum: int, _: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGTERM ends a run like Ctrl-C does; SIGINT is set explicitly because a shell starts
    # background jobs with it ignored, and a benchmark must always be stoppable and clean up.
    signal.signal(SIGTERM, interrupted)
    signal.signal(SIGINT, signal.default_int_handler)
    binary = build()
    qps = f"--kube-api-qps {args.scheduler_qps}" if args.scheduler_qps else "default API QPS (50)"
    print(
        f"migpart scale: {GPUS_PER_NODE} x {H100} per node, {args.pods_per_node} pods per node, "
        f"NVML latency {args.latency_ms:.0f} ms, seed {SEED}; kube-scheduler {qps}; "
        f"leader election {'on' if args.leader_elect else 'off'}\n"
        "kubelets: none, pods are bound not run (light stand-in); all agents in one process"
        f" (nice {AGENTS_NICE} where permitted: they stand for machines of their own)",
        flush=True,
    )
    results = []
    for nodes in args.sizes:
        result = run_size(nodes, args, binary)
        report(result)
        results.append(result)
    growth(results)
    targets(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
