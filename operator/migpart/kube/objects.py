"""Writes to migpart's own objects: MigNode.spec (merge patch), the policy status (status
subresource) and a MigNode's `Stale` condition. The operator owns exactly these fields."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from migpart.api.models import (
    GROUP,
    MIGNODE_PLURAL,
    POLICY_PLURAL,
    VERSION,
    Condition,
    GpuPartitionPolicyStatus,
    MigNodeSpec,
)

# The generated stubs do not declare `_content_type`; without it the client picks JSON patch.
MERGE_PATCH = "application/merge-patch+json"


async def patch_mignode_spec(
    api: ApiClient, name: str, spec: MigNodeSpec, resource_version: str | None = None
) -> dict[str, Any]:
    """Replace the desired layout of MigNode `name`: lists are replaced whole by a merge
    patch, which is what a new plan means, and fields the spec leaves out are removed. With
    `resource_version`, only over the object as it was read (a precondition: ApiException 409
    where the agent wrote meanwhile)."""
    written = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    # a field the spec leaves out is removed (null, in a merge patch), not left as it was: a
    # node handed back from offer mode must lose `allocation: Offer`
    cleared = {k: None for k in spec.model_dump(by_alias=True, mode="json") if k not in written}
    body: dict[str, Any] = {"spec": {**cleared, **written}}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    return await _merge_patch(api, MIGNODE_PLURAL, name, body)


async def _merge_patch(
    api: ApiClient, plural: str, name: str, body: dict[str, Any], *, status: bool = False
) -> dict[str, Any]:
    """Merge-patch one of our cluster-scoped objects, or its status subresource."""
    custom = CustomObjectsApi(api)
    patch = (
        custom.patch_cluster_custom_object_status if status else custom.patch_cluster_custom_object
    )
    result: dict[str, Any] = await patch(
        GROUP,
        VERSION,
        plural,
        name,
        body,
        _content_type=MERGE_PATCH,  # type: ignore[call-arg]
    )
    return result


async def patch_policy_status(
    api: ApiClient, name: str, status: GpuPartitionPolicyStatus
) -> dict[str, Any]:
    body = {"status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}
    return await _merge_patch(api, POLICY_PLURAL, name, body, status=True)


async def patch_mignode_conditions(
    api: ApiClient, name: str, resource_version: str, conditions: list[Condition]
) -> None:
    """Write a MigNode's status conditions (the operator's `Stale`: kube/leases.py), only over
    the status they were read from (the resourceVersion precondition): the agent may have
    written meanwhile, and its conditions win. Raises ApiException 409 then; the caller tries
    again with what the watch shows next."""
    body = {
        "metadata": {"resourceVersion": resource_version},
        "status": {
            "conditions": [
                c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions
            ]
        },
    }
    await _merge_patch(api, MIGNODE_PLURAL, name, body, status=True)
