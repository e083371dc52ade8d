"""Offer mode as a policy: kube-scheduler allocates at once from the placements migpart offers,
and a reactive round serves the pods no offer holds.

Each node publishes its offer (`migpart.planning.offer.offer`, the operator's own steering):
its free instances, then placements not created yet, in the order the planner wants them
taken. The scheduler's pass takes the pending pods in arrival order (`Engine._schedule`) and
gives each, on the first node in node order (`node-1`, `node-2`, ...: the order first-fit
tries them) where the offer holds them, the first offered devices of its first profile that
still fit, then of its next one. "Still fit" is the counters' rule: no memory slice in common
with an instance there or chosen with it, within the compute slices and the profile's
instance limit. A pod given an existing free instance starts at once; one given a placement
waits for its creation (`actuation_s` per GPU touched, one after another, as first-fit's).

As the operator (`controller.offers`, `waiting=NO_DISPLACING`, `--offer-depth`), the offer
lists at most `depth` new placements of a profile per node and never a placement that
displaces free instances: destroying one is the destroy protocol's, i.e. a
planning round's. A pod the offer cannot hold is unschedulable, and reactive migpart's round
serves it (`sim.migpart.Migpart`, by composition: a batch window after the first such pod, the
real planner, `actuation_s` per changed GPU, at most `max_concurrent_nodes` nodes at once),
planning only for the unschedulable pods (`controller.offers.unschedulable_requests`). The
instances a round creates for a pod are bound to it; the free instances it destroys are held
by no pod (the planner never destroys what is in use). After a round the scheduler tries every
pending pod again (the operator republishes the slices).

`displace_at_once` is the earlier, optimistic model, kept to reproduce its figures
(docs/offer-simulation.md): placements that displace free instances are offered too, and a pod
that takes one has them destroyed at once, with no round; with `displace_waiting_only` as
well, only for the profiles of pods that have waited `batch_window_s`.

The planner re-steers between events: a node's offer is recomputed at most once per instant,
when its instances changed, so pods scheduled in the same pass see the same order and only
the counters tell them apart. A departing pod's instances stay free and are offered first.
While a multi-GPU pod has waited a batch window, `hold_used` holds a node whole for it as
reactive migpart does (`planning.overtime.held_node`): the node offers nothing while a pod
runs on it, then whole GPUs only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from migpart.mig import Instance, Occupancy
from migpart.planning.model import (
    GpuState,
    InstanceState,
    NodeState,
    PolicyView,
    Request,
    Snapshot,
)
from migpart.planning.offer import (
    DEFAULT_DEPTH,
    NO_DISPLACING,
    Holdback,
    Offered,
    OfferGpu,
    Step,
    node_spares,
    offer,
)
from migpart.planning.overtime import held_node
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine
from migpart.sim.migpart import Migpart
from migpart.sim.workload import SimPod

# A node's offer by profile, in offer order.
_NodeOffer = dict[str, list[Offered]]
_Key = tuple[tuple[int, Instance, bool], ...]


@dataclass
class Offer:
    policy: PolicyView = field(default_factory=PolicyView)
    actuation_s: float = 5.0
    batch_window_s: float = 2.0
    max_concurrent_nodes: int = 1
    age_s: float | None = None
    spares_total: int = 0
    # The earlier, optimistic model (module docstring): displacing placements offered and
    # taken at once, with no round; with `displace_waiting_only` as well, for the profiles of
    # pods that waited a batch window only (which alone means nothing).
    displace_at_once: bool = False
    displace_waiting_only: bool = False
    hold_used: float | None = None
    hold_s: float = 1800.0
    # New placements offered per profile and node, as the operator's `--offer-depth`
    # (`planning.offer`, "How many"); the optimistic model offers every placement.
    depth: int | None = DEFAULT_DEPTH
    name: str = "offer"
    # The reactive rounds (None with `displace_at_once`) and the pods they plan for.
    _rounds: Migpart | None = None
    _unschedulable: set[str] = field(default_factory=set)
    # node -> (instant computed, its instances then, the profiles waiting then, held, the offer)
    _offers: dict[int, tuple[float, _Key, frozenset[str] | None, bool, _NodeOffer]] = field(
        default_factory=dict
    )
    _waiting: tuple[float, frozenset[str] | None] = (-1.0, None)
    _held: tuple[float, int | None] = (-1.0, None)
    _resteer_due: bool = False

    @property
    def rounds(self) -> int:
        """How many reactive rounds planned."""
        return 0 if self._rounds is None else self._rounds.rounds

    def setup(self, engine: Engine) -> None:
        engine.allocate = lambda pod: self._allocate(engine, pod)
        if not self.displace_at_once:
            self._rounds = Migpart(
                policy=self.policy,
                batch_window_s=self.batch_window_s,
                actuation_s=self.actuation_s,
                max_concurrent_nodes=self.max_concurrent_nodes,
                age_s=self.age_s,
                spares_total=self.spares_total,
                hold_used=self.hold_used,
                hold_s=self.hold_s,
                name=self.name,
                plans_for=self._unschedulable_pods,
                after_round=lambda e: e.capacity_changed(),
            )
            self._rounds.setup(engine)

    def _unschedulable_pods(self, engine: Engine) -> list[SimPod]:
        """The pending pods the scheduler found unschedulable, in arrival order."""
        self._unschedulable.intersection_update(engine.pending)
        return [p for p in engine.pending.values() if p.name in self._unschedulable]

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None:
        if self._rounds is not None:
            self._unschedulable.update(p.name for p in pods)
            self._rounds.unplaced(engine, pods)
            return
        # The operator sees them wait and, a batch window later, offers placements that
        # displace free instances for their profiles; a pod whose profiles are offered so
        # already waits for a departure.
        if not self.displace_waiting_only or self._resteer_due:
            return
        waiting = self._waiting_profiles(engine) or frozenset()
        if any(not waiting.issuperset(pod.profiles) for pod in pods):
            self._resteer_due = True
            engine.at(engine.now + self.batch_window_s, lambda: self._resteer(engine))

    def _resteer(self, engine: Engine) -> None:
        self._resteer_due = False
        engine.capacity_changed()

    def _waiting_profiles(self, engine: Engine) -> frozenset[str] | None:
        """The profiles displacing placements may have: none (the operator's offer), every
        one (None: `displace_at_once`), or those of the pods that have waited a batch window
        (`displace_waiting_only`)."""
        if not self.displace_at_once:
            return NO_DISPLACING
        if not self.displace_waiting_only:
            return None
        at, waiting = self._waiting
        if at != engine.now:
            seen = engine.now - self.batch_window_s
            waiting = frozenset(
                p for pod in engine.pending.values() if pod.arrival_s <= seen for p in pod.profiles
            )
            self._waiting = (engine.now, waiting)
        return waiting

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
        # Freed instances stay: offered first, destroyed when a round (or, displacing at
        # once, a placement) needs their space.
        return None

    def _allocate(self, engine: Engine, pod: SimPod) -> list[Device] | None:
        cluster = engine.cluster
        for node in cluster.allowed(pod):
            offered = self._offer(engine, node)
            for profile in pod.profiles:
                chosen = choose(cluster, node, offered.get(profile, ()), pod.count)
                if chosen is not None:
                    return self._take(engine, node, chosen)
        return None

    def _held_node(self, engine: Engine) -> int | None:
        """The node held whole for the first multi-GPU pod that has waited a batch window
        (`planning.overtime.held_node`, as reactive migpart holds one), once per instant."""
        at, node = self._held
        if self.hold_used is None or at == engine.now:
            return node
        seen = engine.now - self.batch_window_s
        multi = [p for p in engine.pending.values() if p.count > 1 and p.arrival_s <= seen]
        held: int | None = None
        if multi:
            cluster = engine.cluster
            hold = held_node(
                _snapshot(cluster),
                [Request(p.name, p.profiles, p.count, 0, p.nodes) for p in multi[:1]],
                self.hold_used,
                engine.longest_running(),
                {p.name: engine.now - p.arrival_s for p in multi[:1]},
                self.hold_s,
            )
            held = None if hold is None else cluster.names.index(hold.node)
        if held != node:
            engine.capacity_changed()  # a node held or let go changes what is offered
        self._held = (engine.now, held)
        return held

    def _offer(self, engine: Engine, node: int) -> _NodeOffer:
        cached = self._offers.get(node)
        if cached is not None and cached[0] == engine.now:
            return cached[4]
        key = _state(engine.cluster, node)
        waiting = self._waiting_profiles(engine)
        held = self._held_node(engine) == node
        if cached is not None and cached[1:4] == (key, waiting, held):
            self._offers[node] = (engine.now, key, waiting, held, cached[4])
            return cached[4]
        by_profile: _NodeOffer = {}
        gpus = _gpus(engine.cluster, node)
        # As the operator's `node_offer`: the policy's spares are offered, never displaced.
        holdback = Holdback(
            spares=node_spares(gpus, self.policy.spares),
            whole=frozenset(g.index for g in gpus) if held else frozenset(),
        )
        # A held node offers nothing while a pod runs on it, then its GPUs whole.
        if not held or not any(i.used for g in gpus for i in g.instances):
            depth = None if self.displace_at_once else self.depth
            for o in offer(gpus, self.policy, holdback, waiting, depth):
                by_profile.setdefault(o.instance.profile, []).append(o)
        self._offers[node] = (engine.now, key, waiting, held, by_profile)
        return by_profile

    def _take(self, engine: Engine, node: int, chosen: Sequence[Offered]) -> list[Device]:
        touched: dict[int, int] = {}
        devices: list[Device] = []
        for o in chosen:
            devices.append((node, o.gpu, o.instance))
            if o.step == Step.FREE:
                continue
            k = touched.setdefault(o.gpu, len(touched) + 1)
            for inst in o.displaces:
                if inst in engine.cluster.gpus[node][o.gpu].instances:
                    engine.destroy(node, o.gpu, inst)
            engine.create(node, o.gpu, o.instance, engine.now + self.actuation_s * k)
        return devices


def choose(
    cluster: SimCluster, node: int, offered: Sequence[Offered], count: int
) -> list[Offered] | None:
    """The first `count` offered devices, in order, that fit the node's GPUs as they are now
    and beside each other; None when fewer fit."""
    chosen: list[Offered] = []
    for o in offered:
        if _fits(cluster, node, o, chosen):
            chosen.append(o)
            if len(chosen) == count:
                return chosen
    return None


def _fits(cluster: SimCluster, node: int, o: Offered, chosen: Sequence[Offered]) -> bool:
    instances = cluster.gpus[node][o.gpu].instances
    mine = [c for c in chosen if c.gpu == o.gpu]
    if o.step == Step.FREE:
        state = instances.get(o.instance)
        return (
            state is not None
            and state.holder is None
            and all(o.instance != c.instance and o.instance not in c.displaces for c in mine)
        )
    for inst in o.displaces:
        state = instances.get(inst)
        if state is not None and state.holder is not None:
            return False
        if any(c.step == Step.FREE and c.instance == inst for c in mine):
            return False
    gone = {i for c in mine for i in c.displaces}.union(o.displaces)
    present = [i for i in instances if i not in gone]
    present.extend(c.instance for c in mine if c.step != Step.FREE)
    table = cluster.table
    prof = table.profile(o.instance.profile)
    taken = Occupancy.of(table, present)
    return not taken.mask & prof.mask(o.instance.start) and taken.headroom(prof) >= 1


def _state(cluster: SimCluster, node: int) -> _Key:
    """What a node's offer depends on: each instance and whether it is in use (held, or still
    being created: a round creates instances no pod holds yet)."""
    return tuple(
        (gpu.index, inst, state.holder is not None or not state.ready)
        for gpu in cluster.gpus[node]
        for inst, state in sorted(gpu.instances.items())
    )


def _gpus(cluster: SimCluster, node: int) -> list[OfferGpu]:
    """The node's GPUs as the steering sees them: held or being created is in use."""
    return [
        OfferGpu(
            gpu.index,
            cluster.table,
            tuple(
                InstanceState(i.profile, i.start, s.holder is not None or not s.ready)
                for i, s in sorted(gpu.instances.items())
            ),
        )
        for gpu in cluster.gpus[node]
    ]


def _snapshot(cluster: SimCluster) -> Snapshot:
    """The cluster as the planner sees it: held or being created is in use."""
    nodes = tuple(
        NodeState(
            name,
            tuple(
                GpuState(name, g.index, cluster.table.model, gpu.instances)
                for g, gpu in zip(cluster.gpus[n], _gpus(cluster, n), strict=True)
            ),
        )
        for n, name in enumerate(cluster.names)
    )
    return Snapshot(nodes, {cluster.table.model: cluster.table})
