"""Which nodes migpart manages: only those that opted in, and none that NVIDIA's stack serves.

- A node without the opt-in label `migpart.io/managed=true` gets no slice, even where an agent
  runs and reports its GPUs; the policy lists it as unavailable (`NotOptedIn`). Labelled, it
  is served. (That the chart's DaemonSet starts no agent there is tests/unit/test_chart.py's
  and tests/e2e/test_install_page.py's.)
- A node whose GPUs another publisher offers (a `gpu.nvidia.com` ResourceSlice of NVIDIA's DRA
  driver, or NVIDIA's device plugin's `nvidia.com/mig-*` in its allocatable) is held by its
  agent: the MigNode's `PublisherOverlap` condition and a Warning Event name the overlap, no
  device is published, nothing is created. Gone, or with `--allow-publisher-overlap`, the node
  is managed and a pod is served.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from migpart.api.models import PUBLISHER_OVERLAP
from migpart.api.selectors import MANAGED_LABEL
from tests.e2e.conftest import H100, Scenario, wait_s

pytestmark = pytest.mark.e2e

PROFILE = 'device.attributes["mig.migpart.io"].profile == "3g.40gb"'
# the agent looks for other publishers at most once per resync period
FAST_CHECKS = ("--resync-seconds", "1")


def our_devices(scenario: Scenario, node: str) -> list[str] | None:
    """The devices of the node's migpart slice (None: no slice)."""
    items = scenario.get("resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    ours = [s for s in items if s["spec"]["driver"] == "mig.migpart.io"]
    return [d["name"] for d in ours[0]["spec"].get("devices") or []] if ours else None


def unavailable(scenario: Scenario, policy: str) -> list[dict[str, str]]:
    status = scenario.get("gpupartitionpolicy", policy).get("status") or {}
    return list(status.get("unavailableNodes") or [])


def overlap(scenario: Scenario, node: str) -> dict[str, Any] | None:
    conditions = (scenario.mignode(node).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == PUBLISHER_OVERLAP), None)


def overlap_events(scenario: Scenario, node: str) -> list[str]:
    selector = f"involvedObject.name={node},reason={PUBLISHER_OVERLAP}"
    items = scenario.get("events", "-n", "default", f"--field-selector={selector}")["items"]
    return [e["message"] for e in items]


def nvidia_slice(node: str) -> dict[str, Any]:
    """A ResourceSlice as NVIDIA's DRA driver publishes one GPU of `node`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-test"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def test_a_node_that_did_not_opt_in_gets_no_slice_until_labelled(scenario: Scenario) -> None:
    node = scenario.add_node(f"{H100}:1", labels={MANAGED_LABEL: None})
    policy = scenario.policy()
    scenario.pod("waits", PROFILE)
    scenario.eventually(
        "the policy lists the node as NotOptedIn",
        lambda: unavailable(scenario, policy) == [{"name": node, "reason": "NotOptedIn"}],
    )
    wait_s(3)  # a slice or a binding would show by now
    assert our_devices(scenario, node) is None
    assert not scenario.get("pod", "waits", "-n", scenario.namespace)["spec"].get("nodeName")
    assert scenario.gpus(node)[0]["instances"] == []  # nothing planned there either

    scenario.tb.kubectl("label", "node", node, f"{MANAGED_LABEL}=true")
    devices = scenario.wait_served("waits")
    assert [d["pool"] for d in devices] == [node]
    assert unavailable(scenario, policy) == []


def plugin_resources(scenario: Scenario, node: str, quantity: str) -> None:
    """What NVIDIA's device plugin makes kubelet report: its MIG resources on the Node (0 once
    the plugin is gone)."""
    resources = {"nvidia.com/mig-1g.10gb": quantity}
    patch = json.dumps({"status": {"capacity": resources, "allocatable": resources}})
    scenario.tb.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)


def reason(scenario: Scenario, node: str) -> str | None:
    return (overlap(scenario, node) or {}).get("reason")


def pending(scenario: Scenario, pod: str) -> bool:
    return not scenario.get("pod", pod, "-n", scenario.namespace)["spec"].get("nodeName")


def test_another_publisher_holds_the_node_until_it_is_gone_or_overridden(
    scenario: Scenario,
) -> None:
    node = scenario.add_node(f"{H100}:1", agent_args=FAST_CHECKS)
    policy = scenario.policy()

    # NVIDIA's device plugin offers the node's MIG devices: held
    plugin_resources(scenario, node, "7")
    scenario.eventually(
        "PublisherOverlap (DevicePlugin)", lambda: reason(scenario, node) == "DevicePlugin"
    )
    condition = overlap(scenario, node) or {}
    assert condition["status"] == "True"
    assert "nvidia.com/mig-1g.10gb: 7" in condition["message"]
    scenario.eventually("a Warning Event", lambda: bool(overlap_events(scenario, node)))
    assert "nvidia.com/mig-1g.10gb: 7" in overlap_events(scenario, node)[0]
    scenario.eventually(
        "the policy lists the node as PublisherOverlap",
        lambda: unavailable(scenario, policy) == [{"name": node, "reason": "PublisherOverlap"}],
    )
    scenario.pod("first", PROFILE)
    wait_s(3)  # a binding or a created instance would show by now
    assert pending(scenario, "first")
    assert not our_devices(scenario, node)
    assert scenario.gpus(node)[0]["instances"] == []

    # the device plugin left the node (kubelet keeps its resource at 0): managed again
    plugin_resources(scenario, node, "0")
    scenario.wait_served("first")
    assert reason(scenario, node) == "NoOtherPublisher"

    # NVIDIA's DRA driver publishes the node's GPU: held again, what runs keeps its device
    scenario.tb.kubectl("apply", "-f", "-", input=json.dumps(nvidia_slice(node)))
    try:
        scenario.eventually(
            "PublisherOverlap (DraDriver)", lambda: reason(scenario, node) == "DraDriver"
        )
        assert f"{node}-gpu.nvidia.com-test" in (overlap(scenario, node) or {})["message"]
        scenario.eventually("no device published", lambda: not our_devices(scenario, node))
        assert scenario.phase("first") == "Running"
        instances = [(i["profile"], i["state"]) for i in scenario.gpus(node)[0]["instances"]]
        assert ("3g.40gb", "Prepared") in instances
        scenario.pod("second", PROFILE)
        wait_s(3)
        assert pending(scenario, "second")

        # the user knows better: the agent again, with the override
        scenario.cluster.stop_agent(node)
        scenario.cluster.nodes[node].agent_args.append("--allow-publisher-overlap")
        scenario.cluster.start_agent(node)
        scenario.eventually("Overridden", lambda: reason(scenario, node) == "Overridden")
        assert (overlap(scenario, node) or {})["status"] == "False"
        scenario.wait_served("second")
    finally:
        scenario.tb.kubectl("delete", "resourceslice", f"{node}-gpu.nvidia.com-test", check=False)
