"""The metric names that migpart's alerts (manifests/helm/migpart/files/prometheus-rules.yaml)
and its Grafana dashboard (…/files/dashboard.json) query, and the names a /metrics page
exports: shared by the unit tests of the files (tests/unit/test_monitoring.py) and the test
that a running operator and agent export every one (tests/integration/test_monitoring.py).

A small tokeniser, not a PromQL parser: it drops what cannot be a metric name (strings, label
matchers, ranges and subqueries, `by (...)`-style label lists, Grafana variables, numbers and
durations), then keeps every identifier that is not a keyword and not called like a function.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "manifests" / "helm" / "migpart" / "files"
RULES = FILES / "prometheus-rules.yaml"
DASHBOARD = FILES / "dashboard.json"

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
# The series a histogram or summary family `x` exports besides `x` itself.
_FAMILY_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def metric_names(expr: str) -> set[str]:
    """The metric names one PromQL expression reads."""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VARIABLE.sub(" ", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # ranges, subqueries, offsets inside them
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        if name in KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue  # a keyword, or a function or aggregation called on what follows
        names.add(name)
    return names


def rule_expressions(path: Path = RULES) -> dict[str, str]:
    """Each alert (or recording rule) of a rules file with its expression."""
    doc = yaml.safe_load(path.read_text())
    return {
        rule.get("alert") or rule["record"]: rule["expr"]
        for group in doc["groups"]
        for rule in group["rules"]
    }


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def dashboard_expressions(path: Path = DASHBOARD) -> dict[str, str]:
    """Each query of the dashboard (panel targets and query variables), keyed by where it is."""
    dashboard = json.loads(path.read_text())
    found = {}
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target.get('refId', '')}"] = target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            found[f"variable {variable['name']}"] = query
    return found


def queried_metrics() -> dict[str, set[str]]:
    """Metric name -> where the alerts and the dashboard query it."""
    where: dict[str, set[str]] = {}
    sources = {
        **{f"alert {n}": e for n, e in rule_expressions().items()},
        **dashboard_expressions(),
    }
    for source, expr in sources.items():
        for query in _variable_queries(expr):
            for name in metric_names(query):
                where.setdefault(name, set()).add(source)
    return where


def _variable_queries(expr: str) -> list[str]:
    """A Grafana query variable's `label_values(METRIC, label)` reads METRIC (a selector);
    anything else is PromQL."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", expr, re.DOTALL)
    return [match.group(1)] if match else [expr]


def exported_names(exposition: str) -> set[str]:
    """Every series name a /metrics page (Prometheus text format) declares or samples:
    declared families (`# TYPE`, which a labelled metric without samples still has) with the
    series names of their type, and every sampled name."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind in ("histogram", "summary", "gaugehistogram"):
                names.update(name + suffix for suffix in _FAMILY_SUFFIXES)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def sampled_names(exposition: str) -> set[str]:
    """The names that have at least one sample on a /metrics page (histogram and summary
    series by their family's name too)."""
    names = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{\s]", line, maxsplit=1)[0]
            names.add(name)
            for suffix in _FAMILY_SUFFIXES:
                if name.endswith(suffix):
                    names.add(name.removesuffix(suffix))
    return names
