"""bench/chaos.py's harness: the pod stream, the invariant monitor and the fault injector on
one local cluster (the leader-election faults are bench/chaos_faults.py's)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from bench.chaos_counters import (
    FAULT_TARGETS,
    LABELS,
    LEAK_S,
    MODEL,
    STUCK_S,
    Counters,
    Pod,
    device_of,
    read_json,
    spec_devices,
    split_device,
    status_devices,
)
from bench.chaos_faults import (
    ELECTION_FAULTS,
    ElectionFaults,
    MainOperator,
    Proxy,
)
from bench.stand_in_kubelet import SimKubelet
from migpart.agent.simulator import CRASHED_FILE, LOST_FILE
from migpart.api.models import GROUP, MIGNODE_PLURAL, VERSION
from migpart.demo.cluster import LocalCluster
from migpart.demo.replay import NAMESPACE, pod_body, template_name
from migpart.demo.trace import TracePod
from migpart.mig import lookup_table
from migpart.slices.dra import DRIVER
from migpart.testing.invariants import DestroyedWhileAllocated, Device, overlapping_allocations

# how long prepare-crash waits for an armed agent to reach a create or destroy in a prepare
PREPARE_CRASH_WAIT_S = 30.0


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
        self.table = lookup_table(MODEL)

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
                    # a pod the claim-delete fault chose while this start was under way counts
                    # in neither the served nor the total
                    if pod.metadata.name not in self.deleted:
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
        for name in sorted(self.deleted):  # deleted before they ran: unprepare what was tried
            try:
                await self.kubelet.forget_pod(NAMESPACE, name)
            except Exception as err:  # noqa: BLE001 - an agent down: retried on the next pass
                self.c.notes.append(f"kubelet unprepare retry {name}: {type(err).__name__}")

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
        holders: dict[str, set[Device]] = {}
        for claim in claims.items:
            allocation = claim.status.allocation if claim.status else None
            for r in (allocation.devices.results or []) if allocation else []:
                if r.driver == DRIVER:
                    holders.setdefault(f"claim {claim.metadata.uid}", set()).add((r.pool, r.device))
        # one device allocated to two claims, or (offer mode: every placement is listed) two
        # overlapping placements of one GPU
        self.c.double_allocated |= overlapping_allocations(holders, lambda node: self.table)
        on_gpu: dict[str, set[str]] = {}
        for name, node in self.cluster.nodes.items():
            holders[f"checkpoint {name}"] = {
                split_device(d) for d in self._prepared(name, node.dir)
            }
            on_gpu[name] = self._gpu_instances(name, node.dir)
        self.ledger.held(holders, revision)
        for name, now_there in on_gpu.items():
            self.ledger.present(name, {split_device(d)[1] for d in now_there}, revision)
            self._leaks(name, now_there, now)
        self.c.destroyed_in_use |= {f"{v.node}/{v.device}" for v in self.ledger.violations}
        self.on_gpu = on_gpu
        self.in_use = {f"{node}/{d}" for devices in holders.values() for node, d in devices}
        for name, pod in self.pods.items():
            if pod.started is None and name not in self.deleted and now - pod.created > STUCK_S:
                self.c.stuck.add(name)
        await self.election.look(self.resource)
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
        raw = read_json(node_dir / "state" / "checkpoint.json")
        return {
            f"{name}/{device_of(name, d['gpu'], d['profile'], d['start'])}"
            for c in raw.get("claims", {}).values()
            for d in c["devices"]
        }

    @staticmethod
    def _gpu_instances(name: str, node_dir: Path) -> set[str]:
        """What the node's (simulated) GPUs hold, whatever the agent says."""
        raw = read_json(node_dir / "state" / "simulated-nvml.json")
        return {
            f"{name}/{device_of(name, int(gpu), i['profile'], i['start'])}"
            for gpu, instances in raw.items()
            for i in instances
        }

    def _leaks(self, name: str, on_gpu: set[str], now: float) -> None:
        body = self.mignodes.get(name) or {}
        known = spec_devices(name, body) | status_devices(name, body)
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
            wanted, ready = spec_devices(name, body), status_devices(name, body)
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
            # preferably while a node carries out a spec (its status write must survive it)
            busy = await self._wait_for(self._reconfiguring, 15.0)
            name = "kube-apiserver" if kind == "apiserver-restart" else "etcd"
            down_s = self.rng.uniform(1.0, 3.0)
            await asyncio.to_thread(self.cluster.testbed.restart, name, down_s)
            where = "mid-spec" if busy else "idle"
            self.c.notes.append(f"{kind} down {down_s:.1f} s ({where})")
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
        elif kind == "prepare-crash":
            if not await self._crash_in_prepare():
                return
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

    def _exited(self, node: str) -> bool:
        proc = self.cluster.nodes[node].proc
        return proc is not None and proc.poll() is not None

    async def _crash_in_prepare(self) -> bool:
        """Every agent armed (its crash marker deleted: the simulator then ends the process
        right after the next destroy or create made inside a prepare, `--sim-faults
        crash_after`); the first to end is started again 1-3 s later, the others disarmed
        (the marker written again). False when none ended within `PREPARE_CRASH_WAIT_S`: no
        prepare made or destroyed an instance meanwhile (not counted)."""
        nodes = sorted(self.cluster.nodes)
        markers = {n: self.cluster.nodes[n].dir / "state" / CRASHED_FILE for n in nodes}
        for marker in markers.values():
            marker.unlink(missing_ok=True)
        await self._wait_for(lambda: any(self._exited(n) for n in nodes), PREPARE_CRASH_WAIT_S)
        for marker in markers.values():
            if not marker.exists():
                marker.write_text('{"point": "disarmed by the harness"}\n')
        await asyncio.sleep(2.0)  # an agent past its look at the marker ends now
        crashed = [n for n in nodes if self._exited(n)]
        if not crashed:
            self.c.notes.append("no prepare-crash: no prepare made or destroyed an instance")
            return False
        await asyncio.sleep(self.rng.uniform(1.0, 3.0))
        for node in crashed:
            point = read_json(markers[node]).get("point", "")
            where = {"prepare_destroy": "after destroy", "prepare_create": "after create"}
            self.c.notes.append(f"prepare-crash {node} ({where.get(point, point)})")
            self.cluster.kill_agent(node)  # reaped, its log closed
            self.cluster.restart_agent(node)
        self.c.faults["prepare-crash"] += len(crashed) - 1  # one is counted by `inject`
        return True

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
                if f"{node}/{device_of(node, int(gpu), i['profile'], i['start'])}" != device
            ]
            for gpu, held in saved.items()
        }
        path.write_text(json.dumps(kept))
        self.cluster.restart_agent(node)
        self.c.notes.append(f"sabotage {device}")

    async def faults(self, until: float) -> None:
        """One lane for each set of processes a fault acts on (the operators, the agents, the
        control plane and the objects), all three at once: faults on the same processes come
        one after the other, the others overlap. Most faults wait up to 20 s for their moment
        and the election faults last 10-60 s, so one lane alone would inject a fault every
        15-20 s."""
        lanes: dict[str, list[str]] = {}
        for kind in self.args.kinds:
            lanes.setdefault(FAULT_TARGETS.get(kind, "cluster"), []).append(kind)
        await asyncio.gather(*(self._lane(kinds, until) for kinds in lanes.values()))

    async def _lane(self, kinds: list[str], until: float) -> None:
        while time.monotonic() < until:
            await asyncio.sleep(self.rng.expovariate(1.0 / self.args.fault_every))
            if time.monotonic() >= until:
                return
            kind = self.rng.choice(kinds)
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
        lease = asyncio.create_task(self.election.follow(self.coordination))
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
        with contextlib.suppress(client.ApiException, aiohttp.ClientError, TimeoutError):
            await self.election.look(self.resource)
        lease.cancel()
        await asyncio.gather(lease, return_exceptions=True)
        self.c.non_leader_writes |= self.election.monitor.judge()
        await self.kubelet.close()
