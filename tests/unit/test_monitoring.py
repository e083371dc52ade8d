"""The packaged monitoring: the alert rules (promtool check and unit tests), their runbooks,
the Grafana dashboard, and the PromQL tokeniser that the metrics test on the testbed uses
(tests/integration/test_monitoring.py checks the names against a running operator and agent).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from migpart.agent.metrics import AgentMetrics
from migpart.controller.core.metrics import Metrics
from tests.promql import (
    DASHBOARD,
    RULES,
    dashboard_expressions,
    exported_names,
    metric_names,
    panels,
    queried_metrics,
    rule_expressions,
)

ROOT = Path(__file__).resolve().parents[2]
ALERT_TESTS = ROOT / "tests" / "monitoring" / "alerts_test.yaml"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
RUNBOOK_BASE = "https://github.com/migpart/migpart/blob/main/docs/troubleshooting.md#"


def promtool() -> str:
    """promtool as `make promtool` installs it ($PROMTOOL, set by the Makefile)."""
    cache = Path(os.environ.get("MIGPART_CACHE", Path.home() / ".cache" / "migpart"))
    path = Path(os.environ.get("PROMTOOL") or cache / "tools" / "bin" / "promtool")
    if not path.is_file():
        pytest.fail(f"promtool not found at {path}: run `make promtool` (make test does)")
    return str(path)


def run_promtool(*args: str) -> str:
    done = subprocess.run(
        [promtool(), *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def alerts() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+?)\s*$", markdown, re.MULTILINE):
        text = re.sub(r"[^\w\- ]", "", heading.lower())
        anchors.add(text.replace(" ", "-"))
    return anchors


# ------------------------------------------------------------------ rules


def test_rules_pass_promtool_check() -> None:
    assert "SUCCESS: 9 rules found" in run_promtool("check", "rules", str(RULES))


def test_alert_unit_tests_pass() -> None:
    assert "SUCCESS" in run_promtool("test", "rules", str(ALERT_TESTS))


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    """Each alert has a check where it fires and one where it stays quiet."""
    checks = [
        c
        for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
        for c in case["alert_rule_test"]
    ]
    names = {str(rule["alert"]) for rule in alerts()}
    fired = {c["alertname"] for c in checks if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in checks if not c.get("exp_alerts")}
    assert names - fired == set(), f"never shown firing: {sorted(names - fired)}"
    assert names - quiet == set(), f"never shown quiet: {sorted(names - quiet)}"


def test_alerts_carry_severity_summary_description_and_a_runbook() -> None:
    anchors = github_anchors(TROUBLESHOOTING.read_text())
    assert len(alerts()) == 9
    for rule in alerts():
        labels = rule["labels"]
        annotations = rule["annotations"]
        assert isinstance(labels, dict)
        assert isinstance(annotations, dict)
        assert labels["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), rule["alert"]
        url = str(annotations["runbook_url"])
        assert url.startswith(RUNBOOK_BASE), url
        anchor = url.removeprefix(RUNBOOK_BASE)
        assert anchor in anchors, f"{rule['alert']}: docs/troubleshooting.md has no #{anchor}"
        assert anchor == str(rule["alert"]).lower(), "one runbook section per alert, named after it"


def test_monitoring_doc_points_to_the_rules_file_and_holds_no_copy() -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text()
    assert "manifests/helm/migpart/files/prometheus-rules.yaml" in text
    assert "- alert:" not in text
    assert "groups:" not in text
    for rule in alerts():
        assert f"`{rule['alert']}`" in text, f"docs/monitoring.md does not list {rule['alert']}"


# ------------------------------------------------------------------ dashboard


def test_dashboard_is_importable_with_a_prometheus_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "migpart"
    assert dashboard["id"] is None
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"]
            assert metric_names(target["expr"]), f"{panel['title']}: queries no metric"


def test_dashboard_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in panels(json.loads(DASHBOARD.read_text())):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_dashboard_shows_what_the_operator_and_the_agents_do() -> None:
    queried = set(queried_metrics())
    for needed in (
        "migpart_pending_requests",
        "migpart_rounds_total",
        "migpart_plan_duration_seconds_bucket",
        "migpart_repartitions_total",
        "migpart_unavailable_nodes",
        "migpart_agent_mig_operations_total",
        "migpart_agent_nvml_errors_total",
        "migpart_agent_gpu_mig_instances",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "migpart_build_info",
    ):
        assert needed in queried, needed


def test_every_queried_metric_is_declared_by_the_code() -> None:
    """The same check as the testbed's, against the registries alone (fast, no processes)."""
    operator = Metrics()
    operator.start_policy("p")
    exported = exported_names(generate_latest(operator.registry).decode())
    exported |= exported_names(AgentMetrics("node").exposition().decode())
    missing = {
        name: sorted(where) for name, where in queried_metrics().items() if name not in exported
    }
    assert not missing, missing


# ------------------------------------------------------------------ the tokeniser


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("max by (policy) (migpart_pending_requests) > 0", {"migpart_pending_requests"}),
        ("sum(rate(a_total[5m])) by (le)", {"a_total"}),
        ("x unless x offset 15m", {"x"}),
        (
            'histogram_quantile(0.9, sum by (le) (rate(h_bucket{node=~"$n"}[$__rate_interval])))',
            {"h_bucket"},
        ),
        ("rate(c[5m:1m]) > bool 1e3", {"c"}),
        ('a * on (instance, job) group_left (version) b{x="}{"}', {"a", "b"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)") + 0x1f - Inf', {"up"}),
        ('sum without (pod) (ns:metric:rate5m{job="a"}) or vector(0)', {"ns:metric:rate5m"}),
        (
            'count_values("version", build_info) and ignoring(version) other',
            {"build_info", "other"},
        ),
        ("time() - process_start_time_seconds", {"process_start_time_seconds"}),
    ],
)
def test_metric_names_skips_functions_labels_keywords_and_durations(
    expr: str, names: set[str]
) -> None:
    assert metric_names(expr) == names


def test_exported_names_include_declared_families_without_samples() -> None:
    page = "\n".join(
        [
            "# HELP h Time.",
            "# TYPE h histogram",
            "# HELP c_total Count.",
            "# TYPE c_total counter",
            'g{a="1"} 2.0',
        ]
    )
    assert exported_names(page) == {
        "h",
        "h_bucket",
        "h_sum",
        "h_count",
        "h_created",
        "c_total",
        "g",
    }


def test_dashboard_and_rules_are_read_whole() -> None:
    assert len(rule_expressions()) == 9
    assert len(dashboard_expressions()) >= 20
