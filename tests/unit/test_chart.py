"""The Helm chart (manifests/helm/migpart) renders what `kustomize build manifests/` builds, and
its schema turns bad values away with a message naming them.

There are two ways to install migpart and one set of objects: with default values (release
namespace migpart-system) the chart must render exactly the kustomize objects, up to Helm's own
labels and annotation. Helm and kustomize are the real tools (`make tools`).
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.tools import CHART, IMAGE_VALUES, MANIFESTS, ROOT, helm_template, kustomize_build, run

Doc = dict[str, Any]
KUBE_VERSION = "--kube-version=1.34.4"

# Labels and annotations that only Helm puts on objects.
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
HELM_ANNOTATIONS = {"helm.sh/resource-policy"}


def render(*args: str, namespace: str = "migpart-system") -> list[Doc]:
    return helm_template(KUBE_VERSION, *IMAGE_VALUES, *args, namespace=namespace)


def _strip(metadata: Doc) -> None:
    for key, helm_keys in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
        kept = {k: v for k, v in metadata.get(key, {}).items() if k not in helm_keys}
        if kept:
            metadata[key] = kept
        else:
            metadata.pop(key, None)


def normalised(doc: Doc) -> Doc:
    """The object without Helm's own labels and annotations."""
    out = copy.deepcopy(doc)
    _strip(out["metadata"])
    template = out.get("spec", {}).get("template")
    if isinstance(template, dict) and "metadata" in template:
        _strip(template["metadata"])
    return out


def key(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


def by_key(docs: list[Doc]) -> dict[tuple[str, str, str, str], Doc]:
    out = {key(d): normalised(d) for d in docs}
    assert len(out) == len(docs), "an object is rendered twice"
    return out


def test_chart_renders_the_kustomize_objects() -> None:
    """Default values, namespace migpart-system: the objects of `kustomize build manifests/`,
    except the Namespace, which a Helm release cannot own (the release record lives in it;
    docs/helm.md creates it first). The Namespace the chart renders on request
    (namespace.create) is the kustomize one."""
    built = by_key(kustomize_build())
    chart = by_key(render())
    namespace = ("v1", "Namespace", "", "migpart-system")
    assert namespace in built
    assert namespace not in chart
    want = {k: v for k, v in built.items() if k != namespace}
    assert sorted(chart) == sorted(want)
    for name, doc in want.items():
        assert chart[name] == doc, name
    (created,) = [d for d in render("--set", "namespace.create=true") if d["kind"] == "Namespace"]
    assert normalised(created) == built[namespace]


def test_chart_puts_helm_labels_on_every_object() -> None:
    for doc in render():
        labels = doc["metadata"]["labels"]
        assert set(labels) >= HELM_LABELS, key(doc)
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_chart_app_version_is_the_package_version() -> None:
    """appVersion (the default image tag) is the package's; the chart's own version is SemVer
    and never behind it."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"]), chart["version"]
    assert tuple(map(int, chart["version"].split("."))) >= tuple(map(int, version.split(".")))
    assert chart["kubeVersion"] == ">=1.34.0-0"


def test_chart_samples_are_the_manifests_samples() -> None:
    """samples/ in the chart is a copy (Helm reads files only inside the chart)."""
    ours = sorted(p.name for p in (CHART / "samples").glob("*.yaml"))
    assert ours == sorted(p.name for p in (MANIFESTS / "samples").glob("*.yaml"))
    for name in ours:
        assert (CHART / "samples" / name).read_text() == (MANIFESTS / "samples" / name).read_text()


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["--set", "samples.enabled=true,namespace.create=true"],
        [
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,"
            "metrics.dashboard.enabled=true",
        ],
        ["--set", "metrics.podMonitor.enabled=true,metrics.services.enabled=false"],
        ["--set", "agent.driverRoot=/run/nvidia/driver,agent.runtimeClassName="],
        [
            "--set",
            "networkPolicy.enabled=true,networkPolicy.podSelector.matchLabels.app=prometheus,"
            "fullnameOverride=mig,operator.serviceAccount.create=false,operator.replicas=3,"
            "operator.podDisruptionBudget.minAvailable=2,agent.updateStrategy.type=OnDelete,"
            "agent.podLabels.team=gpu,agent.allowPublisherOverlap=true",
        ],
    ],
    ids=["defaults", "samples", "monitoring", "podmonitor", "driver-root", "production"],
)
def test_helm_lint(values: list[str]) -> None:
    # lint turns the chart's `fail` into a message: the image placeholder is no error here
    proc = run("helm", "lint", "--strict", str(CHART), KUBE_VERSION, *values)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_kube_version_below_134_is_refused() -> None:
    proc = run("helm", "template", "migpart", str(CHART), "--kube-version=1.33.5", check=False)
    assert proc.returncode != 0
    assert ">=1.34.0-0" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ bad values


def rejected(values: Doc, tmp_path: Path, command: str) -> str:
    """helm's message for a values file, which it must refuse (for no other reason than the
    file's: the image is set unless the file sets it)."""
    path = tmp_path / "values.yaml"
    image = {"repository": "migpart", **values.get("image", {})}
    path.write_text(yaml.safe_dump({**values, "image": image}))
    args = {
        "template": ["template", "migpart", str(CHART), KUBE_VERSION],
        # client-side: Helm's default capabilities stand in for a cluster
        "install": ["install", "migpart", str(CHART), "--dry-run=client"],
    }[command]
    proc = run("helm", *args, "-f", str(path), check=False)
    assert proc.returncode != 0, f"helm {command} accepted {values}"
    return proc.stderr


@pytest.mark.parametrize("command", ["template", "install"])
@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"agent": {"metricsPort": "8081"}}, "metricsPort"),
        ({"operator": {"logJson": "yes"}}, "logJson"),
        ({"image": {"pullSecrets": "regcred"}}, "pullSecrets"),
        ({"crds": {"enabled": 1}}, "enabled"),
        ({"agent": {"tolerations": {"key": "nvidia.com/gpu"}}}, "tolerations"),
    ],
    ids=["port-string", "bool-string", "secrets-string", "enabled-int", "tolerations-map"],
)
def test_wrong_type_fails_naming_the_value(
    values: Doc, named: str, command: str, tmp_path: Path
) -> None:
    message = rejected(values, tmp_path, command)
    assert named in message, message


@pytest.mark.parametrize("command", ["template", "install"])
@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"imgae": {"tag": "1"}}, "imgae"),
        ({"agent": {"kubeletRootdir": "/var/lib/k0s/kubelet"}}, "kubeletRootdir"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "enable"),
        ({"operator": {"resources": {"request": {"cpu": "1"}}}}, "request"),
    ],
    ids=["top", "agent", "metrics", "resources"],
)
def test_unknown_key_fails_naming_it(values: Doc, named: str, command: str, tmp_path: Path) -> None:
    message = rejected(values, tmp_path, command)
    assert named in message, message


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"digest": "sha256:abc"}}, "digest"),
        ({"operator": {"logLevel": "verbose"}}, "logLevel"),
        ({"agent": {"metricsPort": 0}}, "metricsPort"),
        ({"agent": {"kubeletRootDir": "var/lib/kubelet"}}, "kubeletRootDir"),
        ({"agent": {"extraArgs": ["resync-seconds=5"]}}, "extraArgs"),
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
    ],
    ids=[
        "enum",
        "digest",
        "log-level",
        "port-zero",
        "relative-root",
        "arg-no-dashes",
        "interval",
    ],
)
def test_bad_value_fails_naming_it(values: Doc, named: str, tmp_path: Path) -> None:
    message = rejected(values, tmp_path, "template")
    assert named in message, message


def test_service_monitor_without_services_fails_saying_why(tmp_path: Path) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True}, "services": {"enabled": False}}}
    message = rejected(values, tmp_path, "template")
    assert "metrics.serviceMonitor.enabled needs metrics.services.enabled" in message


def test_schema_is_strict_everywhere() -> None:
    """Every object in values.schema.json that lists properties forbids others."""
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, path
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    walk(schema, "")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
