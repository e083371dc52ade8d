"""What removing migpart does to a cluster that uses it (docs/deploy.md#uninstall).

migpart is installed from the rendered chart (default values), its operator and an agent run
(as processes: the testbed's container runtime runs none), and a pod is served a MIG device.
Then migpart is removed the way `helm uninstall` removes it: the operator and the agent stop
(SIGTERM, as deleting their Deployment and DaemonSet does), every object of the release is
deleted except the CRDs, which the chart keeps. Last, the CRDs are deleted too, as
`kubectl delete -k manifests/` does. What each step leaves is what the docs say.

The module has its own control plane: it deletes migpart's CRDs and DeviceClass, which the
other e2e tests share.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from migpart.api.models import GROUP
from migpart.demo.cluster import LocalCluster
from migpart.slices.dra import DRIVER
from migpart.testbed.build import kube_version
from migpart.testing.builders import profile_is
from tests.e2e.conftest import H100, InvariantMonitor, Scenario, wait_s
from tests.e2e.helpers import instances, mig_slice
from tests.testbeds import running_testbed
from tests.tools import CHART, IMAGE_VALUES, run

pytestmark = pytest.mark.e2e

NAMESPACE = "migpart-system"
CRDS = (f"crd/gpupartitionpolicies.{GROUP}", f"crd/mignodes.{GROUP}")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    """A control plane of its own with migpart installed from the chart, its operator running,
    and a namespace for the workload."""
    with running_testbed(tmp_path_factory) as bed:
        # short names: kubelet's plugin sockets live below this directory (107-byte limit)
        local = LocalCluster(bed, tmp_path_factory.mktemp("un"))
        try:
            yield Scenario(local, "workload", "un", InvariantMonitor(bed))
        finally:
            local.stop()


def release_objects() -> list[dict[str, Any]]:
    """The objects `helm install` creates with default values."""
    args = ["template", "migpart", str(CHART), "--namespace", NAMESPACE, *IMAGE_VALUES]
    out = run("helm", *args, f"--kube-version={kube_version()}").stdout
    return [d for d in yaml.safe_load_all(out) if d]


def apply_list(scenario: Scenario, docs: list[dict[str, Any]], *verb: str) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    scenario.tb.kubectl(*verb, "-f", "-", input=body)


def test_uninstall_leaves_running_pods_their_devices(scenario: Scenario) -> None:
    tb = scenario.tb
    tb.kubectl("create", "namespace", NAMESPACE)
    tb.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
    objects = release_objects()
    apply_list(scenario, objects, "apply", "--server-side")
    tb.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRDS)
    scenario.cluster.start_operator()
    tb.kubectl("create", "namespace", scenario.namespace)
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("served", profile_is("3g.40gb"))
    devices = scenario.wait_served("served")
    assert (0, "3g.40gb", "Prepared") in instances(scenario, node)

    # helm uninstall: the workloads' containers stop, then the release's objects go, CRDs kept
    scenario.cluster.stop_operator()
    scenario.cluster.stop_agent(node)
    kept = [d for d in objects if d["kind"] == "CustomResourceDefinition"]
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in kept)
    removed = [d for d in objects if d not in kept]
    apply_list(scenario, removed, "delete", "--wait=true", "--timeout=120s")

    # The running pod keeps its device: its claim stays allocated, nothing destroys the instance.
    assert scenario.phase("served") == "Running"
    assert scenario.allocated("served") == devices
    # The DeviceClass is gone; the MigNode stays with its last status (its CRD is kept).
    assert not tb.kubectl("get", "deviceclass", DRIVER, "--ignore-not-found").strip()
    assert (0, "3g.40gb", "Prepared") in instances(scenario, node)
    assert tb.kubectl("get", "gpupartitionpolicy", scenario.pool, "-o", "name").strip()
    # The kubelet deletes the node's slice once the plugin is gone; nobody publishes it again.
    scenario.eventually("the kubelet wiped the slice", lambda: mig_slice(scenario, node) is None)

    # A new claim of the DeviceClass cannot be allocated: the pod waits.
    scenario.pod("after", profile_is("1g.10gb"))
    wait_s(5)  # a binding would show by now
    assert scenario.get("pod", "after", "-n", scenario.namespace)["spec"].get("nodeName") is None

    # The CRDs too (kubectl delete -k manifests/, or removing the kept CRDs by hand): every
    # policy and MigNode goes with them. The running pod still keeps its device.
    tb.kubectl("delete", *CRDS, "--wait=true", "--timeout=120s")
    assert not tb.kubectl("get", "crd", "-o", "name").count(GROUP)
    assert scenario.phase("served") == "Running"
    assert scenario.allocated("served") == devices

    # The pod ends after migpart is gone. It is deleted and so is its claim, but with no DRA
    # plugin to call, the kubelet cannot unprepare the claim ("DRA driver mig.migpart.io is
    # not registered" in its log): the claim's CDI spec and checkpoint entry stay on the node.
    pod = scenario.get("pod", "served", "-n", scenario.namespace)
    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    scenario.finish("served")
    for kind, name in (("pod", "served"), ("resourceclaim", claim)):
        scenario.eventually(f"{kind} {name} deleted", lambda k=kind, n=name: gone(scenario, k, n))
    node_dir = scenario.cluster.nodes[node].dir
    assert list((node_dir / "cdi").glob(f"{DRIVER}-*.json"))
    assert json.loads((node_dir / "state" / "checkpoint.json").read_text())["claims"]
    # The GPU (the simulator's NVML, saved where the agent left it) still has the instance.
    gpu = json.loads((node_dir / "state" / "simulated-nvml.json").read_text())["0"]
    assert [i["profile"] for i in gpu] == ["3g.40gb"]


def gone(scenario: Scenario, kind: str, name: str) -> bool:
    args = ("get", kind, name, "-n", scenario.namespace, "--ignore-not-found")
    return not scenario.tb.kubectl(*args).strip()
