"""Generate `crds/*.yaml` from the pydantic models, so that the models stay the one source.

pydantic's JSON schema is not a valid CRD schema as it is: CRDs reject `$ref`, `title` is noise,
`Optional[X]` comes out as `anyOf: [X, {type: null}]` (a CRD wants `nullable: true` on X),
`additionalProperties: false` and `propertyNames` are not allowed, and `const` is spelled `enum`.
`crd_schema` rewrites it into a structural schema (apiextensions.k8s.io/v1: every node typed,
no `anyOf` carrying types) and `structural_problems` checks that, so that a model change which
the API server would refuse fails a unit test instead.

    python -m migpart.api.crdgen --write crds/ --write manifests/crds/ \
        --write manifests/helm/migpart/generated-crds/                     # regenerate
    python -m migpart.api.crdgen --check crds/ --check manifests/crds/ \
        --check manifests/helm/migpart/generated-crds/                     # exit 1 on drift
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from migpart.api.models import (
    GROUP,
    MIGNODE_KIND,
    MIGNODE_PLURAL,
    POLICY_KIND,
    POLICY_PLURAL,
    VERSION,
    GpuPartitionPolicy,
    MigNode,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

Schema = dict[str, Any]

_READY = '.status.conditions[?(@.type=="Ready")].status'
_STALE = '.status.conditions[?(@.type=="Stale")].status'
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

# Keywords an apiextensions.k8s.io/v1 JSONSchemaProps accepts and that we pass through.
_KEPT = {
    "type",
    "format",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "nullable",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
}


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a `$ref`, keeping the sibling keywords (default, description) of the referrer."""
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    merged = dict(defs[name])
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _convert(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = _resolve(node, defs)
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            options = [o for o in node[combinator] if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"cannot express {combinator} of {options} in a CRD schema")
            outer = {k: v for k, v in node.items() if k != combinator}
            inner = _convert(options[0], defs)
            if len(options) < len(node[combinator]):
                inner["nullable"] = True
                if outer.get("default", 0) is None:
                    del outer["default"]
            outer.pop("title", None)
            inner.update({k: v for k, v in outer.items() if k in _KEPT})
            return inner
    out: Schema = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    if not node.get("type") and not any(k in node for k in ("properties", "items", "enum")):
        # `Any`: keep whatever the client sends.
        out["x-kubernetes-preserve-unknown-fields"] = True
    for key, value in node.items():
        if key in _KEPT:
            out[key] = value
    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: _convert(v, defs) for k, v in node["properties"].items()}
    elif isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(node["additionalProperties"], defs)
    elif node.get("additionalProperties") is True:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in node:
        out["items"] = _convert(node["items"], defs)
    if out.get("default", 0) is None:
        del out["default"]
    return out


_ORDER = ("description", "type", "format", "enum", "default", "nullable")
_LAST = ("required", "properties", "additionalProperties", "items", "x-kubernetes-validations")


def _ordered(node: Schema) -> Schema:
    """Keywords in reading order (description and type first, children last), recursively."""
    out: Schema = {k: node[k] for k in _ORDER if k in node}
    out.update({k: v for k, v in sorted(node.items()) if k not in _ORDER and k not in _LAST})
    for key in _LAST:
        if key not in node:
            continue
        value = node[key]
        if key == "properties":
            value = {name: _ordered(sub) for name, sub in value.items()}
        elif key in ("additionalProperties", "items") and isinstance(value, dict):
            value = _ordered(value)
        out[key] = value
    return out


def crd_schema(model: type[BaseModel]) -> Schema:
    """The openAPIV3Schema of a CRD whose objects `model` parses."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = _convert(raw, raw.get("$defs", {}))
    props = schema["properties"]
    # The API server owns these; only `type` may be said about metadata.
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}
    for top in ("spec", "status"):
        props[top].pop("nullable", None)
    schema.pop("required", None)
    return _ordered(schema)


def structural_problems(schema: Schema, path: str = "") -> list[str]:
    """Violations of the structural-schema rules that the API server enforces on CRDs."""
    problems: list[str] = []
    here = path or "<root>"
    if "$ref" in schema or "anyOf" in schema or "oneOf" in schema or "allOf" in schema:
        problems.append(f"{here}: $ref/anyOf/oneOf/allOf are not allowed here")
    if "title" in schema or "const" in schema or "propertyNames" in schema:
        problems.append(f"{here}: keyword not accepted by apiextensions v1")
    if "type" not in schema and not (
        schema.get("x-kubernetes-preserve-unknown-fields")
        or schema.get("x-kubernetes-int-or-string")
    ):
        problems.append(f"{here}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{here}: properties and additionalProperties are mutually exclusive")
    if schema.get("additionalProperties") is False:
        problems.append(f"{here}: additionalProperties: false is not allowed")
    if schema.get("type") == "array" and "items" not in schema:
        problems.append(f"{here}: array without items")
    if schema.get("x-kubernetes-list-type") == "map":
        item = schema.get("items", {})
        for key in schema.get("x-kubernetes-list-map-keys", []):
            if key not in item.get("required", []) and "default" not in item.get(
                "properties", {}
            ).get(key, {}):
                problems.append(f"{here}: list-map key {key} must be required or defaulted")
    for name, sub in schema.get("properties", {}).items():
        problems += structural_problems(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_problems(schema["additionalProperties"], f"{path}.*")
    if "items" in schema:
        problems += structural_problems(schema["items"], f"{path}[]")
    return problems


def _crd(
    model: type[BaseModel],
    kind: str,
    plural: str,
    short: str,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["migpart"],
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": crd_schema(model)},
                }
            ],
        },
    }


def policy_crd() -> dict[str, Any]:
    return _crd(
        GpuPartitionPolicy,
        POLICY_KIND,
        POLICY_PLURAL,
        "gpp",
        [
            {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
            {"name": "Allocation", "type": "string", "jsonPath": ".status.allocation.mode"},
            {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes"},
            {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
            {"name": "Pending", "type": "integer", "jsonPath": ".status.pendingRequests"},
            {"name": "Ready", "type": "string", "jsonPath": _READY},
            _AGE,
        ],
    )


def mignode_crd() -> dict[str, Any]:
    return _crd(
        MigNode,
        MIGNODE_KIND,
        MIGNODE_PLURAL,
        "mn",
        [
            {"name": "GPUs", "type": "integer", "jsonPath": ".status.summary.gpus"},
            {"name": "Instances", "type": "integer", "jsonPath": ".status.summary.instances"},
            {"name": "Free", "type": "integer", "jsonPath": ".status.summary.free"},
            {"name": "Synced", "type": "boolean", "jsonPath": ".status.summary.synced"},
            {"name": "Ready", "type": "string", "jsonPath": _READY},
            {"name": "Stale", "type": "string", "jsonPath": _STALE, "priority": 1},
            _AGE,
        ],
    )


_HEADER = "# Generated from migpart.api.models by `python -m migpart.api.crdgen --write DIR`.\n"


def render() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    out = {}
    for crd in (policy_crd(), mignode_crd()):
        text = yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)
        out[f"{crd['metadata']['name']}.yaml"] = _HEADER + text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migpart.api.crdgen", description=__doc__)
    parser.add_argument(
        "--write", metavar="DIR", type=Path, action="append", default=[], help="write into DIR"
    )
    parser.add_argument(
        "--check", metavar="DIR", type=Path, action="append", default=[], help="fail on drift"
    )
    args = parser.parse_args(argv)
    if not args.write and not args.check:
        parser.error("give --write DIR or --check DIR")
    drift = []
    for name, text in render().items():
        for directory in args.write:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text(text)
        for directory in args.check:
            path = directory / name
            if not path.exists() or path.read_text() != text:
                drift.append(str(path))
    if drift:
        print(
            f"out of date: {', '.join(drift)}; run"
            " python -m migpart.api.crdgen --write crds/ --write manifests/crds/"
            " --write manifests/helm/migpart/generated-crds/",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
