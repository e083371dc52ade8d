"""The demo's pods on the simulator: what static MIG, first-fit and the simulator's model of
migpart give for the same pods on the same cluster shape, in one line beside the run's own.

Both sides count the same things, by the end of the replay (`DemoRun.duration_s` after it
began; the simulator replays the same arrivals and run times from 0):

- **served**: pods that got their devices (demo: the pod was given a node; simulator: it
  started) before the end, out of all the run's pods;
- **mean wait**: over those pods, from creation (arrival) to that moment;
- **creates+destroys**: MIG instances created plus instances destroyed before the end (demo:
  instances that appeared in or left a MigNode status between two of the replay's looks;
  simulator: `Engine.creates + Engine.destroys`). Not the demo's "repartitions" (plans
  written to a node): first-fit and static layouts have no plans to count.

The simulator's migpart runs the run's policy: its batch window, `maxConcurrentNodes`, profile
filter and spares (`policy_view`), ageing as the operator ages claims (`planning.overtime.AGE_S`),
and neither of the simulator's own options the operator lacks (spares from the recent mix,
holding a node for a multi-GPU pod). Its actuation time per changed GPU is the
agent's NVML calls for it at the run's simulated latency (`NVML_CALLS_PER_GPU`). The model has
no API server, informers or scheduler back-off, so its waits are shorter than the run's; served
and creates+destroys are what the e2e cross-check compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from migpart.demo.cluster import DEVICE_CLASS
from migpart.demo.replay import Stats, claim_templates, template_name
from migpart.demo.run import DemoRun
from migpart.demo.trace import TracePod
from migpart.kube.selectors import CEL
from migpart.mig import ModelTable
from migpart.planning.demand import ClaimDemand, claim_demand
from migpart.planning.model import PolicyView
from migpart.planning.overtime import AGE_S
from migpart.sim.engine import Engine
from migpart.sim.migpart import MigpartSettings
from migpart.sim.run import SimConfig, empty_cluster, make_policy
from migpart.sim.workload import SimPod, make_pod

COMPARED = ("all-balanced", "first-fit", "migpart", "offer")
# An agent pass that changes a GPU lists its instances twice (before and after destroying)
# and makes one create or destroy: three calls at the simulated NVML latency.
NVML_CALLS_PER_GPU = 3


@dataclass(frozen=True, slots=True)
class Measured:
    """One run's numbers by the end of the replay, counted alike on both sides."""

    pods: int
    served: int
    mean_wait_s: float
    creates: int
    destroys: int

    @property
    def changes(self) -> int:
        """MIG instances created plus destroyed."""
        return self.creates + self.destroys


def sim_pods(
    pods: Sequence[TracePod],
    templates: Mapping[str, Mapping[str, Any]],
    table: ModelTable,
    policy: PolicyView,
    classes: Mapping[str, Mapping[str, Any]],
) -> list[SimPod]:
    """The simulator's pods for the replay's: the same names, arrivals and run times, and the
    profiles and count the operator derives from each pod's claim (`claim_demand` over its
    template, so a claim by memory accepts every profile with enough of it, smallest first)."""
    out: list[SimPod] = []
    for pod in pods:
        template = templates[template_name(pod.profile, pod.count)]
        claim = {"metadata": {"name": pod.name}, "spec": template["spec"]["spec"]}
        demand = claim_demand(claim, classes, {table.model: table}, policy, CEL)
        if not isinstance(demand, ClaimDemand):
            raise ValueError(f"{pod.name}: its claim is not one migpart can serve ({demand})")
        request = demand.request
        out.append(
            make_pod(
                table,
                pod.name.lower(),
                pod.created_s,
                pod.duration_s,
                request.profiles,
                request.count,
            )
        )
    return out


def device_classes() -> dict[str, dict[str, Any]]:
    """The demo's DeviceClass (`manifests/deviceclass.yaml`) by name."""
    body: dict[str, Any] = yaml.safe_load(DEVICE_CLASS.read_text())
    return {body["metadata"]["name"]: body}


def sim_config(run: DemoRun) -> SimConfig:
    """The simulator's settings for the run's cluster shape and policy."""
    spec = run.policy().spec
    return SimConfig(
        table=run.table,
        nodes=run.nodes,
        gpus_per_node=run.gpus_per_node,
        policies=COMPARED,
        actuation_s=NVML_CALLS_PER_GPU * run.sim_latency_ms / 1000.0,
        planner_policy=spec.policy_view(),
        # the operator's knobs; spares from the mix and held nodes, which it lacks, stay off
        migpart=MigpartSettings(
            batch_window_s=float(spec.reconfiguration.batch_window_seconds),
            max_concurrent_nodes=spec.reconfiguration.max_concurrent_nodes,
            age_s=AGE_S,
        ),
    )


def simulated(run: DemoRun) -> dict[str, Measured]:
    """Each of `COMPARED` on the run's pods (no jitter), measured at the replay's end."""
    config = sim_config(run)
    templates = claim_templates(run.pods, run.table, namespace=run.namespace)
    pods = sim_pods(run.pods, templates, run.table, config.planner_policy, device_classes())
    return {name: measure(config, name, pods, run.duration_s) for name in config.policies}


def measure(config: SimConfig, name: str, pods: Sequence[SimPod], end_s: float) -> Measured:
    """Policy `name` of `config` on `pods` (arrivals as given), counted at `end_s`."""
    policy, workload = make_policy(config, name, pods)
    engine = Engine(empty_cluster(config), workload, policy)
    at_end: dict[str, int] = {}

    def record() -> None:
        at_end.update(creates=engine.creates, destroys=engine.destroys)

    # Pushed before any arrival: at `end_s` it runs before events of the same instant.
    engine.at(end_s, record)
    engine.run()
    arrival = {p.name: p.arrival_s for p in pods}
    waits = [t - arrival[n] for n, t in engine.started.items() if t <= end_s]
    return Measured(
        pods=len(pods),
        served=len(waits),
        mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
        creates=at_end["creates"],
        destroys=at_end["destroys"],
    )


def measured(stats: Stats) -> Measured:
    """The run's own numbers, as `Measured`."""
    return Measured(
        pods=stats.created,
        served=stats.served,
        mean_wait_s=stats.mean_wait_s,
        creates=stats.creates,
        destroys=stats.destroys,
    )


def comparison_line(sim: Mapping[str, Measured], run: Measured) -> str:
    """`simulator, same 24 pods: all-balanced served 20/24, mean wait 12.1 s, 0
    creates+destroys; ...; this run: served 24/24, mean wait 3.3 s, 31 creates+destroys`."""

    def part(m: Measured) -> str:
        return (
            f"served {m.served}/{m.pods}, mean wait {m.mean_wait_s:.1f} s, "
            f"{m.changes} creates+destroys"
        )

    pods = next(iter(sim.values())).pods if sim else run.pods
    policies = "; ".join(f"{name} {part(m)}" for name, m in sim.items())
    return f"simulator, same {pods} pods: {policies}; this run: {part(run)}"
