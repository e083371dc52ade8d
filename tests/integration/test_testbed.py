"""The testbed itself: a real API server that serves DRA and whose scheduler allocates devices."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from migpart.testbed import Testbed, build
from migpart.testbed.build import kube_version

pytestmark = pytest.mark.integration


def test_api_server_serves_dra_v1(testbed: Testbed) -> None:
    out = testbed.kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "name")
    assert {
        "deviceclasses.resource.k8s.io",
        "resourceclaims.resource.k8s.io",
        "resourceslices.resource.k8s.io",
    } <= set(out.split())
    versions = json.loads(testbed.kubectl("version", "-o", "json"))
    assert versions["serverVersion"]["gitVersion"] == f"v{kube_version()}"


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


def test_extra_user_audit_log_and_component_flags(tmp_path: Path) -> None:
    """The options benchmarks use: a second user, extra API server and scheduler flags."""
    policy = tmp_path / "audit-policy.yaml"
    policy.write_text(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [ResponseStarted, "
        "ResponseComplete, Panic]\nrules:\n- level: Metadata\n  users: [bench]\n- level: None\n"
    )
    audit = tmp_path / "audit.log"
    bed = Testbed(
        tmp_path / "tb",
        binary=build(quiet=True),
        users={"bench": "bench-token"},
        apiserver_args=[f"--audit-policy-file={policy}", f"--audit-log-path={audit}"],
        scheduler_args=["--kube-api-qps=100"],
    )
    with bed.running():
        assert set(bed.pids()) == {
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kube-controller-manager",
        }
        assert set(bed.ports) == {"kube-apiserver", "kube-scheduler", "kube-controller-manager"}
        kubeconfig = bed.kubeconfig_for("bench", tmp_path / "bench.kubeconfig")
        out = subprocess.run(
            [str(bed.binary), "kubectl", "--kubeconfig", str(kubeconfig), "auth", "whoami"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "bench" in out
        entries = [json.loads(line) for line in audit.read_text().splitlines()]
        assert entries
        assert {e["user"]["username"] for e in entries} == {"bench"}


@pytest.mark.parametrize("component", ["etcd", "kube-apiserver"])
def test_a_component_restarts_with_its_data(tmp_path: Path, component: str) -> None:
    """What the chaos harness does to the control plane: a crash, then the same component
    with the same data (an object written before is still there)."""
    bed = Testbed(tmp_path / "bed")
    with bed.running():
        bed.kubectl("create", "namespace", "survives")
        bed.restart(component, down_s=1.0)
        assert "survives" in bed.kubectl("get", "namespace", "survives", "-o", "name")
        bed.check_alive()
