"""The deployment manifests agree with the code (the Dockerfile and the docs: in
test_dockerfile_and_docs.py).

What a cluster runs is only as right as these files: a flag the parser rejects crash-loops the
pod, a verb missing from RBAC fails at the first API call, a verb too many is a privilege nobody
needs. So the containers' arguments go through the real argparse parsers, and each
ServiceAccount's permissions must equal a table of the API calls the code makes (read from
migpart.controller, migpart.kube and migpart.agent; keep the tables in step with them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from migpart.api.leases import LEASE_NAMESPACE
from migpart.api.models import GROUP, VERSION
from migpart.api.selectors import MANAGED_LABEL, LabelSelector
from migpart.commands import agent as agent_command
from migpart.slices.dra import DRIVER
from tests.commands import PARSERS, parse
from tests.tools import ROOT

MANIFESTS = ROOT / "manifests"
NAMESPACE = "migpart-system"
OPERATOR_SA = "migpart-operator"
AGENT_SA = "migpart-agent"

Doc = dict[str, Any]

KNOWN_KINDS = {
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),  # lease-namespace.yaml: local-config, for overlays
    ("v1", "Pod"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("resource.k8s.io/v1", "DeviceClass"),
    ("resource.k8s.io/v1", "ResourceClaim"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"),
    (f"{GROUP}/{VERSION}", "GpuPartitionPolicy"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}

# What `kubectl apply -k manifests` must create (samples are applied on purpose, never by it).
INSTALLED_KINDS = {
    "Namespace": 1,
    "CustomResourceDefinition": 2,
    "DeviceClass": 1,
    "ServiceAccount": 2,
    "ClusterRole": 2,
    "ClusterRoleBinding": 2,
    "Role": 3,  # the node Leases, in kube-node-lease; the election Lease
    "RoleBinding": 3,
    "Deployment": 1,
    "DaemonSet": 1,
    "PodDisruptionBudget": 1,  # the operator's
    "Service": 2,  # the operator's and the agents' metrics
    "ValidatingAdmissionPolicy": 1,
    "ValidatingAdmissionPolicyBinding": 1,
}

# (apiGroup, resource, verb) for every API call of the operator, with where it comes from.
OPERATOR_NEEDS = {
    # watched index claims_index (kube/watch.py); list_claims_quorum (destroy protocol)
    ("resource.k8s.io", "resourceclaims", "list"),
    ("resource.k8s.io", "resourceclaims", "watch"),
    # watched indexes waiting_index, nodes_index, classes_index (controller/watching/indexes.py)
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("resource.k8s.io", "deviceclasses", "list"),
    ("resource.k8s.io", "deviceclasses", "watch"),
    # kube/slice_watch.py watch_slices (own watch); kube/slice_publisher.py SlicePublisher
    # _read / create / replace
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("resource.k8s.io", "resourceslices", "get"),
    ("resource.k8s.io", "resourceslices", "create"),
    ("resource.k8s.io", "resourceslices", "update"),
    ("resource.k8s.io", "resourceslices", "delete"),  # a shrinking pool (offer mode)
    # kopf index and event handler; patch_policy_status
    (GROUP, "gpupartitionpolicies", "list"),
    (GROUP, "gpupartitionpolicies", "watch"),
    (GROUP, "gpupartitionpolicies/status", "patch"),
    # kopf index, event handler; patch_mignode_spec
    (GROUP, "mignodes", "list"),
    (GROUP, "mignodes", "watch"),
    (GROUP, "mignodes", "patch"),
    # kube/objects.py patch_mignode_conditions (the Stale condition); kube/leases.py watch
    (GROUP, "mignodes/status", "patch"),
    ("coordination.k8s.io", "leases", "list"),
    ("coordination.k8s.io", "leases", "watch"),
    # kube/election_lease.py KubeLeaseStore: the election Lease
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    # kube/events.py post_event (Repartitioning, DryRunPlan, DestroyAborted, RoundFailed, ...)
    ("", "events", "create"),
    # kopf's resource observer
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}

AGENT_NEEDS = {
    ("", "nodes", "get"),  # KubeMigNodes._owner
    (GROUP, "mignodes", "get"),  # KubeMigNodes.ensure
    (GROUP, "mignodes", "create"),
    (GROUP, "mignodes", "list"),  # KubeMigNodes.specs (watch by field selector)
    (GROUP, "mignodes", "watch"),
    (GROUP, "mignodes/status", "patch"),  # KubeMigNodes.write_status
    ("resource.k8s.io", "resourceclaims", "get"),  # KubeClaims.allocation
    # agent/publishers.py KubePublishers.overlap: NVIDIA's DRA driver's slices of the node
    ("resource.k8s.io", "resourceslices", "list"),
    ("coordination.k8s.io", "leases", "get"),  # NodeLease.renew
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "update"),
    ("", "events", "create"),  # KubeMigNodes.warn (SpecRefused)
}


def yaml_files() -> list[Path]:
    """The kustomize manifests (the Helm chart's templates are checked in test_chart*.py)."""
    return sorted(
        p for p in MANIFESTS.rglob("*.yaml") if "helm" not in p.relative_to(MANIFESTS).parts
    )


def load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def installed_files() -> list[Path]:
    """The files `kubectl apply -k manifests` reads, following nested kustomizations."""

    def walk(directory: Path) -> Iterator[Path]:
        kustomization = load(directory / "kustomization.yaml")[0]
        for entry in kustomization.get("resources", []):
            target = directory / entry
            if target.is_dir():
                yield from walk(target)
            else:
                yield target

    return sorted(walk(MANIFESTS))


def local_config(doc: Doc) -> bool:
    """kustomize reads it (replacements) and leaves it out of what it builds."""
    annotations = doc["metadata"].get("annotations", {})
    return bool(annotations.get("config.kubernetes.io/local-config") == "true")


def installed() -> list[Doc]:
    return [doc for path in installed_files() for doc in load(path) if not local_config(doc)]


def of_kind(kind: str, docs: list[Doc] | None = None) -> list[Doc]:
    return [d for d in (installed() if docs is None else docs) if d["kind"] == kind]


def workload(kind: str) -> Doc:
    (found,) = of_kind(kind)
    return found


def pod_spec(obj: Doc) -> Doc:
    spec: Doc = obj["spec"]["template"]["spec"]
    return spec


def containers(obj: Doc) -> list[Doc]:
    spec = pod_spec(obj)
    return [*spec.get("initContainers", []), *spec["containers"]]


def migpart_command(container: Doc) -> tuple[str, list[str]]:
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[:1] == ["migpart"], f"container {container['name']} runs {argv}"
    assert len(argv) > 1, f"container {container['name']} runs {argv}"
    assert argv[1] in PARSERS, f"container {container['name']} runs {argv}"
    return argv[1], argv[2:]


def granted(account: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the ServiceAccount gets through every binding."""
    docs = installed()
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    out: set[tuple[str, str, str]] = set()
    for binding in docs:
        if not binding["kind"].endswith("RoleBinding"):
            continue
        subjects = binding.get("subjects", [])
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == NAMESPACE
            for s in subjects
        ):
            continue
        ref = binding["roleRef"]
        role = roles[(ref["kind"], ref["name"])]
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule.get("verbs", []):
                        out.add((group, resource, verb))
    return out


# ------------------------------------------------------------------ files and kinds


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_every_document_has_a_known_kind(path: Path) -> None:
    docs = load(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        assert (doc.get("apiVersion"), doc.get("kind")) in KNOWN_KINDS, (path, doc.get("kind"))
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], path


@pytest.mark.parametrize(
    "path",
    sorted(MANIFESTS.rglob("kustomization.yaml")),
    ids=lambda p: str(p.relative_to(MANIFESTS)),
)
def test_kustomization_lists_files_that_exist(path: Path) -> None:
    for entry in load(path)[0]["resources"]:
        target = path.parent / entry
        assert target.is_file() or (target / "kustomization.yaml").is_file(), (path, entry)


def test_kustomization_installs_everything_but_samples() -> None:
    files = set(installed_files())
    left_out = {
        p
        for p in yaml_files()
        if p not in files and p.name != "kustomization.yaml" and "samples" not in p.parts
    }
    assert not left_out, f"manifests not in any kustomization: {sorted(map(str, left_out))}"
    assert not [p for p in files if "samples" in p.parts]
    counts: dict[str, int] = {}
    for doc in installed():
        counts[doc["kind"]] = counts.get(doc["kind"], 0) + 1
    assert counts == INSTALLED_KINDS


def test_namespaced_objects_live_in_migpart_system() -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in installed():
        if doc["kind"] in ("Role", "RoleBinding") and "election" not in doc["metadata"]["name"]:
            # the node Leases' namespace (the election Lease is in the operator's own)
            assert doc["metadata"].get("namespace") == LEASE_NAMESPACE, doc["metadata"]["name"]
        elif doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]
    (namespace,) = of_kind("Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    # the agent is privileged: Pod Security Admission must admit it
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


# ------------------------------------------------------------------ containers


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_containers_run_migpart_with_flags_the_parser_accepts(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-from-downward-api")
    for container in containers(workload(kind)):
        command, argv = migpart_command(container)
        args = parse(command, argv)
        if command == "agent":
            agent_command.config_from(args)  # raises when the node name is missing


def test_images_are_the_kustomization_image() -> None:
    (kustomization,) = load(MANIFESTS / "kustomization.yaml")
    names = {image["name"] for image in kustomization["images"]}
    for kind in ("Deployment", "DaemonSet"):
        for container in containers(workload(kind)):
            name, _, tag = container["image"].partition(":")
            assert name in names, container["image"]
            assert tag, container["image"]
            assert tag != "latest", container["image"]


@pytest.mark.parametrize(("kind", "command"), [("Deployment", "operator"), ("DaemonSet", "agent")])
def test_probes_use_the_health_server(kind: str, command: str) -> None:
    (container,) = workload(kind)["spec"]["template"]["spec"]["containers"]
    _, argv = migpart_command(container)
    port = parse(command, argv).metrics_port
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http = container[probe]["httpGet"]
        assert http["path"] == path
        assert ports.get(http["port"], http["port"]) == port


def test_operator_runs_two_elected_replicas_as_non_root() -> None:
    deployment = workload("Deployment")
    assert deployment["spec"]["replicas"] == 2
    # leader election: a rollout may run two operators at once, only the leader writes
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    spec = pod_spec(deployment)
    assert spec["serviceAccountName"] == OPERATOR_SA
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    (container,) = spec["containers"]
    _, argv = migpart_command(container)
    args = parse("operator", argv)
    assert args.leader_elect is True
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert not security.get("privileged", False)
    assert "add" not in security["capabilities"]
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]


def test_agent_runs_on_opted_in_nodes_with_its_node_name() -> None:
    daemonset = workload("DaemonSet")
    spec = pod_spec(daemonset)
    assert spec["serviceAccountName"] == AGENT_SA
    assert spec["nodeSelector"] == {MANAGED_LABEL: "true"}
    (container,) = spec["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["securityContext"]["privileged"] is True  # NVML creates MIG instances
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]


def test_operator_publishes_on_the_nodes_the_agents_run_on() -> None:
    """--node-selector is the agent's nodeSelector: no agent without devices, or the reverse."""
    (container,) = pod_spec(workload("Deployment"))["containers"]
    selector: LabelSelector = parse("operator", migpart_command(container)[1]).node_selector
    assert selector == LabelSelector(match_labels=pod_spec(workload("DaemonSet"))["nodeSelector"])


def test_operator_replicas_spread_and_survive_drains() -> None:
    deployment = workload("Deployment")
    spec = pod_spec(deployment)
    assert spec["priorityClassName"] == "system-cluster-critical"
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = deployment["spec"]["selector"]
    assert term["podAffinityTerm"]["labelSelector"] == selector
    (budget,) = of_kind("PodDisruptionBudget")
    assert budget["spec"]["selector"] == selector
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    ("dest", "host_path"),
    [
        ("state_dir", "/var/lib/migpart"),
        ("cdi_dir", "/var/run/cdi"),
        ("plugin_dir", f"/var/lib/kubelet/plugins/{DRIVER}"),
        ("registration_dir", "/var/lib/kubelet/plugins_registry"),
    ],
)
def test_agent_directories_are_the_hosts(dest: str, host_path: str) -> None:
    """kubelet and the container runtime look for the sockets and CDI files on the host: each
    directory flag must name a hostPath mounted at the same path."""
    spec = pod_spec(workload("DaemonSet"))
    (container,) = spec["containers"]
    _, argv = migpart_command(container)
    assert str(getattr(parse("agent", argv), dest)) == host_path
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == host_path]
    assert len(mounts) == 1, f"{host_path} is not mounted"
    assert volumes[mounts[0]["name"]]["hostPath"]["path"] == host_path


def test_only_the_agent_is_privileged() -> None:
    for doc in installed():
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for container in containers(doc):
            privileged = container.get("securityContext", {}).get("privileged", False)
            assert privileged == (doc["kind"] == "DaemonSet"), container["name"]


# ------------------------------------------------------------------ RBAC


@pytest.mark.parametrize(
    ("account", "needs"), [(OPERATOR_SA, OPERATOR_NEEDS), (AGENT_SA, AGENT_NEEDS)]
)
def test_rbac_grants_exactly_what_the_code_calls(
    account: str, needs: set[tuple[str, str, str]]
) -> None:
    have = granted(account)
    assert sorted(needs - have) == [], "missing"
    assert sorted(have - needs) == [], "granted but never used"


def test_rbac_has_no_wildcards_and_no_secrets() -> None:
    for role in of_kind("ClusterRole") + of_kind("Role", installed()):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
            assert "secrets" not in rule.get("resources", [])


def test_service_accounts_are_separate() -> None:
    names = {sa["metadata"]["name"] for sa in of_kind("ServiceAccount")}
    assert names == {OPERATOR_SA, AGENT_SA}


def test_admission_policy_matches_the_agents_service_account_in_any_namespace() -> None:
    """The policy's match condition is the agent's user name in whichever namespace it runs: a
    namespace written into the policy is one that an overlay (`namespace: gpu-system`) leaves
    behind, silently switching the policy off (tests/integration/test_install.py checks it on
    a real API server). CEL's matches() is RE2; the pattern is anchored, as Python reads it."""
    (policy,) = of_kind("ValidatingAdmissionPolicy")
    (binding,) = of_kind("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (condition,) = policy["spec"]["matchConditions"]
    found = re.fullmatch(r'request\.userInfo\.username\.matches\("(.+)"\)', condition["expression"])
    assert found, condition["expression"]
    pattern = found.group(1)
    assert NAMESPACE not in pattern
    for namespace in (NAMESPACE, "gpu-system"):
        assert re.search(pattern, f"system:serviceaccount:{namespace}:{AGENT_SA}")
    for user in (
        f"system:serviceaccount:{NAMESPACE}:{OPERATOR_SA}",
        f"system:serviceaccount:{NAMESPACE}:x-{AGENT_SA}",
        f"system:serviceaccount:{NAMESPACE}:{AGENT_SA}-x",
        f"{AGENT_SA}",
    ):
        assert not re.search(pattern, user), user
