"""The discrete-event loop: arrivals, the scheduler, instances becoming ready, departures.

Every policy runs on the same loop; a policy only decides which instances exist (`Policy`).
The scheduler takes pending pods in arrival order and gives each free ready devices on one
node (`SimCluster.find`); a pod that finds none stays pending without blocking later ones, as
kube-scheduler retries each pod on its own. A pod bound to instances being created starts
when the last of them is ready. Waiting is measured from arrival to start.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from migpart.mig import Instance
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.workload import SimPod, arrival_window

_ARRIVE, _READY, _DEPART, _TIMER = range(4)
_SAMPLES = 2000


class Policy(Protocol):
    """What decides the instances: set up the cluster, react to pods the scheduler could not
    place, to departures, and to its own timers."""

    name: str

    def setup(self, engine: Engine) -> None: ...

    def unplaced(self, engine: Engine, pods: Sequence[SimPod]) -> None: ...

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None: ...


@dataclass(slots=True)
class Outcome:
    """What one run measured. `waits_s` holds every pod's wait, in the order of the input;
    a pod never started waits until the run's end (`served` counts the others)."""

    policy: str
    pods: int
    served: int
    waits_s: list[float]
    sizes: list[str]
    utilisation: float
    creates: int
    destroys: int
    planner_cpu_s: float
    span_s: float
    timeline: list[tuple[float, float, int]] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        cluster: SimCluster,
        pods: Sequence[SimPod],
        policy: Policy,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.pods = list(pods)
        self.policy = policy
        self.progress = progress
        # The scheduler's choice of devices for a pod: free ready instances
        # (`SimCluster.find`), unless the policy's `setup` puts its own in (offer mode, where
        # the scheduler also allocates placements the policy offers, creating them).
        self.allocate: Callable[[SimPod], list[Device] | None] = cluster.find
        self.now = 0.0
        self.pending: dict[str, SimPod] = {}
        self.arrivals: list[SimPod] = []
        self.bound: dict[str, list[Device]] = {}
        self.started: dict[str, float] = {}
        self.creates = 0
        self.destroys = 0
        self.planner_cpu_s = 0.0
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._running_slices = 0
        self._busy_area = 0.0
        self._last_t = 0.0
        self._changed = False
        self._timeline: list[tuple[float, float, int]] = []
        self._window = (0.0, 0.0)
        self._by_name = {p.name: p for p in self.pods}
        assert len(self._by_name) == len(self.pods), "pod names must be unique"

    # --- what policies call --------------------------------------------------------------

    def at(self, time_s: float, callback: Callable[[], None]) -> None:
        """Call `callback` at `time_s` (not before now)."""
        self._push(max(time_s, self.now), _TIMER, callback)

    def create(
        self, node: int, index: int, inst: Instance, ready_s: float, holder: str | None = None
    ) -> None:
        """Create an instance that becomes ready at `ready_s`, free or bound to `holder`."""
        self.creates += 1
        ready = ready_s <= self.now
        self.cluster.add(node, index, inst, ready=ready, holder=holder)
        if not ready:
            self._push(ready_s, _READY, (node, index, inst))
        else:
            self._changed = True

    def destroy(self, node: int, index: int, inst: Instance) -> None:
        """Destroy a free instance (the cluster refuses a held one)."""
        self.destroys += 1
        self.cluster.remove(node, index, inst)

    def bind(self, pod: SimPod, devices: Sequence[Device]) -> None:
        """Give `pod` these free devices (ready or being created); it starts when all are
        ready."""
        del self.pending[pod.name]
        for device in devices:
            self.cluster.hold(device, pod.name)
        self.bound[pod.name] = list(devices)
        self._start_if_ready(pod.name)

    def capacity_changed(self) -> None:
        """Have the scheduler's next pass try every pending pod (what a policy offers changed
        without an instance being freed)."""
        self._changed = True

    def add_planner_cpu(self, seconds: float) -> None:
        self.planner_cpu_s += seconds

    def longest_running(self) -> dict[str, float]:
        """Node name -> how long its longest-running pod has run (0 where none runs): what a
        policy holding a node for a multi-GPU request weighs (`planning.overtime`)."""
        cluster = self.cluster
        out: dict[str, float] = {}
        for node, name in enumerate(cluster.names):
            starts = [
                self.started.get(s.holder, self.now)
                for gpu in cluster.gpus[node]
                for s in gpu.instances.values()
                if s.holder is not None
            ]
            out[name] = self.now - min(starts, default=self.now)
        return out

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> Outcome:
        self.policy.setup(self)
        for pod in self.pods:
            self._push(pod.arrival_s, _ARRIVE, pod)
        self._window = arrival_window(self.pods)
        self._last_t = 0.0
        handled = 0
        total = max(1, 2 * len(self.pods))
        new: list[SimPod] = []
        while self._events:
            time_s, _, kind, data = heapq.heappop(self._events)
            self._advance(time_s)
            if kind == _ARRIVE:
                assert isinstance(data, SimPod)
                self.pending[data.name] = data
                self.arrivals.append(data)
                new.append(data)
                handled += 1
            elif kind == _READY:
                assert isinstance(data, tuple)
                node, index, inst = data
                state = self.cluster.set_ready(node, index, inst)
                if state.holder is not None:
                    self._start_if_ready(state.holder)
                else:
                    self._changed = True
            elif kind == _DEPART:
                assert isinstance(data, SimPod)
                devices = self.bound.pop(data.name)
                self._running_slices -= data.slices
                for device in devices:
                    self.cluster.release(device)
                self.policy.released(self, data, devices)
                self._changed = True
                handled += 1
            else:
                assert callable(data)
                data()
            # Events at the same instant are handled before the scheduler runs.
            if self._events and self._events[0][0] <= self.now:
                continue
            self._schedule(new)
            new = []
            if self.progress is not None and handled % 500 == 0:
                self.progress(handled / total)
        span = max(self._window[1] - self._window[0], 1e-9)
        area = self._busy_area
        waits = [self.started.get(p.name, self.now) - p.arrival_s for p in self.pods]
        return Outcome(
            policy=self.policy.name,
            pods=len(self.pods),
            served=len(self.started),
            waits_s=waits,
            sizes=[p.size for p in self.pods],
            utilisation=area / (self.cluster.capacity_slices * span),
            creates=self.creates,
            destroys=self.destroys,
            planner_cpu_s=self.planner_cpu_s,
            span_s=span,
            timeline=_thin(self._timeline),
        )

    def _push(self, time_s: float, kind: int, data: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time_s, self._seq, kind, data))

    def _advance(self, time_s: float) -> None:
        if time_s > self._last_t:
            lo, hi = self._window
            begin, end = max(lo, self._last_t), min(hi, time_s)
            if end > begin:
                self._busy_area += self._running_slices * (end - begin)
            self._last_t = time_s
        self.now = time_s

    def _start_if_ready(self, name: str) -> None:
        devices = self.bound[name]
        cluster = self.cluster
        if name in self.started:
            return
        for node, index, inst in devices:
            if not cluster.gpus[node][index].instances[inst].ready:
                return
        pod = self._by_name[name]
        self.started[name] = self.now
        self._running_slices += pod.slices
        self._push(self.now + pod.duration_s, _DEPART, pod)

    def _schedule(self, new: list[SimPod]) -> None:
        """The scheduler's pass: every pending pod when capacity changed, else the new ones;
        then the policy hears of the pods left pending."""
        candidates = list(self.pending.values()) if self._changed else new
        self._changed = False
        left: list[SimPod] = []
        for pod in candidates:
            if pod.name not in self.pending:
                continue
            devices = self.allocate(pod)
            if devices is None:
                left.append(pod)
            else:
                self.bind(pod, devices)
        if left:
            self.policy.unplaced(self, left)
        self._timeline.append((self.now, self._running_slices, len(self.pending)))


def _thin(points: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    if len(points) <= _SAMPLES:
        return points
    step = len(points) / _SAMPLES
    return [points[int(k * step)] for k in range(_SAMPLES)]
