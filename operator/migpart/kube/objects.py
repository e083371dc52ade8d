"""Writes to migpart's own objects: MigNode.spec (merge patch) and the policy status
(status subresource). The operator owns exactly these fields."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from migpart.api.models import (
    GROUP,
    MIGNODE_PLURAL,
    POLICY_PLURAL,
    VERSION,
    GpuPartitionPolicyStatus,
    MigNodeSpec,
)

# The generated stubs do not declare `_content_type`; without it the client picks JSON patch.
MERGE_PATCH = "application/merge-patch+json"


async def patch_mignode_spec(api: ApiClient, name: str, spec: MigNodeSpec) -> dict[str, Any]:
    """Replace the desired layout of MigNode `name` (lists are replaced whole by a merge
    patch, which is what a new plan means)."""
    body = {"spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json")}
    result: dict[str, Any] = await CustomObjectsApi(api).patch_cluster_custom_object(
        GROUP,
        VERSION,
        MIGNODE_PLURAL,
        name,
        body,
        _content_type=MERGE_PATCH,  # type: ignore[call-arg]
    )
    return result


async def patch_policy_status(
    api: ApiClient, name: str, status: GpuPartitionPolicyStatus
) -> dict[str, Any]:
    body = {"status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}
    result: dict[str, Any] = await CustomObjectsApi(api).patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        POLICY_PLURAL,
        name,
        body,
        _content_type=MERGE_PATCH,  # type: ignore[call-arg]
    )
    return result
