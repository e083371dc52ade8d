"""The testbed's real kubelets: what every other e2e test stands on."""

from __future__ import annotations

from pathlib import Path

import pytest

from migpart.testbed.build import kube_version
from tests.e2e.conftest import H100, Scenario
from tests.e2e.test_e2e import by_profile, instances

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
    assert body["metadata"]["labels"]["migpart.io/pool"] == scenario.pool
    assert not body["spec"].get("taints")
    assert [c["status"] for c in body["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    # the kubelet's sysctls and its root dir's bind mount stay in its own mount namespace
    assert [p.read_text() for p in HOST_SETTINGS] == before
    sim = scenario.cluster.nodes[node]
    assert mounts_under(sim.dir) == []
    scenario.cluster.remove_gpu_node(node)
    scenario.nodes.remove(node)
    assert mounts_under(sim.dir) == []


def test_a_running_pod_keeps_its_device_across_a_kubelet_restart(scenario: Scenario) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("steady", by_profile("1g.10gb"))
    devices = scenario.wait_served("steady")
    kubelet = scenario.cluster.nodes[node].kubelet
    created = len(kubelet.created_containers())
    kubelet.stop_kubelet()
    kubelet.start_kubelet()
    assert scenario.phase("steady") == "Running"
    assert scenario.allocated("steady") == devices
    assert instances(scenario, node, "Prepared") == [(0, "1g.10gb", "Prepared")]
    # the kubelet found the running container in the runtime: it created none again
    assert len(kubelet.created_containers()) == created
