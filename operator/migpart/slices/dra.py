"""The DRA vocabulary that the agent and the operator share: one definition of each word.

The operator publishes devices in a node's ResourceSlice; kube-scheduler allocates them to
claims; the agent's kubelet plugin prepares what a claim's allocation names. The two sides
meet only through the API server, so they must agree on the driver name, on how a MIG instance
is named as a device, on how a claim's allocation is read, and on how a time is written into an
API object. Both import them from here.
This module is a leaf: it imports nothing of migpart but `migpart.mig` (import-linter keeps it
so), and no client library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from migpart.mig import device_name

DRIVER = "mig.migpart.io"
"""The DRA driver name: the slices' `spec.driver`, the domain of the devices' attributes and
capacity, the kubelet plugin's registered name, and the CDI vendor."""
DEVICE_CLASS = DRIVER
"""The DeviceClass of `manifests/deviceclass.yaml`, named after the driver."""
RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
KUBELET_PLUGIN_DIR = Path("/var/lib/kubelet/plugins") / DRIVER
"""Where kubelet expects the driver's DRA socket, by convention."""
KUBELET_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")


@dataclass(frozen=True, order=True, slots=True)
class DeviceId:
    """One of our devices as DRA names it: the pool it is published in (one pool per node,
    named after the node) and its name in that pool. A ResourceSlice lists it and a claim's
    allocation result names it by exactly these two strings (the driver is always ours)."""

    pool: str
    device: str

    @classmethod
    def of(cls, node: str, gpu: int, profile: str, start: int) -> DeviceId:
        """The device of the MIG instance `profile` at `start` on GPU `gpu` of `node`."""
        return cls(node, device_name(gpu, profile, start))


@dataclass(frozen=True, order=True, slots=True)
class AllocatedDevice:
    """One entry of a ResourceClaim's `status.allocation.devices.results` (any driver)."""

    request: str
    driver: str
    pool: str
    device: str

    @property
    def id(self) -> DeviceId:
        return DeviceId(self.pool, self.device)


def allocation_results(claim: Mapping[str, Any]) -> tuple[AllocatedDevice, ...]:
    """Every device the claim's `status.allocation` names, of every driver; empty while the
    claim is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return tuple(
        AllocatedDevice(
            request=str(r.get("request") or ""),
            driver=str(r.get("driver") or ""),
            pool=str(r.get("pool") or ""),
            device=str(r.get("device") or ""),
        )
        for r in results
    )


def ours(results: Iterable[AllocatedDevice], pool: str | None = None) -> list[AllocatedDevice]:
    """The results of our driver (and, if given, of one pool: a node's plugin prepares only
    its own)."""
    return [r for r in results if r.driver == DRIVER and (pool is None or r.pool == pool)]


def allocated_ids(claim: Mapping[str, Any]) -> frozenset[DeviceId]:
    """Our devices that the claim's allocation names."""
    return frozenset(r.id for r in ours(allocation_results(claim)))


def as_iso(moment: datetime) -> str:
    """`moment` (UTC) as a Kubernetes `metav1.Time` (RFC 3339, UTC, whole seconds), as
    conditions and timestamps in API objects carry it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def now_iso() -> str:
    """Now as a Kubernetes `metav1.Time` (see `as_iso`)."""
    return as_iso(datetime.now(UTC))


def micro_time(now: datetime | None = None) -> str:
    """`now` (UTC; default: now) as a Kubernetes `metav1.MicroTime`, what a Lease's
    renewTime and acquireTime hold (microseconds)."""
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
