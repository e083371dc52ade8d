"""What each value of the Helm chart changes in the rendered objects (`helm template`).

One case per value or toggle: the objects it must add, remove or change, read from the real
`helm template` output. The containers' arguments go through migpart's own argument parsers,
as tests/unit/test_manifests.py does for manifests/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from migpart.slices.dra import DRIVER
from tests.chart import Doc, args, container, env, kinds, one, pod_spec, render, with_values
from tests.tools import CHART, MANIFESTS

DIGEST = "sha256:" + "ab" * 32
# The admission policy's match condition, as CEL's matches() reads it (RE2, anchored here).
AGENT_USER = "system:serviceaccount:{}:migpart-agent"


# ------------------------------------------------------------------ image


def test_image_defaults_to_the_app_version() -> None:
    docs = render()
    for kind in ("Deployment", "DaemonSet"):
        assert container(docs, kind)["image"] == "migpart:0.1.0"
        assert container(docs, kind)["imagePullPolicy"] == "IfNotPresent"
        assert "imagePullSecrets" not in pod_spec(docs, kind)


def test_image_repository_tag_policy_and_pull_secrets(tmp_path: Path) -> None:
    values = {
        "image": {
            "repository": "registry.example.com/platform/migpart",
            "tag": "0.1.0-rc1",
            "pullPolicy": "Always",
            "pullSecrets": ["regcred", "mirror"],
        }
    }
    docs = with_values(tmp_path, values)
    for kind in ("Deployment", "DaemonSet"):
        assert container(docs, kind)["image"] == "registry.example.com/platform/migpart:0.1.0-rc1"
        assert container(docs, kind)["imagePullPolicy"] == "Always"
        secrets = pod_spec(docs, kind)["imagePullSecrets"]
        assert secrets == [{"name": "regcred"}, {"name": "mirror"}]


def test_image_digest_replaces_the_tag(tmp_path: Path) -> None:
    docs = with_values(tmp_path, {"image": {"tag": "ignored", "digest": DIGEST}})
    for kind in ("Deployment", "DaemonSet"):
        assert container(docs, kind)["image"] == f"migpart@{DIGEST}"


# ------------------------------------------------------------------ per component


# Helm merges a map of a values file into the default one: a key set to null removes a default
# (the agent's migpart.io/managed selector, the cpu limit).
COMPONENT = {
    "logLevel": "DEBUG",
    "resources": {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": None, "memory": "2Gi"},
    },
    "nodeSelector": {"pool": "system"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoExecute"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
    "priorityClassName": "migpart-critical",
    "extraEnv": [{"name": "EXTRA", "value": "1"}],
    "podAnnotations": {"example.com/owner": "platform"},
}


@pytest.mark.parametrize(
    ("component", "kind", "extra_arg", "dest", "parsed"),
    [
        ("operator", "Deployment", "--tick-seconds=2", "tick_seconds", 2.0),
        ("agent", "DaemonSet", "--lease-renew-seconds=5", "lease_renew_seconds", 5.0),
    ],
)
def test_component_values(
    component: str, kind: str, extra_arg: str, dest: str, parsed: float, tmp_path: Path
) -> None:
    values = {component: {**COMPONENT, "extraArgs": [extra_arg], "metricsPort": 9400}}
    if component == "agent":
        values[component]["nodeSelector"] = {"pool": "system", "migpart.io/managed": None}
    docs = with_values(tmp_path, values)
    spec = pod_spec(docs, kind)
    assert spec["nodeSelector"] == {"pool": "system"}
    assert spec["tolerations"] == COMPONENT["tolerations"]
    assert spec["affinity"] == COMPONENT["affinity"]
    assert spec["priorityClassName"] == "migpart-critical"
    template = one(docs, kind)["spec"]["template"]["metadata"]
    assert template["annotations"] == COMPONENT["podAnnotations"]
    main = container(docs, kind)
    assert main["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"memory": "2Gi"},
    }
    assert env(docs, kind)["EXTRA"] == {"name": "EXTRA", "value": "1"}
    parsed_args = args(docs, kind)
    assert parsed_args.log_level == "DEBUG"
    assert parsed_args.metrics_port == 9400
    assert getattr(parsed_args, dest) == parsed
    assert main["ports"] == [{"name": "http-metrics", "containerPort": 9400, "protocol": "TCP"}]
    service = one(docs, "Service", f"migpart-{component}-metrics")
    assert service["spec"]["ports"][0]["port"] == 9400
    # the other component keeps its defaults, but for the operator's --node-selector, which
    # follows the agent's nodeSelector
    other = "DaemonSet" if kind == "Deployment" else "Deployment"
    default = render()
    if other == "Deployment":
        assert args(docs, other).node_selector.match_labels == {"pool": "system"}
        assert args(default, other).node_selector.match_labels == {"migpart.io/managed": "true"}
        for spec in (pod_spec(docs, other), pod_spec(default, other)):
            argv = spec["containers"][0]["args"]
            argv[:] = [a for a in argv if not a.startswith("--node-selector=")]
    assert pod_spec(docs, other) == pod_spec(default, other)


def test_operator_log_json_off(tmp_path: Path) -> None:
    docs = with_values(tmp_path, {"operator": {"logJson": False}})
    assert args(docs, "Deployment").log_json is False
    assert args(render(), "Deployment").log_json is True


def test_operator_offer_publishing_is_off_unless_the_value_says_so(tmp_path: Path) -> None:
    assert args(render(), "Deployment").offer_publishing is False
    docs = with_values(tmp_path, {"operator": {"offerPublishing": True}})
    assert args(docs, "Deployment").offer_publishing is True


def test_agent_keeps_node_name_with_extra_env(tmp_path: Path) -> None:
    docs = with_values(tmp_path, {"agent": {"extraEnv": [{"name": "EXTRA", "value": "1"}]}})
    assert env(docs, "DaemonSet")["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "spec.nodeName"
    )


# ------------------------------------------------------------------ agent host paths


def host_paths(docs: list[Doc]) -> dict[str, str]:
    """mountPath -> hostPath of the agent container."""
    spec = pod_spec(docs, "DaemonSet")
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {
        m["mountPath"]: volumes[m["name"]]["hostPath"]["path"]
        for m in container(docs, "DaemonSet")["volumeMounts"]
    }


@pytest.mark.parametrize("root", ["/var/lib/k0s/kubelet", "/var/lib/k0s/kubelet/"])
def test_kubelet_root_dir_moves_the_plugin_directories(root: str, tmp_path: Path) -> None:
    docs = with_values(tmp_path, {"agent": {"kubeletRootDir": root}})
    parsed = args(docs, "DaemonSet")
    plugin = f"/var/lib/k0s/kubelet/plugins/{DRIVER}"
    registration = "/var/lib/k0s/kubelet/plugins_registry"
    assert str(parsed.plugin_dir) == plugin
    assert str(parsed.registration_dir) == registration
    mounts = host_paths(docs)
    assert mounts[plugin] == plugin
    assert mounts[registration] == registration


def test_every_agent_directory_flag_is_its_host_path(tmp_path: Path) -> None:
    values = {"agent": {"stateDir": "/data/migpart", "cdiDir": "/etc/cdi"}}
    docs = with_values(tmp_path, values)
    parsed = args(docs, "DaemonSet")
    mounts = host_paths(docs)
    for dest in ("state_dir", "cdi_dir", "plugin_dir", "registration_dir"):
        path = str(getattr(parsed, dest))
        assert mounts[path] == path, dest
    assert str(parsed.state_dir) == "/data/migpart"
    assert str(parsed.cdi_dir) == "/etc/cdi"


def test_driver_root_mounts_the_driver_and_loads_nvml_from_it(tmp_path: Path) -> None:
    values = {"agent": {"driverRoot": "/run/nvidia/driver", "runtimeClassName": ""}}
    docs = with_values(tmp_path, values)
    spec = pod_spec(docs, "DaemonSet")
    assert "runtimeClassName" not in spec
    assert host_paths(docs)["/driver-root"] == "/run/nvidia/driver"
    (mount,) = [
        m for m in container(docs, "DaemonSet")["volumeMounts"] if m["name"] == "driver-root"
    ]
    assert mount["readOnly"] is True
    library_path = env(docs, "DaemonSet")["LD_LIBRARY_PATH"]["value"].split(":")
    assert "/driver-root/usr/lib/x86_64-linux-gnu" in library_path
    assert "/driver-root/usr/lib64" in library_path
    # without a driver root, none of it
    default = render()
    assert pod_spec(default, "DaemonSet")["runtimeClassName"] == "nvidia"
    assert "/driver-root" not in host_paths(default)
    assert "LD_LIBRARY_PATH" not in env(default, "DaemonSet")


def test_runtime_class_name(tmp_path: Path) -> None:
    docs = with_values(tmp_path, {"agent": {"runtimeClassName": "nvidia-cdi"}})
    assert pod_spec(docs, "DaemonSet")["runtimeClassName"] == "nvidia-cdi"
    assert "runtimeClassName" not in pod_spec(docs, "Deployment")


# ------------------------------------------------------------------ namespace


def test_another_namespace_moves_everything_and_the_policy_still_matches() -> None:
    """The admission policy names no namespace: its match must hold for the agent of the
    release namespace (the security bug of an overlay that moved everything else)."""
    docs = render(namespace="gpu-system")
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in ("Role", "RoleBinding") and "election" not in doc["metadata"]["name"]:
            assert namespace == "kube-node-lease", doc["metadata"]["name"]
        elif namespace is not None:
            assert namespace == "gpu-system", (doc["kind"], doc["metadata"]["name"])
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == "gpu-system"
    policy = one(docs, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    pattern = re.search(r'matches\("(.*)"\)', condition["expression"])
    assert pattern is not None, condition["expression"]
    assert re.search(pattern.group(1), AGENT_USER.format("gpu-system"))
    assert not re.search(pattern.group(1), "system:serviceaccount:gpu-system:migpart-operator")
    assert not re.search(pattern.group(1), "system:serviceaccount:gpu-system:x-migpart-agent")
    assert "migpart-system" not in yaml.safe_dump(policy)


# ------------------------------------------------------------------ toggles


@pytest.mark.parametrize(
    ("values", "gone"),
    [
        ({"crds": {"enabled": False}}, {"CustomResourceDefinition": 2}),
        ({"deviceClass": {"enabled": False}}, {"DeviceClass": 1}),
        (
            {"admissionPolicy": {"enabled": False}},
            {"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1},
        ),
        ({"metrics": {"services": {"enabled": False}}}, {"Service": 2}),
    ],
    ids=["crds", "deviceclass", "admission", "services"],
)
def test_toggle_off_removes_exactly_its_objects(
    values: Doc, gone: dict[str, int], tmp_path: Path
) -> None:
    before = kinds(render())
    after = kinds(with_values(tmp_path, values))
    assert {k: before[k] - after.get(k, 0) for k in before if before[k] != after.get(k, 0)} == gone


def test_crds_are_kept_on_uninstall_unless_told() -> None:
    for crd in [d for d in render() if d["kind"] == "CustomResourceDefinition"]:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for crd in [
        d for d in render("--set", "crds.keep=false") if d["kind"] == "CustomResourceDefinition"
    ]:
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_samples_render_the_manifests_samples() -> None:
    docs = render("--set", "samples.enabled=true")
    samples = [
        d
        for p in sorted((MANIFESTS / "samples").glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]
    added = [d for d in docs if d not in render()]
    assert sorted(map(str, added)) == sorted(map(str, samples))


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
def test_monitors_scrape_both_components(monitor: str, tmp_path: Path) -> None:
    values = {
        "metrics": {monitor: {"enabled": True, "interval": "15s", "labels": {"release": "kps"}}}
    }
    docs = with_values(tmp_path, values, namespace="gpu-system")
    kind = monitor[0].upper() + monitor[1:]
    found = {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
    assert sorted(found) == ["migpart-agent", "migpart-operator"]
    for name, doc in found.items():
        component = name.removeprefix("migpart-")
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert doc["metadata"]["labels"]["release"] == "kps"
        assert doc["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert doc["spec"]["namespaceSelector"] == {"matchNames": ["gpu-system"]}
        endpoints = doc["spec"]["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
        assert endpoints == [{"port": "http-metrics", "path": "/metrics", "interval": "15s"}]
    assert not [d for d in render() if d["kind"] == kind]


def test_prometheus_rule_carries_the_rules_file(tmp_path: Path) -> None:
    docs = with_values(
        tmp_path, {"metrics": {"prometheusRule": {"enabled": True, "labels": {"a": "b"}}}}
    )
    rule = one(docs, "PrometheusRule")
    rules_file = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules_file["groups"]
    assert rule["metadata"]["labels"]["a"] == "b"
    assert not [d for d in render() if d["kind"] == "PrometheusRule"]


def test_dashboard_config_map_for_the_grafana_sidecar(tmp_path: Path) -> None:
    values = {"metrics": {"dashboard": {"enabled": True, "namespace": "monitoring"}}}
    config_map = one(with_values(tmp_path, values), "ConfigMap", "migpart-dashboard")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = (CHART / "files" / "dashboard.json").read_text()
    assert config_map["data"]["migpart.json"].strip() == dashboard.strip()
    default = one(render("--set", "metrics.dashboard.enabled=true"), "ConfigMap")
    assert default["metadata"]["namespace"] == "migpart-system"
    assert not [d for d in render() if d["kind"] == "ConfigMap"]
