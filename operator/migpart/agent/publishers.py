"""Other publishers of the node's GPUs: the overlap guard.

A GPU that NVIDIA's device plugin or NVIDIA's DRA driver already offers must not be offered by
migpart too: kube-scheduler (or kubelet's device manager) would hand one MIG device to two pods.
So before it manages anything, and again at each resync, the agent looks for them:

- NVIDIA's device plugin: the Node's allocatable carries `nvidia.com/gpu` (or a renamed
  `nvidia.com/gpu.<name>`, e.g. time-slicing's `gpu.shared`) or `nvidia.com/mig-<profile>` with
  a quantity other than 0 (kubelet keeps a resource at 0 after its plugin is gone);
- NVIDIA's DRA driver: a ResourceSlice of driver `gpu.nvidia.com` for the node.

While one is found the agent creates and destroys nothing, reports the condition
`PublisherOverlap` (True) on its MigNode with what it found, posts a Warning Event and sets the
metric `migpart_agent_publisher_overlap`; the operator then publishes no device of the node
(`NodeHealth`, reason `PublisherOverlap`). `--allow-publisher-overlap` overrides it for users who
know better (e.g. a device plugin that serves other GPUs of the node): the condition is then
False with reason `Overridden`, and the agent manages the node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kubernetes_asyncio.client import CoreV1Api, ResourceV1Api

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

NVIDIA_DRA_DRIVER = "gpu.nvidia.com"
Publisher = Literal["DevicePlugin", "DraDriver"]
PUBLISHERS: tuple[Publisher, ...] = ("DevicePlugin", "DraDriver")


@dataclass(frozen=True)
class Overlap:
    """What offers the node's GPUs besides migpart: each publisher found, with what it offers."""

    found: Mapping[Publisher, tuple[str, ...]]

    @property
    def reason(self) -> Publisher:
        return next(iter(self.found))

    def describe(self) -> str:
        parts = []
        if "DevicePlugin" in self.found:
            parts.append(
                "NVIDIA's device plugin (node allocatable: "
                + ", ".join(self.found["DevicePlugin"])
                + ")"
            )
        if "DraDriver" in self.found:
            parts.append(
                f"NVIDIA's DRA driver (ResourceSlices of driver {NVIDIA_DRA_DRIVER}: "
                + ", ".join(self.found["DraDriver"])
                + ")"
            )
        return " and ".join(parts) + " already offer this node's GPUs"


def device_plugin_resources(allocatable: Mapping[str, str]) -> tuple[str, ...]:
    """The NVIDIA device plugin's resources in a Node's allocatable, as `name: quantity`, those
    at 0 left out."""
    found = []
    for name, quantity in sorted(allocatable.items()):
        nvidia_gpu = name == "nvidia.com/gpu" or name.startswith(
            ("nvidia.com/gpu.", "nvidia.com/mig-")
        )
        if nvidia_gpu and str(quantity).strip() not in ("0", ""):
            found.append(f"{name}: {quantity}")
    return tuple(found)


def overlap_of(allocatable: Mapping[str, str], nvidia_slices: list[str]) -> Overlap | None:
    """The overlap a Node's allocatable and its `gpu.nvidia.com` slices (names) show, if any."""
    found: dict[Publisher, tuple[str, ...]] = {}
    resources = device_plugin_resources(allocatable)
    if resources:
        found["DevicePlugin"] = resources
    if nvidia_slices:
        found["DraDriver"] = tuple(sorted(nvidia_slices))
    return Overlap(found) if found else None


class PublisherProbe(Protocol):
    async def overlap(self) -> Overlap | None:
        """Whether another publisher offers the node's GPUs now. Raises the client's errors."""
        ...


class KubePublishers:
    """`PublisherProbe` on the API server: the agent's Node (get) and the node's ResourceSlices
    of NVIDIA's DRA driver (list, by field selector)."""

    def __init__(self, api: ApiClient, node: str) -> None:
        self.node = node
        self._core: Any = CoreV1Api(api)
        self._resource: Any = ResourceV1Api(api)

    async def overlap(self) -> Overlap | None:
        node = await self._core.read_node(self.node)
        allocatable = {
            k: str(v) for k, v in ((node.status and node.status.allocatable) or {}).items()
        }
        response = await self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={self.node},spec.driver={NVIDIA_DRA_DRIVER}",
            _preload_content=False,
        )
        try:
            slices = json.loads(await response.read()).get("items") or []
        finally:
            response.release()
        return overlap_of(allocatable, [s["metadata"]["name"] for s in slices])
