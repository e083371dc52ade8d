"""Offer mode as a policy: kube-scheduler allocates at once from the placements migpart offers.

Each node publishes its offer (`migpart.planning.offer.offer`, the operator's own steering):
its free instances, then placements not created yet, in the order the planner wants them
taken. The scheduler's pass takes the pending pods in arrival order (`Engine._schedule`) and
gives each, on the first node in node order (`node-1`, `node-2`, ...: the order first-fit
tries them) where the offer holds them, the first offered devices of its first profile that
still fit, then of its next one. "Still fit" is the counters' rule: no memory slice in common
with an instance there or chosen with it, within the compute slices and the profile's
instance limit. A pod given an existing free instance starts at once; one given a placement
waits for its creation (`actuation_s` per GPU touched, one after another, as first-fit's); a
placement that displaces free instances destroys them first.

The planner re-steers between events: a node's offer is recomputed at most once per instant,
when its instances changed, so pods scheduled in the same pass see the same order and only
the counters tell them apart. A departing pod's instances stay free and are offered first;
they are destroyed only when a pod takes a placement that needs their space (the reactive
planner's rule: free instances are repartitioned for a request, never for nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from migpart.mig import Instance, Occupancy
from migpart.planning.model import InstanceState, PolicyView
from migpart.planning.offer import Offered, OfferGpu, Step, offer
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine
from migpart.sim.workload import SimPod

# A node's offer by profile, in offer order.
_NodeOffer = dict[str, list[Offered]]
_Key = tuple[tuple[int, Instance, bool], ...]


@dataclass
class Offer:
    policy: PolicyView = field(default_factory=PolicyView)
    actuation_s: float = 5.0
    batch_window_s: float = 2.0
    displace_waiting_only: bool = True
    name: str = "offer"
    # node -> (instant computed, its instances then, the profiles waiting then, the offer)
    _offers: dict[int, tuple[float, _Key, frozenset[str] | None, _NodeOffer]] = field(
        default_factory=dict
    )
    _waiting: tuple[float, frozenset[str] | None] = (-1.0, None)
    _resteer_due: bool = False

    def setup(self, engine: Engine) -> None:
        engine.allocate = lambda pod: self._allocate(engine, pod)

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None:
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
        """The profiles of the pods that have waited a batch window (None: every profile)."""
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
        # Freed instances stay: offered first, destroyed when a placement needs their space.
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

    def _offer(self, engine: Engine, node: int) -> _NodeOffer:
        cached = self._offers.get(node)
        if cached is not None and cached[0] == engine.now:
            return cached[3]
        key = _state(engine.cluster, node)
        waiting = self._waiting_profiles(engine)
        if cached is not None and cached[1:3] == (key, waiting):
            self._offers[node] = (engine.now, key, waiting, cached[3])
            return cached[3]
        by_profile: _NodeOffer = {}
        for o in offer(_gpus(engine.cluster, node), self.policy, waiting=waiting):
            by_profile.setdefault(o.instance.profile, []).append(o)
        self._offers[node] = (engine.now, key, waiting, by_profile)
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
    return tuple(
        (gpu.index, inst, state.holder is not None)
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
