"""Which DRA features the API server serves, asked of the server itself.

Offer mode (docs/offer-mode.md) needs partitionable devices (`sharedCounters`,
`consumesCounters`: KEP-4815), and uses device taints (`devices[].taints`: KEP-5055) to evict
the pod of a placement the agent cannot make. A version string cannot say whether they are
on: each is behind a feature gate that a cluster may turn off (or, before 1.36, on). An API
server drops the fields of a disabled gate from what it stores, so a server-side dry-run create
of two ResourceSlices that use them (counters and devices must be in separate slices) answers
the question: the fields that survive in the response are served. Nothing is persisted.

The operator asks once at start-up (`discover_dra_features`) and keeps the answer: a gate
changes only with an API server restart, and the operator restarts with the cluster's upgrade.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.clock import Clock
from migpart.slices.content import SLICE_PLURAL
from migpart.slices.dra import DRIVER, RESOURCE_GROUP, RESOURCE_VERSION

log = structlog.get_logger(__name__)

# Slices that only a dry run creates: a name no driver uses, a node that need not exist.
_PROBE = "migpart-feature-probe"
_COUNTER_SET = "probe"
_COUNTER = "probe"
_TAINT = {"key": "probe.migpart.io/probe", "effect": "NoExecute"}


@dataclass(frozen=True, slots=True)
class DraFeatures:
    """What the API server serves of the DRA features offer mode needs; `detail` says how
    that was found out (or why it could not be)."""

    partitionable_devices: bool
    device_taints: bool
    detail: str

    @property
    def offer_served(self) -> bool:
        return self.partitionable_devices

    @classmethod
    def unknown(cls, why: str) -> DraFeatures:
        return cls(False, False, why)


def counters_probe() -> dict[str, Any]:
    """A ResourceSlice that declares one counter set."""
    return _slice(
        f"{_PROBE}-counters",
        {"sharedCounters": [{"name": _COUNTER_SET, "counters": {_COUNTER: {"value": "1"}}}]},
    )


def devices_probe() -> dict[str, Any]:
    """A ResourceSlice with one device that consumes that counter and has a taint."""
    device = {
        "name": "probe",
        "consumesCounters": [{"counterSet": _COUNTER_SET, "counters": {_COUNTER: {"value": "1"}}}],
        "taints": [dict(_TAINT)],
    }
    return _slice(f"{_PROBE}-devices", {"devices": [device]})


def _slice(name: str, content: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": _PROBE,
            "pool": {"name": _PROBE, "generation": 1, "resourceSliceCount": 2},
            **content,
        },
    }


def features_of(counters: Mapping[str, Any], devices: Mapping[str, Any]) -> DraFeatures:
    """What the dry-run responses to `counters_probe` and `devices_probe` say is served."""
    shared = (counters.get("spec") or {}).get("sharedCounters") or []
    listed = (devices.get("spec") or {}).get("devices") or [{}]
    device = listed[0]
    partitionable = bool(shared) and bool(device.get("consumesCounters"))
    taints = bool(device.get("taints"))
    found = {"partitionable devices": partitionable, "device taints": taints}
    served = ", ".join(name for name, on in found.items() if on)
    dropped = ", ".join(name for name, on in found.items() if not on)
    parts = (f"served: {served}" if served else "", f"not served: {dropped}" if dropped else "")
    return DraFeatures(partitionable, taints, "; ".join(p for p in parts if p))


DryRunCreate = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]
"""Create a ResourceSlice with `dryRun=All` and return what the API server answered."""


def dry_run_create(api: ApiClient) -> DryRunCreate:
    custom = CustomObjectsApi(api)

    async def create(body: dict[str, Any]) -> Mapping[str, Any]:
        answer: Mapping[str, Any] = await custom.create_cluster_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, SLICE_PLURAL, body, dry_run="All"
        )
        return answer

    return create


async def discover_dra_features(
    create: DryRunCreate, clock: Clock, attempts: int = 3
) -> DraFeatures:
    """Ask the API server (dry-run creates through `create`, nothing persisted) what it serves.

    A 400/422 (the server knows the kind but refuses the probe) means not served; a failure to
    ask (no answer, forbidden) is retried `attempts` times, then reported as unknown, which
    resolves like "not served" and says so.
    """
    why = "not asked"
    for attempt in range(attempts):
        try:
            counters = await create(counters_probe())
            devices = await create(devices_probe())
        except ApiException as e:
            if e.status in (400, 422):
                return DraFeatures.unknown(f"the API server refused the probe: {e.reason}")
            why = f"could not ask the API server: HTTP {e.status} {e.reason}"
        except (aiohttp.ClientError, TimeoutError) as e:
            why = f"could not ask the API server: {e!r}"
        else:
            features = features_of(counters, devices)
            log.info("dra_features_discovered", detail=features.detail)
            return features
        log.warning("dra_features_unknown", attempt=attempt + 1, reason=why)
        if attempt + 1 < attempts:
            await clock.sleep(2.0 * (attempt + 1))
    return DraFeatures.unknown(why)
