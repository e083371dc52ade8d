"""Chaos harness: migpart keeps its promise while its parts crash, restart and race.

Runs the testbed control plane, simulated GPU nodes with real `migpart agent --simulate`
processes (NVML with latency and injected failures, `--sim-faults`), the real `migpart
operator`, and a trace-driven stream of pods (the Alibaba GPU trace, as in `make demo`),
prepared on their nodes by a light stand-in kubelet (bench/stand_in_kubelet.py; no real
kubelets here). On a seeded schedule it injects:

- agent-kill: SIGKILL of a node's agent while the node carries out a spec (a create or a
  destroy under way), then a restart 1-3 s later;
- operator-kill: SIGKILL of the operator inside the destroy protocol's window (a device the
  spec still lists is withdrawn from the slice), then a restart;
- apiserver-restart, etcd-restart: the component SIGKILLed, down 1-3 s, started again with
  its data;
- claim-delete: a pending pod and its claim deleted while the operator plans for them;
- node-delete: a Node deleted while its spec is carried out (the garbage collector takes its
  MigNode and slice; the agent makes the MigNode again), and made again 2-4 s later;
- second-writer: another writer rewrites a MigNode spec's planId (the layout unchanged);
- gpu-lost: a GPU falls off the bus (NVML_ERROR_GPU_IS_LOST from every call on it, through
  the simulator's lost-GPU file), preferably one a node's pending spec names, for 5-30 s, then
  comes back with the instances it had (a loss the driver recovers from without a reset);
- second-operator, operator-freeze, agent-freeze, apiserver-partition: leader election and
  the fence (bench/chaos_faults.py; the operators reach the API server through a proxy there);
- sabotage (only when asked for, a check of the monitor): an instance in use removed from
  its GPU behind the agent's back, as a buggy agent would; the monitor must count it;
- nvml: INSUFFICIENT_RESOURCES on create, IN_USE on destroy and TIMEOUT, injected by the
  simulator at `--nvml-faults` rates (counted from the agents' logs).

An invariant monitor reads the API server, the agents' checkpoints and the simulated GPUs'
state every second and counts:

- destroyed-in-use: an instance gone from its GPU while a claim's allocation or a checkpoint
  held it, and still holds it;
- leaked: an instance on a GPU in neither the spec nor the status for more than 60 s (a lost
  GPU's instances are not counted while it is lost: no agent can see them);
- stuck: a pod pending for more than 120 s (the pod stream keeps the load below capacity, so
  a plan for it exists);
- double-allocated: two claims allocated the same device;
- non-leader-writes: a MigNode or slice write stamped by an operator while it did not hold the
  election Lease (bench/chaos_faults.py).

It ends with one line:

    faults F, pods served S/T, destroyed-in-use 0, leaked 0, stuck 0, double-allocated 0,
    non-leader-writes 0

and exits 0 only when every counter is 0 and every pod was served. Pods whose claim the
harness deleted are not counted in T.

    make chaos ARGS="--duration 300 --seed 7"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from chaos_faults import (
    ELECTION_FAULTS,
    ElectionFaults,
    MainOperator,
    Proxy,
)  # bench/, next to this script
from migpart.agent.simulator import LOST_FILE
from migpart.api.models import GROUP, MIGNODE_PLURAL, VERSION, MigNodeSpec
from migpart.demo.cluster import REPO, LocalCluster
from migpart.demo.replay import NAMESPACE, claim_template, pod_body, template_name
from migpart.demo.run import agents_ready
from migpart.demo.trace import TracePod, accelerate, load_trace
from migpart.dra import DRIVER, DeviceId
from migpart.mig import lookup_table
from migpart.testbed import Testbed
from migpart.testing.invariants import DestroyedWhileAllocated, Device
from stand_in_kubelet import SimKubelet

MODEL = "NVIDIA H100 80GB HBM3"
LABELS = {"migpart.io/chaos": "true"}
POLICY = """apiVersion: migpart.io/v1alpha1
kind: GpuPartitionPolicy
metadata: {name: chaos}
spec:
  nodeSelector: {matchLabels: {migpart.io/chaos: "true"}}
  reconfiguration: {batchWindowSeconds: 1, maxConcurrentNodes: 2}
"""
FAULTS = (
    "agent-kill",
    "operator-kill",
    "apiserver-restart",
    "etcd-restart",
    "claim-delete",
    "second-writer",
    "node-delete",
    "gpu-lost",
    *ELECTION_FAULTS,
)
# Not a fault migpart must survive but a check of the monitor: a buggy agent destroys an
# instance in use (the monitor must count it).
SELF_CHECKS = ("sabotage",)
# The processes a fault acts on: two faults on the same ones wait for each other.
_TARGET = {
    "operator-kill": "operators",
    "second-operator": "operators",
    "operator-freeze": "operators",
    "apiserver-partition": "operators",
    "agent-kill": "agents",
    "agent-freeze": "agents",
    "node-delete": "agents",
}
LEAK_S = 60.0
STUCK_S = 120.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300.0, help="seconds of pod stream")
    p.add_argument("--drain", type=float, default=150.0, help="seconds to let pods finish")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--pods", type=int, default=0, help="trace pods (0: 3 per GPU)")
    p.add_argument("--fault-every", type=float, default=3.0, help="mean seconds between faults")
    p.add_argument("--faults", default=",".join(FAULTS), help="kinds to inject")
    p.add_argument(
        "--nvml-faults",
        default="create_insufficient=0.05,destroy_in_use=0.05,timeout=0.01",
        help="the agents' --sim-faults rates (the seed is added)",
    )
    p.add_argument("--sim-latency-ms", type=float, default=100.0)
    p.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    args = p.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    unknown = sorted(set(kinds) - set(FAULTS) - set(SELF_CHECKS))
    if unknown:
        known = ", ".join(FAULTS + SELF_CHECKS)
        p.error(f"--faults: unknown {', '.join(unknown)} (known: {known})")
    if args.nodes < 1 or args.duration <= 0 or args.fault_every <= 0:
        p.error("--nodes, --duration and --fault-every must be positive")
    args.kinds = kinds
    return args


@dataclass
class Counters:
    faults: Counter[str] = field(default_factory=Counter)
    destroyed_in_use: set[str] = field(default_factory=set)
    leaked: set[str] = field(default_factory=set)
    stuck: set[str] = field(default_factory=set)
    double_allocated: set[str] = field(default_factory=set)
    non_leader_writes: set[str] = field(default_factory=set)
    served: set[str] = field(default_factory=set)
    total: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"faults {sum(self.faults.values())}, pods served {len(self.served)}/"
            f"{len(self.total)}, destroyed-in-use {len(self.destroyed_in_use)}, leaked"
            f" {len(self.leaked)}, stuck {len(self.stuck)}, double-allocated"
            f" {len(self.double_allocated)}, non-leader-writes {len(self.non_leader_writes)}"
        )

    def ok(self) -> bool:
        bad = self.destroyed_in_use or self.leaked or self.stuck or self.double_allocated
        bad = bad or self.non_leader_writes
        return not bad and self.served == self.total


@dataclass
class Pod:
    trace: TracePod
    created: float
    started: float | None = None
    finished: bool = False


def _device(node: str, gpu: int, profile: str, start: int) -> str:
    return DeviceId.of(node, gpu, profile, start).device


def _split(device: str) -> Device:
    """`node/device` -> (node, device)."""
    node, _, name = device.partition("/")
    return node, name


def _read_json(path: Path) -> dict[str, Any]:
    """A state file the agent writes atomically (missing: empty)."""
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return raw


def _spec_devices(name: str, body: dict[str, Any]) -> set[str]:
    """The devices a MigNode's spec wants (`pool/device`)."""
    spec = MigNodeSpec.model_validate(body.get("spec") or {})
    return {
        f"{name}/{_device(name, gpu, i.profile, i.start)}"
        for gpu, instances in spec.desired().items()
        for i in instances
    }


def _status_devices(name: str, body: dict[str, Any]) -> set[str]:
    """The instances a MigNode's status reports (`pool/device`)."""
    return {
        f"{name}/{_device(name, gpu['index'], i['profile'], i['start'])}"
        for gpu in (body.get("status") or {}).get("gpus", [])
        for i in gpu.get("instances", [])
    }


class Chaos:
    def __init__(
        self,
        args: argparse.Namespace,
        cluster: LocalCluster,
        api: Any,
        proxy: Proxy,
        main: MainOperator,
    ) -> None:
        self.args = args
        self.cluster = cluster
        self.rng = random.Random(args.seed)
        self._target_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.election = ElectionFaults(self, proxy, main)
        nodes = cluster.nodes.values()
        self.kubelet = SimKubelet(api, {n.name: n.plugin_socket for n in nodes})
        self.c = Counters()
        self.pods: dict[str, Pod] = {}
        self.deleted: set[str] = set()
        # the monitor's last view: node -> GPU instances (`node/device`); who held which device
        self.on_gpu: dict[str, set[str]] = {}
        self.ledger = DestroyedWhileAllocated(every_change=False)
        self.in_use: set[str] = set()
        self.leaky_since: dict[str, float] = {}
        self.mignodes: dict[str, dict[str, Any]] = {}
        self.slices: dict[str, set[str]] = {}
        # the fault injector watches too: one look at a time, each compared with the last
        self.looking = asyncio.Lock()
        # node -> its GPUs lost now (gpu-lost); their recoveries run in the background
        self.lost: dict[str, set[int]] = {}
        self.recoveries: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ pods

    async def create(self, trace: TracePod) -> None:
        name = trace.name.lower()
        body: Any = pod_body(name, template_name(trace.profile, trace.count))
        try:
            await self.core.create_namespaced_pod(NAMESPACE, body)
        except client.ApiException as err:
            if err.status != 409:  # 409: an earlier try did create it
                raise
        self.pods[name] = Pod(trace, time.monotonic())
        self.c.total.add(name)

    async def drive(self) -> None:
        """The stand-in kubelet's part: prepare bound pods, finish them after their time.
        A failed call (an agent down) is reported and retried on the next pass."""
        listed = await self.core.list_namespaced_pod(NAMESPACE)
        now = time.monotonic()
        for pod in listed.items:
            track = self.pods.get(pod.metadata.name)
            if track is None or track.finished:
                continue
            node = pod.spec.node_name
            try:
                if track.started is None and node:
                    await self.kubelet.start_pod(pod)
                    track.started = now
                    self.c.served.add(pod.metadata.name)
                elif track.started is not None and now - track.started >= track.trace.duration_s:
                    key = f"{NAMESPACE}/{pod.metadata.name}"
                    claims = self.kubelet.prepared.get(key)
                    try:
                        await self.kubelet.finish_pod(NAMESPACE, pod.metadata.name, node)
                    except Exception:
                        if claims is not None:
                            self.kubelet.prepared[key] = claims
                        raise
                    track.finished = True
            except Exception as err:  # noqa: BLE001 - a fault's effect: reported, retried
                self.c.notes.append(f"kubelet retry {pod.metadata.name}: {type(err).__name__}")

    # ------------------------------------------------------------------ monitor

    async def monitor(self) -> None:
        """One look; an API server that does not answer now is looked at next time."""
        async with self.looking:
            try:
                await self._look()
            except (client.ApiException, aiohttp.ClientError, TimeoutError) as err:
                self.c.notes.append(f"monitor retry: {type(err).__name__}")

    async def _look(self) -> None:
        now = time.monotonic()
        listed = await self.custom.list_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL)
        self.mignodes = {n["metadata"]["name"]: n for n in listed["items"]}
        claims = await self.resource.list_namespaced_resource_claim(NAMESPACE)
        # every look stands at its claim list's revision: a device counts as destroyed in use
        # when a claim or a checkpoint held it at the last look and still holds it at this one
        revision = int(claims.metadata.resource_version)
        owners: dict[str, set[str]] = {}
        holders: dict[str, set[Device]] = {}
        for claim in claims.items:
            allocation = claim.status.allocation if claim.status else None
            for r in (allocation.devices.results or []) if allocation else []:
                if r.driver == DRIVER:
                    owners.setdefault(f"{r.pool}/{r.device}", set()).add(claim.metadata.uid)
                    holders.setdefault(f"claim {claim.metadata.uid}", set()).add((r.pool, r.device))
        for device, uids in owners.items():
            if len(uids) > 1:
                self.c.double_allocated.add(device)
        on_gpu: dict[str, set[str]] = {}
        for name, node in self.cluster.nodes.items():
            holders[f"checkpoint {name}"] = {_split(d) for d in self._prepared(name, node.dir)}
            on_gpu[name] = self._gpu_instances(name, node.dir)
        self.ledger.held(holders, revision)
        for name, now_there in on_gpu.items():
            self.ledger.present(name, {_split(d)[1] for d in now_there}, revision)
            self._leaks(name, now_there, now)
        self.c.destroyed_in_use |= {f"{v.node}/{v.device}" for v in self.ledger.violations}
        self.on_gpu = on_gpu
        self.in_use = {f"{node}/{d}" for devices in holders.values() for node, d in devices}
        for name, pod in self.pods.items():
            if pod.started is None and name not in self.deleted and now - pod.created > STUCK_S:
                self.c.stuck.add(name)
        await self.election.look(self.coordination, self.resource)
        self.c.non_leader_writes |= self.election.monitor.violations
        slices = await self.resource.list_resource_slice()
        self.slices = {}
        for s in slices.items:
            if s.spec.driver == DRIVER:
                self.slices.setdefault(s.spec.pool.name, set()).update(
                    f"{s.spec.pool.name}/{d.name}" for d in s.spec.devices or []
                )

    @staticmethod
    def _prepared(name: str, node_dir: Path) -> set[str]:
        raw = _read_json(node_dir / "state" / "checkpoint.json")
        return {
            f"{name}/{_device(name, d['gpu'], d['profile'], d['start'])}"
            for c in raw.get("claims", {}).values()
            for d in c["devices"]
        }

    @staticmethod
    def _gpu_instances(name: str, node_dir: Path) -> set[str]:
        """What the node's (simulated) GPUs hold, whatever the agent says."""
        raw = _read_json(node_dir / "state" / "simulated-nvml.json")
        return {
            f"{name}/{_device(name, int(gpu), i['profile'], i['start'])}"
            for gpu, instances in raw.items()
            for i in instances
        }

    def _leaks(self, name: str, on_gpu: set[str], now: float) -> None:
        body = self.mignodes.get(name) or {}
        known = _spec_devices(name, body) | _status_devices(name, body)
        lost = {f"{name}/gpu-{i}-" for i in self.lost.get(name, ())}
        known |= {d for d in on_gpu if any(d.startswith(prefix) for prefix in lost)}
        for device in on_gpu - known:
            since = self.leaky_since.setdefault(device, now)
            if now - since > LEAK_S:
                self.c.leaked.add(device)
        for device in [d for d in self.leaky_since if d.startswith(f"{name}/")]:
            if device not in on_gpu - known:
                del self.leaky_since[device]

    # ------------------------------------------------------------------ faults

    def _reconfiguring(self) -> list[str]:
        out = []
        for name, body in self.mignodes.items():
            plan = (body.get("spec") or {}).get("planId")
            if plan and plan != (body.get("status") or {}).get("observedPlanId"):
                out.append(name)
        return sorted(n for n in out if n in self.cluster.nodes)

    def _in_destroy_window(self) -> bool:
        """A device the spec still lists and the GPU holds is missing from the slice."""
        for name, body in self.mignodes.items():
            wanted, ready = _spec_devices(name, body), _status_devices(name, body)
            if (wanted & ready) - self.slices.get(name, set()):
                return True
        return False

    async def _wait_for(self, condition: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.monitor()
            if condition():
                return True
            await asyncio.sleep(0.2)
        return False

    async def inject(self, kind: str) -> None:
        if kind == "agent-kill":
            busy = await self._wait_for(self._reconfiguring, 15.0)
            choices = self._reconfiguring() if busy else sorted(self.cluster.nodes)
            node = self.rng.choice(choices)
            self.cluster.kill_agent(node)
            self.c.notes.append(f"agent-kill {node} ({'mid-spec' if busy else 'idle'})")
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            self.cluster.restart_agent(node)
        elif kind == "operator-kill":
            inside = await self._wait_for(self._in_destroy_window, 20.0)
            self.cluster.kill_operator()
            self.c.notes.append(f"operator-kill ({'in window' if inside else 'outside'})")
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            self.election.main.start(self.cluster)
        elif kind in ("apiserver-restart", "etcd-restart"):
            name = "kube-apiserver" if kind == "apiserver-restart" else "etcd"
            down_s = self.rng.uniform(1.0, 3.0)
            await asyncio.to_thread(self.cluster.testbed.restart, name, down_s)
            self.c.notes.append(f"{kind} (down {down_s:.1f} s)")
        elif kind == "node-delete":
            busy = await self._wait_for(self._reconfiguring, 15.0)
            node = self.rng.choice(self._reconfiguring() if busy else sorted(self.cluster.nodes))
            testbed = self.cluster.testbed
            await asyncio.to_thread(testbed.kubectl, "delete", "node", node, "--wait=false")
            self.c.notes.append(f"node-delete {node} ({'mid-spec' if busy else 'idle'})")
            await asyncio.sleep(self.rng.uniform(2.0, 4.0))
            labels = {"nvidia.com/mig.capable": "true", **LABELS}
            await asyncio.to_thread(testbed.add_node, node, labels)
        elif kind == "gpu-lost":
            await self._lose_gpu()
        elif kind in ELECTION_FAULTS:
            await self.election.inject(kind)
        elif kind == "sabotage":
            if not await self._wait_for(lambda: bool(self._held()), 60.0):
                return
            await self._sabotage(self.rng.choice(sorted(self._held())))
        elif kind == "claim-delete":
            pending = sorted(
                n for n, p in self.pods.items() if p.started is None and n not in self.deleted
            )
            if not pending:
                return
            name = self.rng.choice(pending)
            self.deleted.add(name)
            self.c.total.discard(name)
            await self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            self.c.notes.append(f"claim-delete {name}")
        elif kind == "second-writer":
            nodes = sorted(
                n for n, b in self.mignodes.items() if (b.get("spec") or {}).get("planId")
            )
            if not nodes:
                return
            node = self.rng.choice(nodes)
            patch = json.dumps({"spec": {"planId": f"second-writer-{self.rng.getrandbits(32):x}"}})
            await asyncio.to_thread(
                self.cluster.testbed.kubectl, "patch", "mignode", node, "--type=merge", "-p", patch
            )
            self.c.notes.append(f"second-writer {node}")
        self.c.faults[kind] += 1

    def _write_lost(self, node: str) -> None:
        path = self.cluster.nodes[node].dir / "state" / LOST_FILE
        lost = sorted(self.lost.get(node, ()))
        if lost:
            path.write_text(json.dumps(lost))
        else:
            path.unlink(missing_ok=True)

    async def _lose_gpu(self) -> None:
        """A GPU falls off the bus, preferably one that a pending spec names (the case that
        once held the node's `maxConcurrentNodes` slot for as long as the GPU was lost), and
        comes back 5-30 s later, in the background."""
        busy = await self._wait_for(self._reconfiguring, 15.0)
        node = self.rng.choice(self._reconfiguring() if busy else sorted(self.cluster.nodes))
        spec = (self.mignodes.get(node) or {}).get("spec") or {}
        named = sorted(g["index"] for g in spec.get("gpus") or [] if busy)
        gpu = self.rng.choice(named or list(range(self.args.gpus_per_node)))
        down_s = self.rng.uniform(5.0, 30.0)
        self.lost.setdefault(node, set()).add(gpu)
        self._write_lost(node)
        where = "mid-spec" if busy and named else "idle"
        self.c.notes.append(f"gpu-lost {node} GPU {gpu} for {down_s:.0f} s ({where})")

        async def recover() -> None:
            await asyncio.sleep(down_s)
            self.lost[node].discard(gpu)
            self._write_lost(node)

        task = asyncio.create_task(recover())
        self.recoveries.add(task)
        task.add_done_callback(self.recoveries.discard)

    def _held(self) -> set[str]:
        """Instances on a GPU that a claim or a checkpoint holds."""
        return {d for devices in self.on_gpu.values() for d in devices if d in self.in_use}

    async def _sabotage(self, device: str) -> None:
        """What a buggy agent would do: the instance goes from its GPU while in use."""
        node = device.split("/", 1)[0]
        self.cluster.kill_agent(node)
        path = self.cluster.nodes[node].dir / "state" / "simulated-nvml.json"
        saved = json.loads(path.read_text())
        kept = {
            gpu: [
                i
                for i in held
                if f"{node}/{_device(node, int(gpu), i['profile'], i['start'])}" != device
            ]
            for gpu, held in saved.items()
        }
        path.write_text(json.dumps(kept))
        self.cluster.restart_agent(node)
        self.c.notes.append(f"sabotage {device}")

    async def faults(self, until: float) -> None:
        """Two lanes at once: the short faults, and the long election faults (10-60 s each)
        beside them, so that a soak injects both at the short faults' pace. Two faults that
        act on the same processes (the operators, the agents) never overlap."""
        long = [k for k in self.args.kinds if k in ELECTION_FAULTS]
        short = [k for k in self.args.kinds if k not in ELECTION_FAULTS]
        lanes = [self._lane(kinds, until) for kinds in (short, long) if kinds]
        await asyncio.gather(*lanes)

    async def _lane(self, kinds: list[str], until: float) -> None:
        while time.monotonic() < until:
            await asyncio.sleep(self.rng.expovariate(1.0 / self.args.fault_every))
            if time.monotonic() >= until:
                return
            kind = self.rng.choice(kinds)
            async with self._target_locks[_TARGET.get(kind, kind)]:
                try:
                    await self.inject(kind)
                except (client.ApiException, aiohttp.ClientError, TimeoutError) as err:
                    # the API server is down (another fault): this one is not injected
                    self.c.notes.append(f"{kind} not injected: {type(err).__name__}")

    # ------------------------------------------------------------------ run

    async def run(self, pods: list[TracePod]) -> None:
        start = time.monotonic()
        stream_end = start + self.args.duration
        faults = asyncio.create_task(self.faults(stream_end))
        queue = sorted(pods, key=lambda p: p.created_s)
        last_report = 0.0
        while True:
            now = time.monotonic()
            while queue and start + queue[0].created_s <= now:
                try:
                    await self.create(queue[0])
                except (client.ApiException, aiohttp.ClientError, TimeoutError):
                    break  # the API server is restarting: create it on the next pass
                queue.pop(0)
            with contextlib.suppress(client.ApiException, aiohttp.ClientError, TimeoutError):
                await self.drive()
            await self.monitor()
            waiting = self.c.total - self.c.served
            if now - last_report > 10:
                last_report = now
                print(f"t={now - start:5.0f}s {self.c.line()}", flush=True)
            done = not waiting or now > stream_end + self.args.drain
            if now > stream_end and done and not self.recoveries:  # every lost GPU is back
                break
            await asyncio.sleep(0.5)
        faults.cancel()
        await asyncio.gather(faults, return_exceptions=True)
        await self.kubelet.close()


def nvml_faults(cluster: LocalCluster) -> Counter[str]:
    """The failures the simulated NVML injected, from the agents' (JSON) logs."""
    out: Counter[str] = Counter()
    for log in (cluster.dir / "logs").glob("agent-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "nvml_fault_injected" not in line:
                continue
            with contextlib.suppress(json.JSONDecodeError):
                entry = json.loads(line)
                error = str(entry.get("error", "")).removeprefix("NVML_ERROR_")
                out[f"nvml-{entry.get('op')}-{error}"] += 1
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="migpart-chaos-"))
    table = lookup_table(MODEL, None, "--model")
    count = args.pods or 3 * args.nodes * args.gpus_per_node
    trace = REPO / "tests" / "fixtures" / "traces" / "openb_pod_list_default.csv"
    # A pod needing more GPUs than a node has could never be served (not a fault's doing).
    rows = load_trace(trace, table, offset=args.seed * 7, limit=count)
    pods = accelerate(
        [p for p in rows if p.count <= args.gpus_per_node],
        span_s=args.duration * 0.8,
        min_life_s=5.0,
        max_life_s=max(10.0, args.duration / 6),
    )
    print(
        f"chaos: seed {args.seed}, work dir {work}, {len(pods)} pods, faults {args.kinds}; "
        "kubelets: a light stand-in (bench/stand_in_kubelet.py), no real kubelets"
    )
    testbed = Testbed(work / "testbed")
    cluster = LocalCluster(testbed, work)
    chaos: Chaos | None = None
    proxy: Proxy | None = None
    try:
        testbed.start()
        server = yaml.safe_load(testbed.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        host, port = server.split("://", 1)[1].rsplit(":", 1)
        proxy = Proxy(host, int(port))
        cluster.operator_kubeconfig = proxy.kubeconfig(
            testbed.kubeconfig, work / "operator.kubeconfig"
        )
        cluster.install()
        for i in range(args.nodes):
            sim_faults = f"{args.nvml_faults},seed={args.seed * 1000 + i}".lstrip(",")
            cluster.add_gpu_node(
                f"chaos-node-{i + 1}",
                f"{MODEL}:{args.gpus_per_node}",
                LABELS,
                args.sim_latency_ms,
                ("--sim-faults", sim_faults, "--resync-seconds", "5"),
                kubelet=False,
            )
        cluster.wait_for("every agent to report its GPUs", lambda: agents_ready(cluster))
        testbed.kubectl("apply", "-f", "-", input=POLICY)
        main_operator = MainOperator()
        main_operator.start(cluster)
        chaos = asyncio.run(_run(args, cluster, pods, table, proxy, main_operator))
    finally:
        cluster.stop()
        testbed.stop()
    chaos.c.faults.update(nvml_faults(cluster))
    print("faults by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(chaos.c.faults.items())))
    # where the timed faults landed: "agent-kill (mid-spec)", "operator-kill (in window)", ...
    timed = (
        "agent-kill",
        "operator-kill",
        "node-delete",
        "gpu-lost",
        "operator-freeze",
        "agent-freeze",
    )
    where = Counter(
        f"{n.split()[0]} ({n.rsplit(' (', 1)[-1]}" for n in chaos.c.notes if n.startswith(timed)
    )
    print("timing: " + (", ".join(f"{k} {n}" for k, n in sorted(where.items())) or "none"))
    for kind in ("destroyed_in_use", "leaked", "stuck", "double_allocated", "non_leader_writes"):
        if getattr(chaos.c, kind):
            print(f"{kind}: {sorted(getattr(chaos.c, kind))}")
    if chaos.c.total - chaos.c.served:
        print(f"not served: {sorted(chaos.c.total - chaos.c.served)}")
    print(chaos.c.line(), flush=True)
    return 0 if chaos.c.ok() else 1


async def _run(
    args: argparse.Namespace,
    cluster: LocalCluster,
    pods: list[TracePod],
    table: Any,
    proxy: Proxy,
    main: MainOperator,
) -> Chaos:
    api = await config.new_client_from_config(config_file=str(cluster.testbed.kubeconfig))
    try:
        namespace: Any = {"metadata": {"name": NAMESPACE}}
        await client.CoreV1Api(api).create_namespace(namespace)
        resource = client.ResourceV1Api(api)
        for profile, n in sorted({(p.profile, p.count) for p in pods}):
            body: Any = claim_template(profile, n)
            await resource.create_namespaced_resource_claim_template(NAMESPACE, body)
        chaos = Chaos(args, cluster, api, proxy, main)
        await chaos.run(pods)
        return chaos
    finally:
        await api.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
