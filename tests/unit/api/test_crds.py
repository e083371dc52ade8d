"""crds/*.yaml are what the models generate, are structural, and their CEL rules agree with the
models' validators (evaluated with a real CEL implementation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from migpart.api.crdgen import crd_schema, main, mignode_crd, policy_crd, render
from migpart.api.crdgen import structural_problems as problems
from migpart.api.models import GROUP, GpuPartitionPolicySpec
from migpart.mig.profiles import PROFILE_NAME_RE

REPO = Path(__file__).parents[3]
PROFILES = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize(
    "directory", ["crds", "manifests/crds", "manifests/helm/migpart/generated-crds"]
)
def test_crd_files_match_the_models(directory: str) -> None:
    """Fails when the models changed and nobody ran
    `python -m migpart.api.crdgen --write crds/ --write manifests/crds/
    --write manifests/helm/migpart/generated-crds/`."""
    for name, text in render().items():
        assert (REPO / directory / name).read_text() == text, f"{directory}/{name} is stale"
    assert main(["--check", str(REPO / directory)]) == 0


def test_check_reports_drift(tmp_path: Path) -> None:
    assert main(["--write", str(tmp_path)]) == 0
    assert main(["--check", str(tmp_path)]) == 0
    stale = tmp_path / f"mignodes.{GROUP}.yaml"
    stale.write_text(stale.read_text().replace("mignode", "mignodez"))
    assert main(["--check", str(tmp_path)]) == 1


@pytest.mark.parametrize("crd", [policy_crd(), mignode_crd()], ids=["gpp", "mn"])
def test_schemas_are_structural(crd: dict[str, Any]) -> None:
    schema = _schema(crd)
    assert problems(schema) == []
    text = yaml.safe_dump(schema)
    for word in ("$ref", "$defs", "anyOf", "title", "const", "propertyNames"):
        assert word not in text
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert schema["properties"]["metadata"] == {"type": "object"}


def test_structural_problems_are_found() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "b": {"type": "array"},
            "c": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }
    found = problems(bad)
    assert any(p.startswith(".a: $ref/anyOf") for p in found)
    assert any(p.startswith(".a: no type") for p in found)
    assert ".b: array without items" in found
    assert any(p.startswith(".c: properties and additionalProperties") for p in found)


def test_union_of_types_is_refused() -> None:
    from pydantic import BaseModel

    class Both(BaseModel):
        x: int | str

    with pytest.raises(ValueError, match="cannot express anyOf"):
        crd_schema(Both)


@pytest.mark.parametrize(
    ("crd", "short", "plural", "columns"),
    [
        (
            policy_crd(),
            "gpp",
            "gpupartitionpolicies",
            [
                ("MODE", ".spec.mode"),
                ("ALLOCATION", ".status.allocation.mode"),
                ("NODES", ".status.nodes"),
                ("GPUS", ".status.gpus"),
                ("PENDING", ".status.pendingRequests"),
                ("READY", '.status.conditions[?(@.type=="Ready")].status'),
                ("AGE", ".metadata.creationTimestamp"),
            ],
        ),
        (
            mignode_crd(),
            "mn",
            "mignodes",
            [
                ("GPUS", ".status.summary.gpus"),
                ("INSTANCES", ".status.summary.instances"),
                ("FREE", ".status.summary.free"),
                ("SYNCED", ".status.summary.synced"),
                ("READY", '.status.conditions[?(@.type=="Ready")].status'),
                ("STALE", '.status.conditions[?(@.type=="Stale")].status'),  # -o wide
                ("AGE", ".metadata.creationTimestamp"),
            ],
        ),
    ],
)
def test_names_scope_and_printer_columns(
    crd: dict[str, Any], short: str, plural: str, columns: list[tuple[str, str]]
) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{plural}.{GROUP}"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["shortNames"] == [short]
    assert spec["names"]["plural"] == plural
    version = spec["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    got = [(c["name"].upper(), c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert got == columns
    # Every column path except AGE names a field of the schema.
    schema = _schema(crd)
    for _, path in columns[:-1]:
        node = schema
        for part in path.split("[")[0].strip(".").split("."):
            node = node.get("items", node)["properties"][part]
        assert "type" in node


def test_policy_schema_constraints() -> None:
    spec = _schema(policy_crd())["properties"]["spec"]["properties"]
    assert spec["mode"]["enum"] == ["Active", "DryRun"]
    assert spec["priority"]["minimum"] == 0
    assert spec["spares"]["items"]["properties"]["count"]["minimum"] == 0
    assert spec["reconfiguration"]["properties"]["batchWindowSeconds"]["minimum"] == 0
    assert spec["reconfiguration"]["properties"]["maxConcurrentNodes"]["minimum"] == 1
    allow = spec["profiles"]["properties"]["allow"]
    assert allow["items"]["pattern"] == PROFILE_NAME_RE.pattern
    assert allow["x-kubernetes-list-type"] == "set"
    assert allow["maxItems"] > 0
    assert allow["items"]["maxLength"] > 0
    assert spec["spares"]["x-kubernetes-list-map-keys"] == ["profile"]


# --------------------------------------------------------------------------- CEL rules

_ENV = celpy.Environment()


def cel_violations(schema: dict[str, Any], value: Any, path: str = "spec") -> list[str]:
    """Evaluate every x-kubernetes-validations rule of `schema` on `value` like the API server."""
    found: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = _ENV.program(_ENV.compile(rule["rule"]))
        if not bool(program.evaluate({"self": json_to_cel(value)})):
            found.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in schema.get("properties", {}):
                found += cel_violations(schema["properties"][key], sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, sub in enumerate(value):
            found += cel_violations(schema["items"], sub, f"{path}[{i}]")
    return found


SPEC_SCHEMA = _schema(policy_crd())["properties"]["spec"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"profiles": {"allow": ["1g.10gb", "2g.20gb"], "deny": ["2g.20gb"]}},
            "spec.profiles: spec.profiles: allow and deny must not name the same profile",
        ),
        (
            {"profiles": {"deny": ["1g.10gb"]}, "spares": [{"profile": "1g.10gb", "count": 1}]},
            "spec.spares: spec.spares: a spare profile must not be denied by spec.profiles.deny",
        ),
        (
            {"profiles": {"allow": ["2g.20gb"]}, "spares": [{"profile": "1g.10gb", "count": 1}]},
            "spec.spares: spec.spares: a spare profile must be listed in spec.profiles.allow",
        ),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In"}]}},
            "spec.nodeSelector.matchExpressions[0].values: values must be non-empty",
        ),
        (
            {
                "nodeSelector": {
                    "matchExpressions": [{"key": "pool", "operator": "In", "values": []}]
                }
            },
            "spec.nodeSelector.matchExpressions[0].values: values must be non-empty",
        ),
        (
            {
                "nodeSelector": {
                    "matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": ["x"]}]
                }
            },
            "spec.nodeSelector.matchExpressions[0].values: values must be non-empty for operators"
            " In and NotIn, and empty for Exists",
        ),
    ],
)
def test_cel_rules_reject_with_a_message_naming_the_field(
    spec: dict[str, Any], message: str
) -> None:
    found = cel_violations(SPEC_SCHEMA, spec)
    assert any(f.startswith(message) for f in found), found
    with pytest.raises(ValidationError):
        GpuPartitionPolicySpec.model_validate(spec)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["profiles"] = {
            k: draw(st.lists(st.sampled_from(PROFILES), unique=True, max_size=3))
            for k in draw(st.sets(st.sampled_from(["allow", "deny"])))
        }
    if draw(st.booleans()):
        spec["spares"] = [
            {"profile": p, "count": draw(st.integers(0, 3))}
            for p in draw(st.lists(st.sampled_from(PROFILES), unique=True, max_size=3))
        ]
    if draw(st.booleans()):
        expressions = []
        for _ in range(draw(st.integers(0, 2))):
            e: dict[str, Any] = {
                "key": "k",
                "operator": draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"])),
            }
            if draw(st.booleans()):
                e["values"] = draw(st.lists(st.sampled_from(["a", "b"]), unique=True, max_size=2))
            expressions.append(e)
        spec["nodeSelector"] = {"matchExpressions": expressions}
    return spec


@given(spec=specs())
def test_cel_rules_agree_with_the_model_validators(spec: dict[str, Any]) -> None:
    """Same verdict from the API server's rules and from pydantic, with and without defaults."""
    try:
        parsed = GpuPartitionPolicySpec.model_validate(spec)
    except ValidationError:
        valid = False
    else:
        valid = True
        defaulted = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
        assert cel_violations(SPEC_SCHEMA, defaulted) == []
    assert (cel_violations(SPEC_SCHEMA, spec) == []) is valid


def test_defaults_in_the_schema_are_valid() -> None:
    default = SPEC_SCHEMA["default"]
    assert GpuPartitionPolicySpec.model_validate(default) == GpuPartitionPolicySpec()
    assert cel_violations(SPEC_SCHEMA, default) == []
