"""The Helm chart's values for running migpart on a real cluster (`helm template`): opt-in
nodes, disruption budget and spread of the operator, the agents' rollout, NetworkPolicies,
object and ServiceAccount names, pod labels, the image placeholder and NOTES.txt.

The containers' arguments go through migpart's own parsers, as in test_chart_values.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from migpart.api.selectors import parse_node_selector
from tests.chart import Doc, args, one, pod_spec, render, with_values
from tests.tools import CHART, IMAGE_VALUES, ROOT, run

KUBE_VERSION = "--kube-version=1.34.4"
PLACEHOLDER_MESSAGE = (
    "image.repository is left at its placeholder REGISTRY/migpart: push the image to your "
    "registry (docs/install.md) and set image.repository"
)
# Named after migpart's own objects whatever the overrides: one per cluster, or the samples'.
FIXED_NAMES = {"CustomResourceDefinition", "DeviceClass", "Namespace"}


def labels(docs: list[Doc], kind: str) -> dict[str, str]:
    found: dict[str, str] = one(docs, kind)["spec"]["template"]["metadata"]["labels"]
    return found


def selects(selector: dict[str, str], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------ image placeholder


@pytest.mark.parametrize(
    "command",
    [
        ["template", "migpart", str(CHART), KUBE_VERSION],
        ["install", "migpart", str(CHART), "--dry-run=client"],
    ],
    ids=["template", "install"],
)
def test_placeholder_image_is_refused_saying_what_to_do(command: list[str]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "REGISTRY/migpart"
    proc = run("helm", *command, check=False)
    assert proc.returncode != 0
    assert PLACEHOLDER_MESSAGE in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (ROOT / "docs" / "install.md").is_file()


# ------------------------------------------------------------------ opt-in nodes


@pytest.mark.parametrize(
    ("node_selector", "flag"),
    [
        (None, "migpart.io/managed=true"),
        ({"pool": "gpu", "migpart.io/managed": None}, "pool=gpu"),
        (
            {"z.example.com/b": "1", "a.example.com/a": ""},
            "a.example.com/a=,migpart.io/managed=true,z.example.com/b=1",
        ),
        ({"migpart.io/managed": None}, ""),
    ],
    ids=["default", "replaced", "sorted", "every-node"],
)
def test_operator_selects_the_nodes_the_agents_run_on(
    node_selector: Doc | None, flag: str, tmp_path: Path
) -> None:
    values = {} if node_selector is None else {"agent": {"nodeSelector": node_selector}}
    docs = with_values(tmp_path, values)
    operator = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert f"--node-selector={flag}" in operator["args"]
    agent_selector = pod_spec(docs, "DaemonSet").get("nodeSelector", {})
    selector = args(docs, "Deployment").node_selector
    assert selector == parse_node_selector(flag)
    assert selector.matches(agent_selector)
    assert selector.match_labels == agent_selector


def test_publisher_overlap_is_refused_unless_allowed(tmp_path: Path) -> None:
    assert args(render(), "DaemonSet").allow_publisher_overlap is False
    docs = with_values(tmp_path, {"agent": {"allowPublisherOverlap": True}})
    assert args(docs, "DaemonSet").allow_publisher_overlap is True


# ------------------------------------------------------------------ the operator's availability


def budgets(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] == "PodDisruptionBudget"]


@pytest.mark.parametrize(
    ("budget", "replicas", "spec"),
    [
        ({}, 2, {"maxUnavailable": 1}),
        ({"maxUnavailable": "50%"}, 3, {"maxUnavailable": "50%"}),
        ({"minAvailable": 1}, 2, {"minAvailable": 1}),
        ({}, 1, None),
        ({"enabled": False}, 2, None),
    ],
    ids=["default", "percent", "min-available", "one-replica", "off"],
)
def test_operator_disruption_budget(
    budget: Doc, replicas: int, spec: Doc | None, tmp_path: Path
) -> None:
    values = {"operator": {"replicas": replicas, "podDisruptionBudget": budget}}
    docs = with_values(tmp_path, values)
    if spec is None:
        assert budgets(docs) == []
        return
    (pdb,) = budgets(docs)
    assert pdb["metadata"]["name"] == "migpart-operator"
    deployment = one(docs, "Deployment")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert {k: pdb["spec"][k] for k in ("maxUnavailable", "minAvailable") if k in pdb["spec"]} == (
        spec
    )
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_operator_replicas_prefer_distinct_nodes_unless_affinity_is_given(tmp_path: Path) -> None:
    docs = render()
    affinity = pod_spec(docs, "Deployment")["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert "affinity" not in pod_spec(docs, "DaemonSet")
    given: Doc = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    docs = with_values(tmp_path, {"operator": {"affinity": given}})
    assert pod_spec(docs, "Deployment")["affinity"] == given


def test_priority_classes(tmp_path: Path) -> None:
    docs = render()
    assert pod_spec(docs, "Deployment")["priorityClassName"] == "system-cluster-critical"
    assert pod_spec(docs, "DaemonSet")["priorityClassName"] == "system-node-critical"
    docs = with_values(tmp_path, {"operator": {"priorityClassName": ""}})
    assert "priorityClassName" not in pod_spec(docs, "Deployment")


# ------------------------------------------------------------------ the agents' rollout


@pytest.mark.parametrize(
    ("strategy", "rendered"),
    [
        ({}, {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}),
        (
            {"rollingUpdate": {"maxUnavailable": "10%"}},
            {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
        ),
        ({"type": "OnDelete"}, {"type": "OnDelete"}),
    ],
    ids=["default", "percent", "on-delete"],
)
def test_agent_update_strategy(strategy: Doc, rendered: Doc, tmp_path: Path) -> None:
    docs = with_values(tmp_path, {"agent": {"updateStrategy": strategy}})
    assert one(docs, "DaemonSet")["spec"]["updateStrategy"] == rendered


def test_agent_update_strategy_has_no_surge(tmp_path: Path) -> None:
    """Two agents on one node would both drive NVML and serve the plugin socket."""
    path = tmp_path / "values.yaml"
    values = {"agent": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1}}}}
    path.write_text(yaml.safe_dump(values))
    cmd = ["template", "migpart", str(CHART), KUBE_VERSION, *IMAGE_VALUES, "-f", str(path)]
    proc = run("helm", *cmd, check=False)
    assert proc.returncode != 0
    assert "maxSurge" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ NetworkPolicy


def test_network_policy_is_off_by_default() -> None:
    assert not [d for d in render() if d["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(
    "peer",
    [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
        },
    ],
    ids=["namespaces", "pods", "both"],
)
def test_network_policy_admits_the_scrapers_to_the_metrics_ports(peer: Doc, tmp_path: Path) -> None:
    values = {
        "networkPolicy": {"enabled": True, **peer},
        "operator": {"metricsPort": 9400},
    }
    docs = with_values(tmp_path, values, namespace="gpu-system")
    found = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    assert sorted(found) == ["migpart-agent-metrics", "migpart-operator-metrics"]
    for kind, component, port in (("Deployment", "operator", 9400), ("DaemonSet", "agent", 8081)):
        policy = found[f"migpart-{component}-metrics"]
        assert policy["metadata"]["namespace"] == "gpu-system"
        assert selects(policy["spec"]["podSelector"]["matchLabels"], labels(docs, kind))
        other = "DaemonSet" if kind == "Deployment" else "Deployment"
        assert not selects(policy["spec"]["podSelector"]["matchLabels"], labels(docs, other))
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"] == [
            {"from": [peer], "ports": [{"port": port, "protocol": "TCP"}]}
        ]


def test_network_policy_without_a_peer_fails_saying_why(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"enabled": True}}))
    cmd = ["template", "migpart", str(CHART), KUBE_VERSION, *IMAGE_VALUES, "-f", str(path)]
    proc = run("helm", *cmd, check=False)
    assert proc.returncode != 0
    assert "networkPolicy.enabled needs networkPolicy.namespaceSelector" in proc.stderr


# ------------------------------------------------------------------ names


def names(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] not in FIXED_NAMES}


def everything(tmp_path: Path, **values: Any) -> list[Doc]:
    on = {
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
        },
        "networkPolicy": {"enabled": True, "podSelector": {"matchLabels": {"a": "b"}}},
    }
    return with_values(tmp_path, {**on, **values})


def test_default_names_do_not_depend_on_the_release_name(tmp_path: Path) -> None:
    default = names(everything(tmp_path))
    assert all(name.startswith("migpart") for _, name in default)
    assert ("Deployment", "migpart-operator") in default
    assert ("DaemonSet", "migpart-agent") in default
    out = run("helm", "template", "gpu", str(CHART), KUBE_VERSION, *IMAGE_VALUES).stdout
    assert names([d for d in yaml.safe_load_all(out) if d]) == names(render())


@pytest.mark.parametrize(
    ("values", "prefix", "name_label"),
    [
        ({"fullnameOverride": "mig"}, "mig", "migpart"),
        ({"nameOverride": "gpu-parts"}, "gpu-parts", "gpu-parts"),
        ({"nameOverride": "gpu-parts", "fullnameOverride": "mig"}, "mig", "gpu-parts"),
    ],
    ids=["fullname", "name", "both"],
)
def test_name_overrides_rename_every_object_consistently(
    values: Doc, prefix: str, name_label: str, tmp_path: Path
) -> None:
    default = everything(tmp_path)
    docs = everything(tmp_path, **values)
    want = {(kind, prefix + name.removeprefix("migpart")) for kind, name in names(default)}
    assert names(docs) == want
    for doc in docs:
        if doc["kind"] not in FIXED_NAMES:
            assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == name_label, doc["kind"]
    assert_wired(docs, f"{prefix}-operator", f"{prefix}-agent")


def assert_wired(docs: list[Doc], operator_account: str, agent_account: str) -> None:
    """Pods run as the accounts the bindings name, Services and policies select the pods,
    the admission policy matches the agent's account, every roleRef and policyName exists."""
    for kind, account in (("Deployment", operator_account), ("DaemonSet", agent_account)):
        assert pod_spec(docs, kind)["serviceAccountName"] == account
        workload = one(docs, kind)
        assert selects(workload["spec"]["selector"]["matchLabels"], labels(docs, kind))
    objects = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for binding in [d for d in docs if d["kind"].endswith("RoleBinding")]:
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in objects
        (subject,) = binding["subjects"]
        assert subject["name"] in (operator_account, agent_account)
        component = binding["metadata"]["labels"]["app.kubernetes.io/component"]
        assert subject["name"] == (operator_account if component == "operator" else agent_account)
    for service in [d for d in docs if d["kind"] == "Service"]:
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        kind = "Deployment" if component == "operator" else "DaemonSet"
        assert selects(service["spec"]["selector"], labels(docs, kind))
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert ("ValidatingAdmissionPolicy", binding["spec"]["policyName"]) in objects
    (condition,) = one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    pattern = re.search(r'matches\("(.*)"\)', condition["expression"])
    assert pattern is not None, condition["expression"]
    user = "system:serviceaccount:{}:{}"
    assert re.search(pattern.group(1), user.format("migpart-system", agent_account))
    assert not re.search(pattern.group(1), user.format("migpart-system", operator_account))
    assert not re.search(pattern.group(1), user.format("migpart-system", agent_account + "x"))


@pytest.mark.parametrize("create", [True, False])
def test_service_accounts_named_or_brought(create: bool, tmp_path: Path) -> None:
    accounts = {"operator": "gpu.operator", "agent": "gpu.agent"}
    values = {
        component: {"serviceAccount": {"create": create, "name": name, "annotations": {"a": "b"}}}
        for component, name in accounts.items()
    }
    docs = with_values(tmp_path, values)
    created = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    assert sorted(created) == (sorted(accounts.values()) if create else [])
    for account in created.values():
        assert account["metadata"]["annotations"] == {"a": "b"}
    assert_wired(docs, accounts["operator"], accounts["agent"])
    # "gpu.agent" as a pattern would match "gpu-agent" too
    (condition,) = one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    pattern = re.search(r'matches\("(.*)"\)', condition["expression"])
    assert pattern is not None
    assert not re.search(pattern.group(1), "system:serviceaccount:ns:gpu-agent")


def test_default_wiring() -> None:
    assert_wired(render(), "migpart-operator", "migpart-agent")


# ------------------------------------------------------------------ pod labels


@pytest.mark.parametrize(
    ("component", "kind"), [("operator", "Deployment"), ("agent", "DaemonSet")]
)
def test_pod_labels_are_added_and_never_replace_the_charts(
    component: str, kind: str, tmp_path: Path
) -> None:
    extra = {"team": "platform", "app.kubernetes.io/component": "mine"}
    docs = with_values(tmp_path, {component: {"podLabels": extra}})
    pod_labels = labels(docs, kind)
    assert pod_labels["team"] == "platform"
    assert pod_labels["app.kubernetes.io/component"] == component
    assert {k: v for k, v in pod_labels.items() if k != "team"} == labels(render(), kind)
    other = "DaemonSet" if kind == "Deployment" else "Deployment"
    assert "team" not in labels(docs, other)


# ------------------------------------------------------------------ NOTES.txt


def notes(*values: str, namespace: str = "migpart-system") -> str:
    cmd = ["install", "migpart", str(CHART), "--dry-run=client", "-n", namespace]
    out = run("helm", *cmd, *IMAGE_VALUES, *values).stdout
    assert "NOTES:" in out, out
    return out.split("NOTES:", 1)[1]


def test_notes_say_what_to_do_next() -> None:
    text = notes(namespace="gpu-system")
    assert "kubectl label node <node> migpart.io/managed=true" in text
    assert "kubectl apply -f manifests/samples/policy-dryrun.yaml" in text
    assert "kubectl get gpupartitionpolicies" in text
    assert "kubectl get mignodes" in text
    # the leader's log: the holder of the election Lease in the release namespace
    assert "kubectl -n gpu-system get lease migpart-operator" in text
    assert "holderIdentity" in text
    for path in re.findall(r"\b(docs/[\w.-]+\.md|manifests/samples/[\w.-]+\.yaml)", text):
        assert (ROOT / path).is_file(), path
    dry_run = yaml.safe_load((ROOT / "manifests/samples/policy-dryrun.yaml").read_text())
    assert dry_run["spec"]["mode"] == "DryRun"


def test_notes_follow_the_agents_node_selector() -> None:
    text = notes(
        "--set", "agent.nodeSelector.pool=gpu,agent.nodeSelector.migpart\\.io/managed=null"
    )
    assert "kubectl label node <node> pool=gpu\n" in text
    text = notes("--set", "agent.nodeSelector.pool=gpu")
    assert "kubectl label node <node> migpart.io/managed=true pool=gpu" in text
    text = notes("--set", "agent.nodeSelector=null")
    assert "kubectl label node" not in text
    assert "every node" in text
