"""The kubelet plugin's `ClaimSource` in memory: ResourceClaim bodies a test puts in a dict."""

from __future__ import annotations

from typing import Any

from migpart.agent.claims import ClaimNotFound, devices_of
from migpart.slices.dra import AllocatedDevice


class InMemoryClaims:
    """`ClaimSource` over ResourceClaim bodies held in memory (tests)."""

    def __init__(self) -> None:
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}

    def put(self, namespace: str, name: str, uid: str, results: list[AllocatedDevice]) -> None:
        self._claims[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": r.request,
                                "driver": r.driver,
                                "pool": r.pool,
                                "device": r.device,
                            }
                            for r in results
                        ]
                    }
                }
            },
        }

    def delete(self, namespace: str, name: str) -> None:
        self._claims.pop((namespace, name), None)

    async def allocation(self, namespace: str, name: str, uid: str) -> list[AllocatedDevice]:
        claim = self._claims.get((namespace, name))
        if claim is None:
            raise ClaimNotFound(f"claim {namespace}/{name} not found")
        return devices_of(claim, uid)
