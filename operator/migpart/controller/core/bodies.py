"""Plain API bodies as the indexes hold them: the few readings every part of the
controller makes of them."""

from __future__ import annotations

from typing import Any

from migpart.api.models import GpuPartitionPolicy
from migpart.types import Body


def strip(
    body: Body, keys: tuple[str, ...] = ("apiVersion", "kind", "metadata", "spec", "status")
) -> dict[str, Any]:
    """The fields the pydantic model knows, as plain data."""
    return {k: body[k] for k in keys if k in body}


def parse_policy(body: Body) -> GpuPartitionPolicy:
    """The policy without its status: the status is ours, and a field someone else added
    there must not make the spec unreadable."""
    return GpuPartitionPolicy.model_validate(
        strip(body, ("apiVersion", "kind", "metadata", "spec"))
    )


def revision_of(body: Body) -> str:
    return str((body.get("metadata") or {}).get("resourceVersion") or "")


def name_of(body: Body) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def uid_of(body: Body) -> str:
    return str((body.get("metadata") or {}).get("uid") or "")
