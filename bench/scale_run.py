"""bench/scale.py's harness: one size from a fresh testbed to its Result (the agents, the
operator, the burst, the baseline burst), in reactive or offer mode (bench/scale_offer.py,
which says why offer mode's baseline runs without the operator)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from signal import SIGINT, SIGTERM
from typing import Any

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

from bench import scale_offer
from bench.scale_api import ApiError, follow, raw
from bench.scale_cluster import (
    AGENTS_NICE,
    AUDIT_POLICY,
    BENCH,
    CREATE_CONCURRENCY,
    MIGNODES,
    NAMESPACE,
    OPERATOR_USER,
    POOLS,
    QUIET_CORES,
    QUIET_WINDOW_S,
    LeaseGaps,
    Monitor,
    PodPlan,
    Tracker,
    audit_requests,
    bounded,
    create_node,
    create_pod,
    missing_at_end,
    node_labels,
    node_names,
    policy_body,
    scheduler_attempts,
    slice_writes,
    workload,
)
from bench.scale_processes import Children, cpu_seconds, memory_mib, own_cpu_seconds
from bench.scale_report import Burst, Result
from migpart.api.leases import LEASE_NAMESPACE
from migpart.api.models import GROUP, POLICY_PLURAL, VERSION
from migpart.demo.cluster import LocalCluster
from migpart.testbed import Testbed

# ---------------------------------------------------------------- one size


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
    agent_runs: int = 0  # each start of the agents gets GPUs of its own (a fresh state dir)

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

    @property
    def offering(self) -> bool:
        """Offer mode (`--allocation offer`): the operator publishes stable pools, the policies
        ask for Offer."""
        return bool(self.args.allocation == "offer")

    def cpu_all(self) -> dict[str, float]:
        """CPU seconds so far of every component (the operator while it runs)."""
        pids = {**self.testbed.pids(), "agents": self.children.pid("agents")}
        if "operator" in self.children.procs:
            pids["operator"] = self.children.pid("operator")
        out = {name: cpu_seconds(pid) for name, pid in pids.items()}
        out["harness"] = own_cpu_seconds()
        return out

    async def run(self, body: Callable[..., Awaitable[Any]] | None = None) -> Any:
        """Follow the cluster and run `body(core, res, custom, pods)` (default: one size's
        burst and baseline, `_run`, returning its Result)."""
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
                if body is not None:
                    return await body(core, res, custom, pods)
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
        await self.start_agents()
        self.setup_s["agents"] = time.monotonic() - started

        started = time.monotonic()
        await self.create_policies(custom)
        operator = await self.start_operator(self.args.leader_elect)
        if self.offering:
            await scale_offer.offer(self, custom, res)
            await self.quiet(operator, 60 + 0.3 * self.nodes)
        self.setup_s["operator"] = time.monotonic() - started
        idle_before = await self.idle_pct(operator)

        # the burst
        burst = await self.burst(core, res, pods, operator)
        peak_mib, now_mib = memory_mib(operator)
        tracker = burst.tracker
        idle_after = await self.idle_pct(operator) if tracker.all_bound.is_set() else math.nan
        # an offering node makes a placement's instance at prepare: none here (no kubelet)
        missing = [] if self.offering else await missing_at_end(res, custom)
        self.check_alive()
        requests = audit_requests(
            self.audit_log, OPERATOR_USER, burst.wall_started, burst.wall_ended
        )

        # the baseline: the same pods again, with what they need already published: in
        # reactive mode every instance, in offer mode the same pools without the operator
        baseline = None
        if self.args.baseline and tracker.all_bound.is_set():
            await self.clear(core, res)
            running: int | None = operator
            if self.offering:
                self.children.stop_one("operator")
                running = None
            else:
                await self.quiet(operator, 60.0)
            again = [replace(p, name="b" + p.name[1:]) for p in pods]
            baseline = await self.burst(core, res, again, running)
            if not self.offering:
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
            allocation=self.args.allocation,
            slice_writes=slice_writes(requests),
        )

    async def start_agents(self) -> int:
        """Start the agents of every node (the fleet, bench/scale_fleet.py) on GPUs without
        MIG instances (a
        state directory of their own each time), and wait until every MigNode reports its GPUs,
        so that agent start-up is not part of a burst."""
        self.agent_runs += 1
        nodes_file = self.work / "nodes.txt"
        nodes_file.write_text("\n".join(node_names(self.nodes)) + "\n")
        agents = self.children.spawn(
            "agents",
            [
                sys.executable,
                "-m",
                "bench.scale_fleet",
                "--kubeconfig",
                str(self.testbed.kubeconfig),
                "--nodes-file",
                str(nodes_file),
                "--state-dir",
                str(self.work / f"agents-{self.agent_runs}"),
                "--latency-ms",
                str(self.args.latency_ms),
            ],
            cwd=BENCH.parent,  # where `bench` is a package
        )
        # The agents stand for N machines, each with its own CPU: their Lease renewals must
        # not wait behind the control plane and the operator on this one machine.
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, agents, AGENTS_NICE)
        await self.wait(
            "every agent to report its GPUs",
            lambda: len(self.monitor.reported) >= self.nodes,
            120 + 0.5 * self.nodes,
        )
        return agents

    async def create_policies(self, custom: Any) -> None:
        for pool in POOLS:
            await raw(
                custom.create_cluster_custom_object(
                    GROUP,
                    VERSION,
                    POLICY_PLURAL,
                    policy_body(pool, self.nodes // 2, "Offer" if self.offering else None),
                    _preload_content=False,
                )
            )

    async def start_operator(self, leader_elect: bool) -> int:
        """Start the real operator (as the audited user of its own) and wait until it is
        quiet; return its pid."""
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
                "--leader-elect" if leader_elect else "--no-leader-elect",
                *(["--offer-publishing"] if self.offering else []),
            ],
        )
        await asyncio.sleep(QUIET_WINDOW_S)  # let it get going before asking if it is quiet
        await self.quiet(operator, 60 + 0.3 * self.nodes)
        return operator

    async def burst(self, core: Any, res: Any, pods: list[PodPlan], operator: int | None) -> Burst:
        """Create `pods` (and their claims) at once and follow them until all are bound (or
        the timeout), then until the operator (None: not running) is quiet."""
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
        if operator is not None:
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
        release them). Their instances stay: nothing is pending, so nothing is destroyed.
        A deletion the API server did not finish in time (504 on a loaded machine) is asked
        for again every 10 s while anything is left. The bound is generous: at 2,000 pods on
        a loaded machine the API server cut each deletecollection short after its 60 s and
        320 s were not enough."""
        deadline = time.monotonic() + 120 + 0.3 * self.tracker.expected
        for turn in itertools.count():
            if turn % 10 == 0:
                await _delete_all(core, res)
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


async def _delete_all(core: Any, res: Any) -> None:
    """Delete every pod (grace 0) and claim of the namespace; a transient error (the API
    server timed out, or a loaded one cut the response short; the deletion goes on) is left to
    the caller's next try."""
    for call in (
        lambda: core.delete_collection_namespaced_pod(
            NAMESPACE, grace_period_seconds=0, _preload_content=False
        ),
        lambda: res.delete_collection_namespaced_resource_claim(NAMESPACE, _preload_content=False),
    ):
        try:
            await raw(call())
        except ApiError as err:
            if not err.transient:
                raise
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as err:
            print(f"    (deleting the burst: {type(err).__name__}; asked again)", flush=True)


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


def run_size(
    nodes: int,
    args: argparse.Namespace,
    binary: Path,
    body: Callable[[Size], Callable[..., Awaitable[Any]]] | None = None,
) -> Any:
    """One size on a fresh testbed: its Result, or what `body(size)` returns
    (bench/scale_pairs.py)."""
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
        if body is not None:
            outcome = asyncio.run(size.run(body(size)))
            ok = bool(getattr(outcome, "ok", False))
            return outcome
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
