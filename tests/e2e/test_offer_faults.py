"""Offer mode under faults, end to end: real kubelets, the real kube-scheduler and
kube-controller-manager, agents on simulated NVML, the operator started with
`--offer-publishing`.

- A create that keeps failing: the node a Deployment's pod prefers answers
  INSUFFICIENT_RESOURCES to every create (`--sim-faults create_insufficient=1.0`). kubelet's
  prepare fails, again and again; after three the agent reports the placement unusable, the
  operator taints its device NoExecute, kube-controller-manager evicts the pod, and the
  Deployment's next pod runs on the healthy node. Nothing on the failing node is made or
  destroyed. Its agent started again without the fault makes the placement on its next retry,
  and the taint goes.
- A node moved from Reactive to Offer and back with pods running: every instance in use stays,
  with its UUID, through both moves, and pods are served in each mode.

On 1.34 offer mode is not served: the policy runs Reactive, and the first test checks the same
pod is served by a round on the healthy node (the reactive planner's own handling of a failed
create).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from migpart.demo.cluster import LocalCluster
from migpart.testing.builders import ClaimBuilder, PodBuilder
from tests.e2e.conftest import H100, SERVED, Scenario
from tests.e2e.offer import by_profile, instances, offered, pool_slices, reasons

pytestmark = pytest.mark.e2e

WHOLE = "7g.80gb"
WHOLE_DEVICE = "gpu-0-7g80gb-0"
FAILING = ("--sim-faults", "create_insufficient=1.0")
UNUSABLE_KEY = "mig.migpart.io/unusable"
# kubelet retries a failed prepare with its pod-sync back-off, three times over; the eviction
# and the Deployment's next pod; the agent's retry back-off
SLOW_S = 240.0


def deployment(sc: Scenario, name: str, selector: str, prefer: dict[str, str]) -> None:
    """A Deployment of one pod with a claim template of one device matching `selector`,
    scored onto nodes labelled `prefer` first."""
    template = ClaimBuilder(name, sc.namespace).request(selector).template()
    pod = PodBuilder(name, sc.namespace).claim_template(name).labels({"app": name})
    pod.node_selector({"migpart.io/pool": sc.pool})
    terms = [{"key": k, "operator": "In", "values": [v]} for k, v in prefer.items()]
    pod.spec(
        terminationGracePeriodSeconds=0,
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": terms}}
                ]
            }
        },
    )
    body = pod.obj()
    spec = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": body["spec"]},
    }
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": sc.namespace},
        "spec": spec,
    }
    items = {"apiVersion": "v1", "kind": "List", "items": [template, dep]}
    sc.tb.kubectl("apply", "-f", "-", input=json.dumps(items))


def pods_of(sc: Scenario, app: str) -> list[dict[str, Any]]:
    items = sc.get("pods", "-n", sc.namespace, "-l", f"app={app}")["items"]
    return list(items)


def running_on(sc: Scenario, app: str) -> str | None:
    """The node of the app's Running pod (None: none runs)."""
    for pod in pods_of(sc, app):
        if (pod.get("status") or {}).get("phase") == "Running":
            return str(pod["spec"]["nodeName"])
    return None


def taints(sc: Scenario, node: str, device: str) -> list[str]:
    return [
        f"{t['key']}:{t['effect']}"
        for s in pool_slices(sc, node)
        for d in s["spec"].get("devices") or []
        if d["name"] == device
        for t in d.get("taints") or []
    ]


def unusable(sc: Scenario, node: str) -> list[tuple[str, int, str]]:
    failed = (sc.mignode(node).get("status") or {}).get("failedInstances") or []
    return [(f["profile"], f["start"], f["reason"]) for f in failed]


def test_a_create_that_keeps_failing_taints_the_device_and_the_pod_moves(
    offering: LocalCluster, scenario: Scenario
) -> None:
    failing = scenario.add_node(f"{H100}:1", labels={"e2e-first": "yes"}, agent_args=FAILING)
    healthy = scenario.add_node(f"{H100}:1")

    def on(node: str) -> list[str]:
        pods = pods_of(scenario, "d1")
        return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == node]

    scenario.policy(reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4})
    if SERVED:
        scenario.eventually(
            f"{WHOLE} listed on both nodes",
            lambda: all(WHOLE_DEVICE in offered(scenario, n) for n in (failing, healthy)),
        )
    deployment(scenario, "d1", by_profile(WHOLE), prefer={"e2e-first": "yes"})
    if SERVED:
        scenario.eventually("d1's pod bound to the failing node", lambda: bool(on(failing)))
        [first] = on(failing)
    scenario.eventually(
        "d1 runs on the healthy node", lambda: running_on(scenario, "d1") == healthy, SLOW_S
    )
    assert instances(scenario, failing) == {}  # nothing made there, nothing destroyed
    if not SERVED:
        assert scenario.get("gpp", scenario.pool)["status"]["allocation"]["mode"] == "Reactive"
        return
    # allocated on the failing node first, failed there thrice, tainted, evicted; the
    # Deployment's next pod was allocated on the healthy node at once
    assert unusable(scenario, failing) == [(WHOLE, 0, "NvmlError")]
    assert taints(scenario, failing, WHOLE_DEVICE) == [f"{UNUSABLE_KEY}:NoExecute"]
    assert taints(scenario, healthy, WHOLE_DEVICE) == []
    [now] = [p["metadata"]["name"] for p in pods_of(scenario, "d1")]
    assert now != first  # the evicted pod is gone
    assert "FailedScheduling" not in reasons(scenario, now, scenario.namespace)

    # the fault gone, the agent's retry makes the placement: the report and the taint go
    node = offering.nodes[failing]
    node.agent_args = [a for a in node.agent_args if a not in FAILING]
    offering.stop_agent(failing)
    offering.start_agent(failing)
    scenario.eventually(
        "the placement works again: untainted",
        lambda: unusable(scenario, failing) == [] and taints(scenario, failing, WHOLE_DEVICE) == [],
        SLOW_S,
    )
    assert running_on(scenario, "d1") == healthy  # a running pod is not moved back


def test_a_node_moved_between_the_modes_with_pods_running_keeps_every_instance(
    offering: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(
        allocation="Reactive", reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4}
    )
    scenario.pod("p1", by_profile("3g.40gb"))
    scenario.wait_served("p1")
    kept = {k: v[0] for k, v in instances(scenario, node).items()}
    assert len(kept) == 1

    def moved(mode: str) -> None:
        scenario.policy(
            allocation=mode, reconfiguration={"batchWindowSeconds": 0, "maxConcurrentNodes": 4}
        )

    def still_there() -> None:
        now = instances(scenario, node)
        assert {k: now[k][0] for k in kept} == kept, now  # same UUIDs: nothing remade
        assert all(scenario.phase(p) == "Running" for p in running)

    running = ["p1"]
    moved("Offer")
    if SERVED:
        scenario.eventually(
            "the node offers",
            lambda: (
                (scenario.mignode(node).get("spec") or {}).get("allocation") == "Offer"
                and len(offered(scenario, node)) == 25
            ),
        )
    still_there()
    scenario.pod("p2", by_profile("1g.10gb"))
    scenario.wait_served("p2")
    running.append("p2")
    kept = {k: v[0] for k, v in instances(scenario, node).items()}
    assert len(kept) == 2
    if SERVED:
        assert "FailedScheduling" not in reasons(scenario, "p2", scenario.namespace)

    moved("Reactive")
    scenario.eventually(
        "the node is reactive again",
        lambda: (
            (scenario.mignode(node).get("spec") or {}).get("allocation") != "Offer"
            and offered(scenario, node) == []
        ),
    )
    still_there()
    scenario.pod("p3", by_profile("1g.10gb"))
    scenario.wait_served("p3")
    still_there()
