"""The testbed's real kubelets: what every other e2e test stands on."""

from __future__ import annotations

from pathlib import Path

import pytest

from migpart.testbed.build import kube_version
from migpart.testing.builders import POOL_LABEL, profile_is
from tests.e2e.conftest import H100, Scenario, wait_s
from tests.e2e.helpers import instances, mig_slice

pytestmark = pytest.mark.e2e
HOST_SETTINGS = (Path("/proc/sys/vm/overcommit_memory"), Path("/proc/sys/kernel/panic"))


def mounts_under(path: Path) -> list[str]:
    return [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(str(path))
    ]


def test_node_registers_ready_and_leaves_the_host_alone(scenario: Scenario) -> None:
    before = [p.read_text() for p in HOST_SETTINGS]
    node = scenario.add_node(f"{H100}:1", labels={"team": "a"})
    body = scenario.get("node", node)
    assert body["status"]["nodeInfo"]["kubeletVersion"] == f"v{kube_version()}"
    assert body["metadata"]["labels"]["team"] == "a"
    assert body["metadata"]["labels"][POOL_LABEL] == scenario.pool
    assert not body["spec"].get("taints")
    assert [c["status"] for c in body["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    # the kubelet's sysctls and its root dir's bind mount stay in its own mount namespace
    assert [p.read_text() for p in HOST_SETTINGS] == before
    sim = scenario.cluster.nodes[node]
    assert mounts_under(sim.dir) == []
    scenario.cluster.remove_gpu_node(node)
    scenario.nodes.remove(node)
    assert mounts_under(sim.dir) == []


def test_kubelet_restart_wipes_the_slice_migpart_republishes_and_pods_keep_devices(
    scenario: Scenario,
) -> None:
    """A kubelet deletes its node's ResourceSlices when it starts. The operator republishes
    the slice from the deletion it watches (not at its 30 s resync) at a newer pool
    generation, the scheduler allocates from it, and the running pod keeps its device: the
    kubelet finds its container in the runtime and creates none again."""
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(spares=[{"profile": "1g.10gb", "count": 1}])
    scenario.pod("steady", profile_is("1g.10gb"))
    devices = scenario.wait_served("steady")
    scenario.eventually(
        "the spare 1g.10gb published next to the allocated one",
        lambda: len(published(scenario, node)) == 2,
    )
    before = generation(scenario, node)
    kubelet = scenario.cluster.nodes[node].kubelet
    assert kubelet is not None
    created = len(kubelet.created_containers())
    kubelet.stop_kubelet()
    kubelet.start_kubelet()
    scenario.eventually(
        "the wiped slice republished at a newer generation",
        lambda: generation(scenario, node) > before and len(published(scenario, node)) == 2,
    )
    assert scenario.phase("steady") == "Running"
    assert scenario.allocated("steady") == devices
    assert (0, "1g.10gb", "Prepared") in instances(scenario, node)
    assert len(kubelet.created_containers()) == created
    scenario.pod("after", profile_is("1g.10gb"))
    assert scenario.wait_served("after")[0]["pool"] == node


def test_killed_agent_slice_is_wiped_not_republished_and_back_with_the_agent(
    scenario: Scenario,
) -> None:
    """The agent is SIGKILLed. Its Lease expires (the node is unavailable: the operator
    empties its slice), the kubelet deletes the slice 30 s after the plugin went away, the
    operator does not recreate it, and a new pod does not bind to the node. Restarted, the
    agent renews its Lease, the kubelet registers its plugin again, the slice is republished
    and the pod is served."""
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(spares=[{"profile": "2g.20gb", "count": 1}])
    scenario.eventually("the spare published", lambda: len(published(scenario, node)) == 1)
    scenario.cluster.kill_agent(node)
    scenario.eventually(
        "the kubelet wiped the slice", lambda: mig_slice(scenario, node) is None, 120
    )
    scenario.pod("waits", profile_is("2g.20gb"))
    wait_s(5)  # a republished slice or a binding would show by now
    assert mig_slice(scenario, node) is None
    assert scenario.get("pod", "waits", "-n", scenario.namespace)["spec"].get("nodeName") is None
    scenario.cluster.start_agent(node)
    assert scenario.wait_served("waits")[0]["pool"] == node
    assert published(scenario, node) != []


def published(scenario: Scenario, node: str) -> list[str]:
    body = mig_slice(scenario, node)
    return sorted(d["name"] for d in (body or {}).get("spec", {}).get("devices") or [])


def generation(scenario: Scenario, node: str) -> int:
    body = mig_slice(scenario, node)
    return int(body["spec"]["pool"]["generation"]) if body else -1
