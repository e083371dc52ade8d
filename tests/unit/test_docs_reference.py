"""The docs' reference tables say what the code and the chart do.

A table copied from an object drifts the day the object changes: the agent's RBAC table in
docs/deploy.md once left out a verb the chart grants, docs/helm.md a value of values.yaml,
docs/operations.md a Service the chart creates, docs/policies.md a default of the model, the
README a doc twice, and docs/kubectl.md read the log of whichever operator pod `kubectl logs
deploy/…` picked. Each test below reads one of them and compares it with its source.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
import yaml

from migpart.api.models import GpuPartitionPolicySpec
from migpart.kube.election_lease import LEASE_NAME
from tests.tools import CHART, IMAGE_VALUES, ROOT, helm_template

DOCS = ROOT / "docs"
Doc = dict[str, Any]
Grant = tuple[str, str, str]  # apiGroup, resource, verb
_COMPONENT = "app.kubernetes.io/component"


@cache
def chart() -> tuple[Doc, ...]:
    return tuple(helm_template("--kube-version=1.34.4", *IMAGE_VALUES))


def table_after(text: str, marker: str) -> list[list[str]]:
    """The cells of the first Markdown table after `marker`, header and rule left out."""
    rest = text[text.index(marker) :].splitlines()
    start = next(i for i, line in enumerate(rest) if line.startswith("|"))
    rows = []
    for line in rest[start + 2 :]:
        if not line.startswith("|"):
            break
        # a cell may hold an escaped pipe (`\|`)
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        rows.append([c.strip() for c in cells])
    return rows


def code_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


# ------------------------------------------------------------------ RBAC (docs/deploy.md)


def chart_grants(account: str) -> dict[Grant, set[tuple[str, str]]]:
    """(apiGroup, resource, verb) -> {(Role kind, namespace)} the ServiceAccount gets."""
    docs = chart()
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    out: dict[Grant, set[tuple[str, str]]] = {}
    for binding in [d for d in docs if d["kind"].endswith("RoleBinding")]:
        if not any(s["name"] == account for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        where = (role["metadata"]["name"], role["metadata"].get("namespace", ""))
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.setdefault((group, resource, verb), set()).add(where)
    return out


def documented_grants(account: str) -> dict[Grant, str]:
    """(apiGroup, resource, verb) -> the resources cell, from deploy.md's table."""
    text = (DOCS / "deploy.md").read_text()
    out: dict[Grant, str] = {}
    for group_cell, resources_cell, verbs_cell, _why in table_after(text, f"**`{account}`**"):
        (group,) = code_names(group_cell)
        group = "" if group == '""' else group
        resources = code_names(resources_cell.split("(")[0])
        verbs = [v.strip().strip("`") for v in verbs_cell.split(",")]
        for resource in resources:
            for verb in verbs:
                assert (group, resource, verb) not in out, f"{account}: {resource} {verb} twice"
                out[(group, resource, verb)] = resources_cell
    return out


@pytest.mark.parametrize("account", ["migpart-operator", "migpart-agent"])
def test_deploy_rbac_tables_are_the_charts_rules(account: str) -> None:
    granted = chart_grants(account)
    documented = documented_grants(account)
    assert sorted(set(granted) - set(documented)) == [], "granted, not in docs/deploy.md"
    assert sorted(set(documented) - set(granted)) == [], "in docs/deploy.md, not granted"
    for grant, cell in documented.items():
        # "(Role `name` in ...)" names the Role that grants it; else it is the ClusterRole's
        role = re.search(r"\(Role `([^`]+)`", cell)
        if role:
            assert {name for name, _ in granted[grant]} == {role.group(1)}, grant
        else:
            assert granted[grant] == {(account, "")}, grant


# ------------------------------------------------------------------ values (docs/helm.md)

# Maps whose keys are the user's: the table documents them as a whole.
FREE_FORM = {
    "resources",
    "nodeSelector",
    "affinity",
    "podAnnotations",
    "podLabels",
    "labels",
    "annotations",
    "namespaceSelector",
    "podSelector",
}


def value_paths(values: Doc, prefix: str = "") -> tuple[set[str], set[str]]:
    """(leaves, every path) of values.yaml; a free-form or empty map is a leaf."""
    leaves: set[str] = set()
    paths: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.add(path)
        if isinstance(value, dict) and value and key not in FREE_FORM:
            sub_leaves, sub_paths = value_paths(value, f"{path}.")
            leaves |= sub_leaves
            paths |= sub_paths
        else:
            leaves.add(path)
    return leaves, paths


def test_helm_values_table_lists_every_value_and_no_other() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves, paths = value_paths(values)
    rows = table_after((DOCS / "helm.md").read_text(), "### Values")
    documented = [name for row in rows for name in code_names(row[0])]
    assert len(documented) == len(set(documented)), "a value is in the table twice"
    assert sorted(leaves - set(documented)) == [], "values.yaml has them, docs/helm.md not"
    assert sorted(set(documented) - paths) == [], "docs/helm.md has them, values.yaml not"


# ------------------------------------------------------------------ docs/operations.md


def test_operations_table_names_the_charts_workloads_and_services() -> None:
    rows = {
        row[0].split()[0]: row
        for row in table_after((DOCS / "operations.md").read_text(), "## What runs where")
    }
    assert sorted(rows) == ["agent", "operator"]
    docs = chart()
    for component, (_, kind_cell, _, port_cell, service_cell) in rows.items():
        objects = [d for d in docs if d["metadata"]["labels"].get(_COMPONENT) == component]
        services = sorted(d["metadata"]["name"] for d in objects if d["kind"] == "Service")
        assert sorted(n for n in code_names(service_cell) if n.startswith("migpart")) == services
        (workload,) = [d for d in objects if d["kind"] in ("Deployment", "DaemonSet")]
        assert f"{workload['kind']} `{workload['metadata']['name']}`" in kind_cell
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        assert port_cell.startswith(str(container["ports"][0]["containerPort"]))
        for key, value in workload["spec"]["template"]["spec"].get("nodeSelector", {}).items():
            assert f"`{key}={value}`" in kind_cell, "the agent's nodes"


# ------------------------------------------------------------------ docs/policies.md


def test_policies_defaults_are_the_models() -> None:
    """The `spec: {}` example's filled-in defaults and the field table's default column."""
    text = (DOCS / "policies.md").read_text()
    after = text[text.index("fills in the defaults") :]
    block = after[after.index("```yaml\n") + len("```yaml\n") : after.index("```\n", 1)]
    defaults = GpuPartitionPolicySpec().model_dump(by_alias=True, mode="json")
    assert yaml.safe_load(block) == {"spec": defaults}
    for row in table_after(text, "## Fields"):
        field, default = code_names(row[0]), code_names(row[1])
        if len(field) != 1 or len(default) != 1 or "[]" in field[0]:
            continue
        value: Any = defaults
        for part in field[0].split("."):
            value = value[part]
        assert emptied(yaml.safe_load(default[0])) == emptied(value), field[0]


def emptied(value: Any) -> Any:
    """`{}` for a map of empty values (an empty selector is written `{}`)."""
    if isinstance(value, dict):
        return {k: emptied(v) for k, v in value.items() if emptied(v) not in ({}, [])}
    return value


# ------------------------------------------------------------------ README.md


def test_readme_lists_each_doc_once() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Documentation") :]
    section = section[: section.index("\n## ", 1)]
    listed = re.findall(r"\]\(docs/([\w.-]+\.md)\)", section)
    twice = sorted({d for d in listed if listed.count(d) > 1})
    assert twice == [], "listed more than once"
    assert all((DOCS / d).is_file() for d in listed)


# ------------------------------------------------------------------ the leader's log

# Docs this suite keeps; troubleshooting*.md and monitoring.md still read deploy/ logs.
LEADER_LOG_DOCS = sorted(p.name for p in DOCS.glob("*.md"))


def commands(text: str) -> list[str]:
    """The lines of the fenced code blocks."""
    return [
        line
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        for line in block.splitlines()
    ]


@pytest.mark.parametrize("name", LEADER_LOG_DOCS)
def test_docs_read_the_leaders_log(name: str) -> None:
    """`kubectl logs deploy/migpart-operator` reads one pod of the Deployment, maybe the
    standby: the docs find the leader through the election Lease."""
    for line in commands((DOCS / name).read_text()):
        assert not re.search(r"logs\s+(deploy|deployment)/migpart-operator", line), line


def test_kubectl_doc_finds_the_leader_by_its_lease() -> None:
    text = "\n".join(commands((DOCS / "kubectl.md").read_text()))
    assert "get lease migpart-operator -o jsonpath='{.spec.holderIdentity}'" in text
    assert 'logs "${LEADER%_*}"' in text


def test_election_lease_name_is_the_documented_one() -> None:
    assert LEASE_NAME == "migpart-operator"
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert f"get lease {LEASE_NAME} -o jsonpath='{{.spec.holderIdentity}}'" in notes
