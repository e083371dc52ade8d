"""migpart installed as users install it, on a real API server: the Helm chart and the
kustomize manifests, in migpart-system and in other namespaces.

- The rendered chart passes a server-side dry-run apply for several value sets, monitoring
  objects included: the testbed serves no Prometheus Operator, so the real CRDs of its
  ServiceMonitor, PodMonitor and PrometheusRule (tests/fixtures/prometheus-operator) are
  applied first and the dry-run checks the objects against their schemas.
- `helm install --dry-run=server` refuses a values file with a wrong type or an unknown key,
  naming it.
- Installed into another namespace, by a kustomize overlay (`namespace: gpu-system`, alone
  and with the replacements docs/helm.md gives) and by the chart, the admission policy
  still refuses an agent's write to another node's MigNode and Lease, made with the agent's
  own bound token.

The module runs its own control plane: it installs and removes migpart's cluster-scoped
objects (CRDs, ClusterRoles, the admission policy), which the other integration tests share.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from migpart.api.leases import LEASE_NAMESPACE, lease_name
from migpart.api.models import GROUP
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from tests.integration.access import (
    AGENT,
    account_token,
    agent_pod,
    call,
    create_mignode,
    forbidden,
)
from tests.integration.conftest import eventually
from tests.testbeds import running_testbed
from tests.tools import CHART, IMAGE_VALUES, MANIFESTS, ROOT, run

pytestmark = pytest.mark.integration

PROMETHEUS_CRDS = sorted((ROOT / "tests" / "fixtures" / "prometheus-operator").glob("*.yaml"))
MIGPART_CRDS = (f"gpupartitionpolicies.{GROUP}", f"mignodes.{GROUP}")
NODES = ("inst-node-a", "inst-node-b")
DIGEST = "sha256:" + "0f" * 32


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A control plane of its own, with the Prometheus Operator's CRDs and two Nodes."""
    with running_testbed(tmp_path_factory) as testbed:
        for crd in PROMETHEUS_CRDS:
            testbed.kubectl("apply", "--server-side", "-f", str(crd))
        testbed.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        )
        for node in NODES:
            testbed.add_node(node)
        eventually(lambda: "default" in testbed.kubectl("get", "namespaces", "-o", "name"))
        yield testbed


def helm(bed: Testbed, *args: str, check: bool = True) -> str:
    proc = run("helm", "--kubeconfig", str(bed.kubeconfig), *args, check=check)
    return proc.stdout + proc.stderr


def rendered(namespace: str, *values: str) -> str:
    args = ["template", "migpart", str(CHART), "--namespace", namespace, *IMAGE_VALUES]
    return run("helm", *args, f"--kube-version={kube_version()}", *values).stdout


def create_namespace(bed: Testbed, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
        },
    }
    bed.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(body))


# ------------------------------------------------------------------ server-side dry-run


VALUE_SETS = {
    "defaults": ("migpart-system", []),
    "everything-on": (
        "gpu-system",
        [
            "--set",
            "namespace.create=true,metrics.serviceMonitor.enabled=true,"
            "metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true,"
            f"image.digest={DIGEST},image.pullSecrets={{regcred}},"
            "agent.driverRoot=/run/nvidia/driver,agent.runtimeClassName=,"
            "agent.kubeletRootDir=/var/lib/k0s/kubelet,operator.priorityClassName=system-cluster-critical,"
            "networkPolicy.enabled=true,networkPolicy.podSelector.matchLabels.app=prometheus,"
            "agent.updateStrategy.rollingUpdate.maxUnavailable=10%,fullnameOverride=gpu-migpart,"
            "agent.allowPublisherOverlap=true",
        ],
    ),
    "podmonitor-no-crds": (
        "gpu-monitoring",
        [
            "--set",
            "metrics.podMonitor.enabled=true,metrics.services.enabled=false,crds.enabled=false,"
            "deviceClass.enabled=false,admissionPolicy.enabled=false,agent.logLevel=DEBUG",
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_server_side_dry_run_of_the_rendered_chart(bed: Testbed, name: str) -> None:
    namespace, values = VALUE_SETS[name]
    create_namespace(bed, namespace)
    manifest = rendered(namespace, *values)
    out = bed.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=helm",
        "-f",
        "-",
        input=manifest,
    )
    applied = [line for line in out.splitlines() if line.strip()]
    expected = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(applied) == len(expected), out
    assert all("(server dry run)" in line for line in applied), out
    kinds = {d["kind"] for d in expected}
    if name == "everything-on":
        assert {"ServiceMonitor", "PrometheusRule", "ConfigMap", "Namespace"} <= kinds
        assert {"NetworkPolicy", "PodDisruptionBudget"} <= kinds
    if name == "podmonitor-no-crds":
        assert "PodMonitor" in kinds
        assert "CustomResourceDefinition" not in kinds


def test_samples_pass_a_server_side_dry_run_once_the_crds_exist(bed: Testbed) -> None:
    """The samples are custom objects: their dry-run needs migpart's CRDs served."""
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        bed.kubectl("apply", "--server-side", "-f", str(path))
    bed.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c}" for c in MIGPART_CRDS)
    )
    manifest = rendered("migpart-system", "--set", "samples.enabled=true,crds.enabled=false")
    out = bed.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=manifest)
    assert f"gpupartitionpolicy.{GROUP}/inference-pool serverside-applied (server dry run)" in out
    for crd in MIGPART_CRDS:
        bed.kubectl("delete", "crd", crd, "--wait=true")


def test_helm_install_dry_run_refuses_bad_values_naming_them(bed: Testbed, tmp_path: Path) -> None:
    create_namespace(bed, "migpart-system")
    for values, named in (
        ({"agent": {"metricsPort": "8081"}}, "metricsPort"),
        ({"agent": {"kubeletRootdir": "/var/lib/kubelet"}}, "kubeletRootdir"),
    ):
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args = ["install", "migpart", str(CHART), "-n", "migpart-system", "--dry-run=server"]
        message = helm(bed, *args, *IMAGE_VALUES, "-f", str(path), check=False)
        assert named in message, message
        assert "STATUS: pending-install" not in message
    args = ["install", "migpart", str(CHART), "-n", "migpart-system", "--dry-run=server"]
    # the image left at its placeholder: refused at render time, naming the value to set
    message = helm(bed, *args, check=False)
    assert "image.repository" in message, message
    assert "STATUS: pending-install" not in message
    out = helm(bed, *args, *IMAGE_VALUES)
    assert "kind: DaemonSet" in out


# ------------------------------------------------------------------ admission in another namespace


def assert_agents_confined(bed: Testbed, namespace: str, leases: bool = True) -> None:
    """With the bound token of an agent pod on node A in `namespace`: A's own MigNode (and
    with `leases`, Lease) is written, B's is refused by the admission policy."""
    a, b = NODES
    for node in NODES:
        agent_pod(bed, f"agent-{node}", node, namespace=namespace)
    token = account_token(bed, AGENT, f"agent-{a}", namespace=namespace)

    def refused() -> bool:
        code, body = create_mignode(bed, token, b)
        assert code == 403, f"the agent of node {a} in {namespace} wrote MigNode {b}: {body}"
        return True

    # The API server loads a new policy asynchronously: wait until it refuses.
    eventually(refused)
    message = forbidden(create_mignode(bed, token, b))
    assert f"the migpart agent of node {a} may write only MigNode {a}, not {b}" in message
    assert create_mignode(bed, token, a)[0] == 201
    bed.kubectl("delete", "mignode", a, "--ignore-not-found")
    if leases:
        assert_lease_confined(bed, token)
    bed.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0")


def assert_lease_confined(bed: Testbed, token: str) -> None:
    a, b = NODES
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
    other = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease_name(b), "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": a, "leaseDurationSeconds": 40},
    }
    message = forbidden(call(bed, token, "POST", leases, other))
    assert f"may write only Lease {lease_name(a)}, not {lease_name(b)}" in message


# docs/helm.md#another-namespace: the overlay's replacements that keep the Lease Roles and
# RoleBindings in kube-node-lease, from manifests/lease-namespace.yaml (local-config).
LEASE_REPLACEMENTS = yaml.safe_load("""
- source: {kind: ConfigMap, name: migpart-lease-namespace, fieldPath: data.namespace}
  targets:
  - select: {kind: Role}
    reject: [{name: migpart-operator-election}]
    fieldPaths: [metadata.namespace]
  - select: {kind: RoleBinding}
    reject: [{name: migpart-operator-election}]
    fieldPaths: [metadata.namespace]
- source: {kind: Namespace, fieldPath: metadata.name}
  targets:
  - select: {kind: RoleBinding}
    fieldPaths: [subjects.0.namespace]
""")


@pytest.mark.parametrize(
    ("namespace", "keep_leases"),
    [("gpu-system", False), ("gpu-ops", True)],
    ids=["namespace-only", "with-replacements"],
)
def test_kustomize_overlay_in_another_namespace_keeps_agents_confined(
    bed: Testbed, tmp_path: Path, namespace: str, keep_leases: bool
) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [os.path.relpath(MANIFESTS, overlay)],
        **({"replacements": LEASE_REPLACEMENTS} if keep_leases else {}),
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    manifest = run("kustomize", "build", str(overlay)).stdout
    assert "migpart-system" not in manifest
    built = [d for d in yaml.safe_load_all(manifest) if d]
    roles = {
        (d["kind"], d["metadata"]["name"]): d["metadata"]["namespace"]
        for d in built
        if d["kind"] in ("Role", "RoleBinding")
    }
    # the operators' election Lease is in migpart's own namespace, wherever that is
    assert roles.pop(("Role", "migpart-operator-election")) == namespace
    assert roles.pop(("RoleBinding", "migpart-operator-election")) == namespace
    # `namespace:` alone moves the node Lease ones too: the agents could not renew their Leases
    assert set(roles.values()) == ({LEASE_NAMESPACE} if keep_leases else {namespace})
    (tmp_path / "built.yaml").write_text(manifest)
    bed.kubectl("apply", "--server-side", "-f", str(tmp_path / "built.yaml"))
    bed.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{c}" for c in MIGPART_CRDS)
    )
    assert_agents_confined(bed, namespace, leases=keep_leases)
    # Removed as `kubectl delete -k` would; the operator's pod, bound to a Node without a
    # kubelet here, is never confirmed gone, so only the CRDs are waited for.
    bed.kubectl("delete", "-f", str(tmp_path / "built.yaml"), "--wait=false")
    bed.kubectl("delete", "pods", "--all", "-n", namespace, "--force", "--grace-period=0")
    bed.kubectl("wait", "--for=delete", "--timeout=120s", *(f"crd/{c}" for c in MIGPART_CRDS))


def test_chart_in_another_namespace_keeps_agents_confined(bed: Testbed) -> None:
    create_namespace(bed, "gpu-platform")
    helm(bed, "install", "migpart", str(CHART), "-n", "gpu-platform", *IMAGE_VALUES)
    try:
        assert_agents_confined(bed, "gpu-platform")
    finally:
        out = helm(bed, "uninstall", "migpart", "-n", "gpu-platform")
    # The CRDs stay (helm.sh/resource-policy: keep); everything else of the release is gone.
    assert "kept due to the resource policy" in out, out
    for crd in MIGPART_CRDS:
        bed.kubectl("get", "crd", crd)
    assert not bed.kubectl(
        "get", "validatingadmissionpolicies", "--ignore-not-found", "-o", "name"
    ).strip()
    assert not bed.kubectl("get", "deviceclass", DRIVER, "--ignore-not-found").strip()
