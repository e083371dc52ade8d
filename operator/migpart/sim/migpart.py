"""migpart as a policy: the real planner, called through the plan contract, once per batch
window while pods wait.

A round gathers the pending pods `batch_window_s` after the first one the scheduler could not
place, writes the snapshot JSON of the `migpart plan` contract (nodes that are being
reconfigured are left out, as the operator leaves them alone until their agent reports),
parses it with the contract's parser, plans, and reads the plan JSON back. At most
`max_concurrent_nodes` nodes reconfigure at once, the nodes serving the most requests first
(`planning.changes`, the operator's own choice);
each changed GPU takes `actuation_s`, one after another on a node. A pod assigned to instances
being created is bound to them (the operator's planned device) and starts when they are ready;
free instances of a target layout (spares) are published as they become ready.

Over time (`migpart.planning.overtime`), with `age_s` set: a pod that has waited `age_s` ranks
above younger ones in the planner, and an instance freed while such a pod waits that cannot
use it is withdrawn rather than handed to a younger pod (in a cluster the operator republishes
the slice without it; the simulator lets the operator win that race). `spares_total` free
instances are kept, split over the profiles of the last `mix_window` pods. With `hold_used`
set, a node is held for the oldest waiting multi-GPU pod (`held_node`, bounded by `hold_s`):
other pods are planned elsewhere, and instances freed on it are withdrawn while that pod waits.

Instances that are held, or still being created, are `used` in the snapshot: the planner never
destroys them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from migpart.errors import InvalidInput
from migpart.mig import Instance, Profile
from migpart.planning.changes import Changes, choose_nodes, layout_changes
from migpart.planning.codec import Parsers, encode_plan, parse_input
from migpart.planning.model import PolicyView, Request
from migpart.planning.overtime import (
    Hold,
    aged,
    held_node,
    kept_off,
    spares_from_mix,
    withdraw_on_release,
)
from migpart.planning.planner import plan
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine
from migpart.sim.workload import SimPod


@dataclass(frozen=True, slots=True)
class MigpartSettings:
    """migpart's own knobs (`migpart simulate --batch-window-s` to `--spares-from-mix`); the
    time a GPU change takes and the planner's policy belong to the run, as the other policies
    take them too."""

    batch_window_s: float = 2.0
    max_concurrent_nodes: int = 1
    age_s: float | None = None
    spares_total: int = 0
    mix_window: int = 200
    hold_used: float | None = None
    hold_s: float = 1800.0


@dataclass
class Migpart:
    policy: PolicyView = field(default_factory=PolicyView)
    actuation_s: float = 5.0
    settings: MigpartSettings = field(default_factory=MigpartSettings)
    name: str = "migpart"
    cpu_clock: Callable[[], float] = time.process_time
    rounds: int = 0
    _round_due: bool = False
    _busy_until: dict[int, float] = field(default_factory=dict)
    _hold: Hold | None = None

    def setup(self, engine: Engine) -> None:
        if self.policy.spares:
            # Spares are kept from the start: the operator plans them with no request pending.
            engine.at(0.0, lambda: self._round(engine))

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None:
        if not self._round_due:
            self._round_due = True
            engine.at(engine.now + self.settings.batch_window_s, lambda: self._round(engine))

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
        if not engine.pending:
            return
        held = self._held(engine)
        if held is not None:
            # Withdrawn, not handed to a pod that would keep the node from draining.
            for node, index, inst in devices:
                if node == held:
                    engine.destroy(node, index, inst)
            devices = [d for d in devices if d[0] != held]
        if self.settings.age_s is None or not devices:
            return
        now = engine.now
        waiting = [(_request(p, 0), now - p.arrival_s) for p in engine.pending.values()]
        profiles = [inst.profile for _, _, inst in devices]
        if withdraw_on_release(profiles, waiting, self.settings.age_s):
            for node, index, inst in devices:
                engine.destroy(node, index, inst)

    def _node_done(self, engine: Engine) -> None:
        if engine.pending:
            self.unplaced(engine, list(engine.pending.values()))

    def _round(self, engine: Engine) -> None:
        self._round_due = False
        settings = self.settings
        cluster = engine.cluster
        now = engine.now
        busy = {n for n, t in self._busy_until.items() if t > now}
        room = settings.max_concurrent_nodes - len(busy)
        pending = list(engine.pending.values())
        if room <= 0 or (not pending and not self.policy.spares and not settings.spares_total):
            return
        idle = [n for n in range(len(cluster.names)) if n not in busy]
        requests = [_request(p, 0) for p in pending]
        waited = {p.name: now - p.arrival_s for p in pending}
        if settings.age_s is not None:
            requests = aged(requests, waited, settings.age_s)
        policy = self.policy
        if settings.spares_total:
            recent = [_request(p, 0) for p in engine.arrivals[-settings.mix_window :]]
            policy = replace(policy, spares=spares_from_mix(recent, settings.spares_total))
        document = snapshot_document(cluster, idle, requests)
        started = self.cpu_clock()
        parsed = parse_input(document, Parsers(policy=lambda _: policy, profile=_no_table))
        planned: Sequence[Request] = parsed.requests
        if settings.hold_used is not None:
            self._hold = held_node(
                parsed.snapshot,
                planned,
                settings.hold_used,
                engine.longest_running(),
                waited,
                settings.hold_s,
            )
            if self._hold is not None:
                planned = kept_off(planned, self._hold, cluster.names)
        planned_plan = plan(parsed.snapshot, planned, policy)
        result = encode_plan(planned_plan, 0.0)
        engine.add_planner_cpu(self.cpu_clock() - started)
        self.rounds += 1
        changes = layout_changes(parsed.snapshot, planned_plan)
        chosen = choose_nodes(
            _in_node_order(changes, cluster.names),
            [cluster.names[n] for n in busy],
            planned_plan,
            settings.max_concurrent_nodes,
        )
        self._apply(engine, changes, chosen, result)
        held = self._held(engine)
        if held is not None:
            for gpu in cluster.gpus[held]:
                for inst, state in list(gpu.instances.items()):
                    if state.ready and state.holder is None:
                        engine.destroy(held, gpu.index, inst)

    def _held(self, engine: Engine) -> int | None:
        """The held node's index while its request still waits."""
        hold = self._hold
        if hold is None or hold.request.name not in engine.pending:
            return None
        return engine.cluster.names.index(hold.node)

    def _apply(
        self, engine: Engine, changes: Changes, chosen: list[str], result: dict[str, Any]
    ) -> None:
        """Reconfigure the `chosen` nodes, one changed GPU after another, and bind the pods
        that the plan (its JSON) assigns to nodes left as they are or reconfigured now."""
        cluster = engine.cluster
        node_of = {name: n for n, name in enumerate(cluster.names)}
        steps_of: dict[int, list[tuple[int, set[Instance]]]] = {}
        for (name, index), (_, after) in changes.items():
            target = {Instance(profile, start) for start, profile in after}
            steps_of.setdefault(node_of[name], []).append((index, target))
        for node in (node_of[name] for name in chosen):
            steps = sorted(steps_of[node])
            for k, (index, target) in enumerate(steps):
                current = cluster.gpus[node][index].instances
                for inst in [i for i in current if i not in target]:
                    engine.destroy(node, index, inst)
                ready_s = engine.now + self.actuation_s * (k + 1)
                for inst in sorted(target - set(current)):
                    engine.create(node, index, inst, ready_s)
            done_s = engine.now + self.actuation_s * len(steps)
            self._busy_until[node] = done_s
            # A node done reconfiguring can take the next round's changes.
            engine.at(done_s, lambda: self._node_done(engine))
        applied = {node_of[name] for name in chosen}
        for a in result["assignments"]:
            node = node_of[a["node"]]
            if node in steps_of and node not in applied:
                continue
            pod = engine.pending.get(a["request"])
            if pod is None:
                continue
            devices = [(node, d["gpu"], Instance(d["profile"], d["start"])) for d in a["devices"]]
            engine.bind(pod, devices)


def _in_node_order(changes: Changes, names: Sequence[str]) -> list[str]:
    """The changed nodes in the cluster's node order (the order `choose_nodes` breaks ties
    in: node-2 before node-10)."""
    changed = {name for name, _ in changes}
    return [name for name in names if name in changed]


def _no_table(raw: object) -> Profile:
    """The simulator's snapshots name catalog models only: they carry no profile tables."""
    raise InvalidInput("", "the simulator's snapshots carry no profile tables")


def _request(pod: SimPod, priority: int) -> Request:
    return Request(pod.name, pod.profiles, pod.count, priority, pod.nodes)


def snapshot_document(
    cluster: SimCluster, nodes: Sequence[int], pending: Sequence[Request]
) -> dict[str, Any]:
    """The plan contract's snapshot of `nodes` with the pending pods as requests."""
    names = cluster.names
    doc_nodes = []
    for n in nodes:
        gpus = []
        for gpu in cluster.gpus[n]:
            instances = [
                {
                    "profile": i.profile,
                    "start": i.start,
                    "used": s.holder is not None or not s.ready,
                }
                for i, s in sorted(gpu.instances.items())
            ]
            gpus.append({"index": gpu.index, "model": cluster.table.model, "instances": instances})
        doc_nodes.append({"name": names[n], "gpus": gpus})
    requests: list[dict[str, Any]] = []
    for r in pending:
        request: dict[str, Any] = {
            "name": r.name,
            "profiles": list(r.profiles),
            "count": r.count,
            "priority": r.priority,
        }
        if r.nodes is not None:
            request["nodes"] = sorted(r.nodes)
        requests.append(request)
    return {"nodes": doc_nodes, "requests": requests}
