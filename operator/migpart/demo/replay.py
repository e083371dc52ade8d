"""Replay trace pods against a local cluster, show what happens live, and summarise.

Pods run on the nodes' real kubelets; each container ends (the fake runtime's
`MIGPART_FAKE_RUN_SECONDS`) after the trace's run time, the pod Succeeds, its kubelet
unprepares the claim, and the replay deletes the pod.

Claims are DRA ResourceClaimTemplates selecting MIG devices by profile (or, for variety, by
memory capacity through `quantity()`), so the operator's real CEL evaluation decides which
profiles serve them.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kubernetes_asyncio import client

from migpart.api.models import GROUP, MIGNODE_PLURAL, VERSION
from migpart.demo.trace import TracePod
from migpart.mig import ModelTable
from migpart.slices.dra import DeviceId
from migpart.testbed.kubelet import RUN_SECONDS_ENV
from migpart.testing.builders import ClaimBuilder, PodBuilder, memory_at_least, profile_is
from migpart.testing.invariants import DestroyedWhileAllocated, Violation

NAMESPACE = "migpart-demo"


def template_name(profile: str, count: int) -> str:
    return f"mig-{profile.replace('.', '').replace('+', '')}-x{count}"


def claim_template(
    profile: str, count: int, by_memory_mib: int | None = None, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """A ResourceClaimTemplate for `count` devices of `profile` (or of at least that memory)."""
    selector = profile_is(profile) if by_memory_mib is None else memory_at_least(by_memory_mib)
    claim = ClaimBuilder(template_name(profile, count), namespace)
    return claim.request(selector, count=count).template()


def pod_body(
    name: str,
    template: str,
    run_s: float | None = None,
    namespace: str = NAMESPACE,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod of the claim template; on a real kubelet its container exits after `run_s`.
    `node_selector` keeps it on the replay's own nodes (the e2e suite shares its cluster)."""
    pod = PodBuilder(name, namespace).labels({"app": "migpart-demo"}).container("work")
    pod.claim_template(template).ends()
    if run_s is not None:
        pod.env(RUN_SECONDS_ENV, f"{run_s:.1f}")
    if node_selector:
        pod.node_selector(node_selector)
    return pod.obj()


def claim_templates(
    pods: Sequence[TracePod],
    table: ModelTable,
    by_memory: bool = True,
    namespace: str = NAMESPACE,
) -> dict[str, dict[str, Any]]:
    """Template name -> ResourceClaimTemplate, one per (profile, count) the pods use. Every
    other single-device template asks by memory (at least the profile's), not by name."""
    out: dict[str, dict[str, Any]] = {}
    for i, (profile, count) in enumerate(sorted({(p.profile, p.count) for p in pods})):
        memory_mib = table.profile(profile).memory_mib
        by = memory_mib if by_memory and count == 1 and i % 2 else None
        out[template_name(profile, count)] = claim_template(profile, count, by, namespace)
    return out


@dataclass
class PodTrack:
    pod: TracePod
    created_at: float
    bound_at: float | None = None
    node: str | None = None
    finished: bool = False


@dataclass
class Stats:
    """What a replay saw, counted from its own looks at the API server (every ~0.25 s).

    `served`: pods given a node (`spec.nodeName`) before the replay ended; `waits_s` their
    waits from creation to that look. `repartitions`: plans written to a node (each new
    `MigNode.spec.planId`). `creates`, `destroys`: MIG instances that appeared in, or left, a
    MigNode's status between two looks (what the simulator's `Outcome` counts too).
    """

    created: int = 0
    served: int = 0
    finished: int = 0
    waits_s: list[float] = field(default_factory=list)
    repartitions: int = 0
    creates: int = 0
    destroys: int = 0
    destroyed_in_use: int = 0
    plan_ids: dict[str, str] = field(default_factory=dict)

    @property
    def mean_wait_s(self) -> float:
        return sum(self.waits_s) / len(self.waits_s) if self.waits_s else 0.0

    def summary(self) -> str:
        return (
            f"served {self.served}/{self.created} pods, mean wait {self.mean_wait_s:.1f} s, "
            f"repartitions {self.repartitions} ({self.creates + self.destroys} MIG creates"
            f"+destroys), destroyed-in-use {self.destroyed_in_use}"
        )


class Replay:
    def __init__(
        self,
        api: client.ApiClient,
        pods: list[TracePod],
        duration_s: float,
        out: TextIO = sys.stdout,
        by_memory: bool = True,
        namespace: str = NAMESPACE,
        node_selector: Mapping[str, str] | None = None,
        nodes: Collection[str] | None = None,
    ) -> None:
        """`nodes`: the MigNodes to watch and count (None: all of them)."""
        self.api = api
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.pods = pods
        self.duration_s = duration_s
        self.out = out
        self.by_memory = by_memory
        self.namespace = namespace
        self.node_selector = node_selector
        self.nodes = None if nodes is None else frozenset(nodes)
        self.stats = Stats()
        self.tracks: dict[str, PodTrack] = {}
        self.mignodes: list[dict[str, Any]] = []
        self.seen_devices: dict[str, set[DeviceId]] = {}
        self.events: list[str] = []
        # destroyed while allocated, by etcd revisions (polled: only what certainly happened)
        self.ledger = DestroyedWhileAllocated(every_change=False)
        self.violations: set[Violation] = set()

    async def setup(self, table: ModelTable) -> None:
        """Namespace and one claim template per (profile, count) the replay uses."""
        try:
            namespace: Any = {"metadata": {"name": self.namespace}}
            await self.core.create_namespace(namespace)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        templates = claim_templates(self.pods, table, self.by_memory, self.namespace)
        for template in templates.values():
            body: Any = template
            try:
                await self.resource.create_namespaced_resource_claim_template(self.namespace, body)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise

    async def run(self) -> Stats:
        # The first look at the nodes is the baseline that creates and destroys count from.
        await self._observe_nodes()
        start = time.monotonic()
        queue = sorted(self.pods, key=lambda p: p.created_s)
        next_draw = 0.0
        while (now := time.monotonic() - start) < self.duration_s:
            while queue and queue[0].created_s <= now:
                await self._create(queue.pop(0), time.monotonic())
            await self._observe(time.monotonic())
            if now >= next_draw:
                self._draw(now)
                next_draw = now + 1.0
            await asyncio.sleep(0.25)
        self._draw(self.duration_s)
        return self.stats

    async def _create(self, pod: TracePod, at: float) -> None:
        name = pod.name.lower()
        template = template_name(pod.profile, pod.count)
        body: Any = pod_body(name, template, pod.duration_s, self.namespace, self.node_selector)
        await self.core.create_namespaced_pod(self.namespace, body)
        self.tracks[name] = PodTrack(pod, at)
        self.stats.created += 1

    async def _observe(self, at: float) -> None:
        pods = await self.core.list_namespaced_pod(self.namespace)
        for pod in pods.items:
            track = self.tracks.get(pod.metadata.name)
            if track is None or track.finished:
                continue
            if track.bound_at is None and pod.spec.node_name:
                track.bound_at, track.node = at, pod.spec.node_name
                self.stats.served += 1
                self.stats.waits_s.append(at - track.created_at)
            if pod.status.phase in ("Succeeded", "Failed"):
                await self.core.delete_namespaced_pod(pod.metadata.name, self.namespace)
                track.finished = True
                self.stats.finished += 1
        await self._observe_nodes()

    async def _observe_nodes(self) -> None:
        result = await self.custom.list_cluster_custom_object(GROUP, VERSION, MIGNODE_PLURAL)
        self.mignodes = [
            n for n in result["items"] if self.nodes is None or n["metadata"]["name"] in self.nodes
        ]
        claims = await self.resource.list_namespaced_resource_claim(self.namespace)
        # the nodes first: a claim released before a device went shows in the later list
        self.ledger.mignodes_listed(self.mignodes)
        self.ledger.claims_listed(self.api.sanitize_for_serialization(claims)["items"])
        for violation in self.ledger.violations:
            if violation not in self.violations:
                self.violations.add(violation)
                self.stats.destroyed_in_use += 1
                self.events.append(f"{violation.node}: DESTROYED IN USE {violation.device}")
        for node in self.mignodes:
            name = node["metadata"]["name"]
            plan_id = (node.get("spec") or {}).get("planId")
            present = {
                DeviceId.of(name, gpu["index"], inst["profile"], inst["start"])
                for gpu in (node.get("status") or {}).get("gpus", [])
                for inst in gpu.get("instances", [])
            }
            if name not in self.seen_devices:
                # A node's first look is its baseline: what it has was not done by the replay.
                self.seen_devices[name] = present
                if plan_id:
                    self.stats.plan_ids[name] = plan_id
                continue
            if plan_id and self.stats.plan_ids.get(name) != plan_id:
                self.stats.plan_ids[name] = plan_id
                self.stats.repartitions += 1
                self.events.append(f"{name}: repartition {plan_id}")
            seen = self.seen_devices[name]
            self.stats.creates += len(present - seen)
            self.stats.destroys += len(seen - present)
            self.seen_devices[name] = present

    def _draw(self, now: float) -> None:
        tty = self.out.isatty()
        pending = sum(1 for t in self.tracks.values() if t.bound_at is None)
        running = sum(1 for t in self.tracks.values() if t.bound_at and not t.finished)
        lines = [
            f"migpart demo  t={now:5.1f}s/{self.duration_s:.0f}s  pods: pending {pending}  "
            f"running {running}  done {self.stats.finished}  | {self.stats.summary()}"
        ]
        if tty:
            for node in sorted(self.mignodes, key=lambda n: n["metadata"]["name"]):
                status = node.get("status") or {}
                synced = (node.get("spec") or {}).get("planId") == status.get("observedPlanId")
                lines.append(
                    f"  {node['metadata']['name']}  {'synced' if synced else 'RECONFIGURING'}"
                )
                for gpu in status.get("gpus", []):
                    cells = " ".join(
                        f"{i['profile']}{'*' if i['state'] != 'Free' else ''}"
                        for i in sorted(gpu.get("instances", []), key=lambda i: i["start"])
                    )
                    lines.append(f"    gpu{gpu['index']}: {cells or '-'}")
            lines.append("  (* = in use)  recent: " + "; ".join(self.events[-3:]))
            self.out.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
        elif int(now) % 5 == 0:
            self.out.write(lines[0] + "\n")
        self.out.flush()
