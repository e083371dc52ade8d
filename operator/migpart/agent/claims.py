"""Where the kubelet plugin learns what a claim was allocated.

kubelet's NodePrepareResources carries only a claim's namespace, name and UID; the devices the
scheduler picked are in the ResourceClaim's `status.allocation`. `ClaimSource` hides where that
comes from: the API server (`KubeClaims`) in a cluster, a dict in unit tests
(`migpart.testing.claims.InMemoryClaims`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from migpart.slices.dra import RESOURCE_GROUP, RESOURCE_VERSION, AllocatedDevice, allocation_results

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient


class ClaimNotFound(LookupError):
    """The claim does not exist, has another UID, or is not allocated."""


class ClaimSource(Protocol):
    async def allocation(self, namespace: str, name: str, uid: str) -> list[AllocatedDevice]:
        """The allocated devices of the claim with this identity (every driver's)."""
        ...


def devices_of(claim: dict[str, Any], uid: str) -> list[AllocatedDevice]:
    """Allocated devices of a ResourceClaim body, checking that it is the claim kubelet meant."""
    meta = claim.get("metadata", {})
    if meta.get("uid") != uid:
        raise ClaimNotFound(
            f"claim {meta.get('namespace')}/{meta.get('name')} has UID {meta.get('uid')}, "
            f"kubelet asked for {uid}"
        )
    if not (claim.get("status") or {}).get("allocation"):
        raise ClaimNotFound(f"claim {meta.get('namespace')}/{meta.get('name')} is not allocated")
    return list(allocation_results(claim))


class KubeClaims:
    """`ClaimSource` reading resource.k8s.io/v1 ResourceClaims from the API server."""

    def __init__(self, api: ApiClient) -> None:
        from kubernetes_asyncio.client import CustomObjectsApi

        self._objects = CustomObjectsApi(api)

    async def allocation(self, namespace: str, name: str, uid: str) -> list[AllocatedDevice]:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            claim = await self._objects.get_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims", name
            )
        except ApiException as err:
            if err.status == 404:
                raise ClaimNotFound(f"claim {namespace}/{name} not found") from err
            raise
        return devices_of(claim, uid)
