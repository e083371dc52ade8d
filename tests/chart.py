"""The Helm chart as the chart tests read it: `helm template` with the image set, or with a
values file, and the objects, pod specs, containers, arguments and environment it renders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from migpart.commands import agent as agent_command
from migpart.commands import operator as operator_command
from tests.tools import IMAGE_VALUES, helm_template

Doc = dict[str, Any]


def render(*args: str, namespace: str = "migpart-system") -> list[Doc]:
    """`helm template` with the image set (values.yaml's is a placeholder) and these values."""
    return helm_template("--kube-version=1.34.4", *IMAGE_VALUES, *args, namespace=namespace)


def with_values(tmp_path: Path, values: Doc, namespace: str = "migpart-system") -> list[Doc]:
    """`helm template` with a values file (its image.repository, if any, wins)."""
    path = tmp_path / "values.yaml"
    image = {"repository": "migpart", **values.get("image", {})}
    path.write_text(yaml.safe_dump({**values, "image": image}))
    return helm_template("--kube-version=1.34.4", "-f", str(path), namespace=namespace)


def kinds(docs: list[Doc]) -> dict[str, int]:
    out: dict[str, int] = {}
    for doc in docs:
        out[doc["kind"]] = out.get(doc["kind"], 0) + 1
    return out


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def pod_spec(docs: list[Doc], kind: str) -> Doc:
    spec: Doc = one(docs, kind)["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc], kind: str) -> Doc:
    found: Doc
    (found,) = pod_spec(docs, kind)["containers"]
    return found


def args(docs: list[Doc], kind: str) -> Any:
    argv = container(docs, kind)["args"]
    if kind == "Deployment":
        return operator_command.parse_args(argv[1:])
    return agent_command.parser().parse_args(argv[1:])


def env(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {e["name"]: e for e in container(docs, kind).get("env", [])}
