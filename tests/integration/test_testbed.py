"""The testbed itself: a real API server that serves DRA and whose scheduler allocates devices."""

from __future__ import annotations

import json
import time

import pytest

from migpart.testbed import Testbed

pytestmark = pytest.mark.integration


def test_api_server_serves_dra_v1(testbed: Testbed) -> None:
    out = testbed.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name")
    assert {
        "deviceclasses.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
        "resourceslices.resource.k8s.io",
    } <= set(out.split())
    assert "v1.34" in testbed.kubectl("version", "-o", "json")


def test_added_node_is_ready_and_untainted(testbed: Testbed) -> None:
    testbed.add_node("testbed-node-a", {"pool": "t"})
    testbed.add_node("testbed-node-a", {"pool": "t"})  # idempotent
    node = json.loads(testbed.kubectl("get", "node", "testbed-node-a", "-o", "json"))
    assert node["metadata"]["labels"]["pool"] == "t"
    assert not node["spec"].get("taints")
    ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"]


def test_kubeconfig_written_and_components_alive(testbed: Testbed) -> None:
    assert testbed.kubeconfig.exists()
    testbed.check_alive()
    deadline = time.monotonic() + 60
    while "default" not in testbed.kubectl("get", "namespaces", "-o", "name"):
        assert time.monotonic() < deadline, "namespace default never appeared"
        time.sleep(0.5)
