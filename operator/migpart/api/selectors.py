"""metav1.LabelSelector as a migpart CRD model: the nodes a GpuPartitionPolicy selects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from migpart.api.base import _Model, _rules

SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]

_SELECTOR_VALUES_RULE = {
    "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0)"
    " : (!has(self.values) || size(self.values) == 0)",
    "message": "values must be non-empty for operators In and NotIn, and empty for Exists and"
    " DoesNotExist",
    "fieldPath": ".values",
    "reason": "FieldValueInvalid",
}


class LabelSelectorRequirement(_Model):
    """A metav1.LabelSelectorRequirement."""

    model_config = ConfigDict(json_schema_extra=_rules(_SELECTOR_VALUES_RULE))

    key: Annotated[str, StringConstraints(min_length=1, max_length=317)]
    operator: SelectorOperator
    values: Annotated[
        list[Annotated[str, StringConstraints(max_length=63)]], Field(max_length=64)
    ] = []

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values must be non-empty for operator {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values must be empty for operator {self.operator}")
        return self


class LabelSelector(_Model):
    """A metav1.LabelSelector over Node labels; empty selects every node with a MigNode."""

    match_labels: Annotated[
        dict[
            Annotated[str, StringConstraints(max_length=317)],
            Annotated[str, StringConstraints(max_length=63)],
        ],
        Field(max_length=64),
    ] = {}
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] = []

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with `labels` is selected (metav1 semantics)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for e in self.match_expressions:
            present = e.key in labels
            if e.operator == "In" and not (present and labels[e.key] in e.values):
                return False
            if e.operator == "NotIn" and present and labels[e.key] in e.values:
                return False
            if e.operator == "Exists" and not present:
                return False
            if e.operator == "DoesNotExist" and present:
                return False
        return True


MANAGED_LABEL = "migpart.io/managed"
DEFAULT_NODE_SELECTOR = f"{MANAGED_LABEL}=true"
"""The nodes migpart manages unless told otherwise: those that opted in with this label (the
agent's DaemonSet selects it, the operator's `--node-selector` defaults to it)."""


def parse_node_selector(text: str) -> LabelSelector:
    """A label selector in the `kubectl -l` equality form, `key=value[,key2=value2]` with a bare
    `key` for "the label exists"; "" selects every node. Raises ValueError naming the part it
    cannot read (set-based forms such as `key in (a,b)` are not accepted)."""
    labels: dict[str, str] = {}
    exists: list[LabelSelectorRequirement] = []
    for raw in text.split(",") if text.strip() else []:
        part = raw.strip()
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not key or any(c in part for c in "!() ") or value.startswith("="):
            raise ValueError(
                f"node selector {text!r}: cannot read {part!r}; give key=value pairs or bare "
                "keys, separated by commas (e.g. migpart.io/managed=true)"
            )
        if eq:
            labels[key] = value
        else:
            exists.append(LabelSelectorRequirement(key=key, operator="Exists"))
    return LabelSelector(match_labels=labels, match_expressions=exists)
