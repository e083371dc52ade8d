"""The base of every migpart CRD model and the schema helpers the models share
(`migpart.api.models`): camelCase JSON, frozen, unknown fields rejected; CEL rules, set and
map lists as the API server understands them (`migpart.api.crdgen`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        alias_generator=to_camel,
        use_attribute_docstrings=True,
    )


def _rules(*rules: dict[str, str]) -> dict[str, Any]:
    """`json_schema_extra` carrying CEL rules for the CRD (see `migpart.api.crdgen`)."""
    return {"x-kubernetes-validations": list(rules)}


def _set_list(max_items: int) -> Any:
    """A list the API server treats as a set (duplicates rejected, merged by value)."""
    return Field(max_length=max_items, json_schema_extra={"x-kubernetes-list-type": "set"})


def _map_list(key: str, max_items: int | None = None) -> Any:
    """A list of objects keyed by `key` (duplicates rejected, server-side apply merges by key)."""
    return Field(
        max_length=max_items,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]},
    )
