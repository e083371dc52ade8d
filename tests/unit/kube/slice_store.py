"""An in-memory twin of the API server's ResourceSlice collection, behind the one method of
`kubernetes_asyncio.client.ApiClient` that the generated `CustomObjectsApi` calls
(`call_api`): create (409 when it exists), replace (404 when gone, 409 at a stale
resourceVersion), get and delete, with etcd-like revisions. It validates nothing else: the
real API server's limits are tested by tests/integration/test_offer_slices.py."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from migpart.slices.content import SLICE_PLURAL
from migpart.slices.dra import RESOURCE_GROUP, RESOURCE_VERSION


@dataclass
class SliceStore:
    """Stored slices by name, and every request taken (method, slice name)."""

    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    revision: int = 100
    # methods that fail once with this status before being served, e.g. {"PUT": 409}
    fail_once: dict[str, int] = field(default_factory=dict)
    client_side_validation: bool = False

    def select_header_accept(self, accepts: list[str]) -> str:
        return accepts[0]

    def select_header_content_type(self, types: list[str], *args: Any) -> str:
        return types[0]

    async def call_api(
        self,
        path: str,
        method: str,
        path_params: dict[str, Any],
        *args: Any,
        body: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any] | None:
        assert path_params["group"] == RESOURCE_GROUP
        assert path_params["version"] == RESOURCE_VERSION
        assert path_params["plural"] == SLICE_PLURAL
        name = str(path_params.get("name") or (body or {}).get("metadata", {}).get("name"))
        self.requests.append((method, name))
        status = self.fail_once.pop(method, None)
        if status is not None:
            raise ApiException(status=status)
        stored = self.slices.get(name)
        if method == "GET":
            if stored is None:
                raise ApiException(status=404)
            return copy.deepcopy(stored)
        if method == "DELETE":
            if stored is None:
                raise ApiException(status=404)
            del self.slices[name]
            return {}
        if method == "POST" and stored is not None:
            raise ApiException(status=409)
        if method == "PUT":
            if stored is None:
                raise ApiException(status=404)
            if body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise ApiException(status=409)
        self.revision += 1
        written = copy.deepcopy(body)
        written["metadata"]["resourceVersion"] = str(self.revision)
        self.slices[name] = written
        return copy.deepcopy(written)

    def pool(self, node: str) -> dict[str, tuple[int, int]]:
        """Slice name -> (pool generation, resourceSliceCount) of the node's stored slices."""
        return {
            name: (body["spec"]["pool"]["generation"], body["spec"]["pool"]["resourceSliceCount"])
            for name, body in self.slices.items()
            if body["spec"]["nodeName"] == node
        }

    def touch(self, name: str) -> None:
        """Someone else wrote the slice: a new revision the publisher has not seen."""
        self.revision += 1
        self.slices[name]["metadata"]["resourceVersion"] = str(self.revision)
