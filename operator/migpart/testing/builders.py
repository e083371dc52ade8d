"""Bodies of the objects that tests, benchmarks and the demo write or feed: one builder each.

Chained setters and `.obj()` at the end, as kueue's test wrappers (`MakeWorkload(...).Obj()`):

    ClaimBuilder("c1", "ns").request(profile_is("3g.40gb")).allocated("n1", "gpu-0-3g40gb-0").obj()
    PodBuilder("p1", "ns").claim_template("mig-3g40gb-x1").node_selector({"pool": "a"}).obj()

A body holds only what its setters put in it, beside apiVersion, kind, metadata and what the
object cannot go without (a pod's one container, a slice's driver, node and pool), so a test
states exactly the fields it cares about.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from migpart.api.models import (
    GROUP,
    VERSION,
    GpuStatus,
    MigInstanceStatus,
    MigNodeSpec,
    MigNodeStatus,
    ProfileInfo,
)
from migpart.mig import builtin_table
from migpart.slices.dra import DEVICE_CLASS, DRIVER

H100 = "NVIDIA H100 80GB HBM3"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
RESOURCE_API = "resource.k8s.io/v1"
MIGPART_API = f"{GROUP}/{VERSION}"
POOL_LABEL = f"{GROUP}/pool"
"""The node label that the tests, the benchmarks and the demo group their nodes by."""
PARENT_UUID = f"{DRIVER}/parentUUID"
"""The attribute two requests match on to land on one GPU."""


def profile_is(profile: str) -> str:
    """A CEL selector: a MIG device of this profile."""
    return f'device.attributes["{DRIVER}"].profile == "{profile}"'


def memory_at_least(memory_mib: int) -> str:
    """A CEL selector: a MIG device with at least this much memory."""
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{memory_mib}Mi")) >= 0'


def gpu_status(
    index: int,
    *instances: tuple[str, int, str],
    model: str = H100,
    mig: bool = True,
    uuid: str | None = None,
) -> GpuStatus:
    """A GPU of a MigNode's status as its agent reports it, with its model's built-in profile
    table; `instances` are (profile, start, state)."""
    table = builtin_table(model)
    if table is None:
        raise ValueError(f"no built-in profile table for {model}")
    return GpuStatus(
        index=index,
        uuid=uuid or f"GPU-{index}",
        model=model,
        mig_enabled=mig,
        compute_slices=table.compute_slices,
        memory_slices=table.memory_slices,
        profiles=[ProfileInfo.from_profile(p) for p in table.profiles],
        instances=[
            MigInstanceStatus(profile=p, start=s, uuid=f"MIG-{index}-{p}-{s}", state=state)
            for p, s, state in instances
        ],
    )


class _Meta:
    def __init__(self, name: str, namespace: str | None) -> None:
        self.metadata: dict[str, Any] = {"name": name}
        if namespace is not None:
            self.metadata["namespace"] = namespace

    def uid(self, uid: str) -> Self:
        self.metadata["uid"] = uid
        return self

    def revision(self, revision: int) -> Self:
        """metadata.resourceVersion."""
        self.metadata["resourceVersion"] = str(revision)
        return self

    def generation(self, generation: int) -> Self:
        self.metadata["generation"] = generation
        return self

    def labels(self, labels: Mapping[str, str]) -> Self:
        self.metadata.setdefault("labels", {}).update(labels)
        return self

    def _object(self, api_version: str, kind: str, **parts: Any) -> dict[str, Any]:
        """The object of this metadata with these top-level parts (spec, status), in that
        order; a part that is None is left out."""
        body: dict[str, Any] = {"apiVersion": api_version, "kind": kind}
        body["metadata"] = dict(self.metadata)
        body.update({key: part for key, part in parts.items() if part is not None})
        return body


class _SpecFields(_Meta):
    """A builder whose spec takes fields as they are."""

    def __init__(self, name: str, namespace: str | None, spec: dict[str, Any]) -> None:
        super().__init__(name, namespace)
        self._spec = spec

    def spec(self, **fields: Any) -> Self:
        """Spec fields as they are (camelCase)."""
        self._spec.update(fields)
        return self


class ClaimBuilder(_Meta):
    """A ResourceClaim (`obj()`) or a ResourceClaimTemplate of the same spec (`template()`)."""

    def __init__(self, name: str, namespace: str | None = None) -> None:
        super().__init__(name, namespace)
        self._requests: list[dict[str, Any]] = []
        self._constraints: list[dict[str, Any]] = []
        self._results: list[dict[str, Any]] = []
        self._reserved_for: list[dict[str, Any]] = []

    def request(
        self,
        *selectors: str,
        name: str = "gpu",
        count: int | None = None,
        device_class: str = DEVICE_CLASS,
        **exactly: Any,
    ) -> Self:
        """One `exactly` request of `device_class` with these CEL selectors (camelCase extras:
        allocationMode, adminAccess, ...)."""
        body: dict[str, Any] = {"deviceClassName": device_class}
        if count is not None:
            body["count"] = count
        if selectors:
            body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
        self._requests.append({"name": name, "exactly": {**body, **exactly}})
        return self

    def raw_request(self, request: Mapping[str, Any]) -> Self:
        """A request body as is (firstAvailable, or a malformed one)."""
        self._requests.append(dict(request))
        return self

    def same_gpu(self, *requests: str) -> Self:
        """A constraint: the devices of `requests` (all, when none named) share one GPU."""
        constraint: dict[str, Any] = {"requests": list(requests)} if requests else {}
        self._constraints.append({**constraint, "matchAttribute": PARENT_UUID})
        return self

    def constraint(self, constraint: Mapping[str, Any]) -> Self:
        self._constraints.append(dict(constraint))
        return self

    def allocated(
        self,
        pool: str,
        device: str,
        request: str = "gpu",
        driver: str = DRIVER,
    ) -> Self:
        """status.allocation gets this result (pool = node name for our driver)."""
        result = {"request": request, "driver": driver, "pool": pool, "device": device}
        self._results.append(result)
        return self

    def reserved_for(self, pod: str, uid: str = "") -> Self:
        self._reserved_for.append({"resource": "pods", "name": pod, "uid": uid or f"uid-{pod}"})
        return self

    def _spec(self) -> dict[str, Any]:
        devices: dict[str, Any] = {"requests": list(self._requests)}
        if self._constraints:
            devices["constraints"] = list(self._constraints)
        return {"devices": devices}

    def obj(self) -> dict[str, Any]:
        status: dict[str, Any] = {}
        if self._results:
            status["allocation"] = {"devices": {"results": list(self._results)}}
        if self._reserved_for:
            status["reservedFor"] = list(self._reserved_for)
        return self._object(RESOURCE_API, "ResourceClaim", spec=self._spec(), status=status or None)

    def template(self) -> dict[str, Any]:
        return self._object(RESOURCE_API, "ResourceClaimTemplate", spec={"spec": self._spec()})


class PodBuilder(_SpecFields):
    """A pod with one container that uses every claim of the pod."""

    def __init__(self, name: str, namespace: str | None = None) -> None:
        super().__init__(name, namespace, {})
        self._container: dict[str, Any] = {"name": "c", "image": PAUSE_IMAGE}
        self._env: list[dict[str, str]] | None = None
        self._claims: list[dict[str, str]] = []
        self._status: dict[str, Any] | None = None

    def container(self, name: str, image: str = PAUSE_IMAGE) -> Self:
        self._container = {"name": name, "image": image}
        return self

    def env(self, name: str, value: str) -> Self:
        """An environment variable of the container."""
        self._env = [*(self._env or []), {"name": name, "value": value}]
        return self

    def claim(self, claim: str, name: str = "gpu") -> Self:
        """The pod uses the ResourceClaim `claim`."""
        self._claims.append({"name": name, "resourceClaimName": claim})
        return self

    def claim_template(self, template: str, name: str = "gpu") -> Self:
        """The pod's claim is made from the ResourceClaimTemplate `template`."""
        self._claims.append({"name": name, "resourceClaimTemplateName": template})
        return self

    def node_selector(self, selector: Mapping[str, str]) -> Self:
        self._spec["nodeSelector"] = dict(selector)
        return self

    def ends(self) -> Self:
        """A pod that runs once and gives its node up at once: restartPolicy Never, no grace."""
        return self.spec(restartPolicy="Never", terminationGracePeriodSeconds=0)

    def status(self, **fields: Any) -> Self:
        self._status = {**(self._status or {}), **fields}
        return self

    def unschedulable(self, message: str = "cannot allocate all claims") -> Self:
        """status.conditions as kube-scheduler leaves a pod it could not place."""
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
        }
        return self.status(conditions=[condition])

    def obj(self) -> dict[str, Any]:
        container = dict(self._container)
        if self._env is not None:
            container["env"] = list(self._env)
        spec: dict[str, Any] = {"containers": [container], **self._spec}
        if self._claims:
            container["resources"] = {"claims": [{"name": c["name"]} for c in self._claims]}
            spec["resourceClaims"] = list(self._claims)
        status = None if self._status is None else dict(self._status)
        return self._object("v1", "Pod", spec=spec, status=status)


class MigNodeBuilder(_Meta):
    """A MigNode: the operator's spec and the agent's status as the models dump them."""

    def __init__(self, name: str) -> None:
        super().__init__(name, None)
        self._spec: dict[str, Any] | None = None
        self._status: dict[str, Any] | None = None

    def spec(self, spec: MigNodeSpec | Mapping[str, Any]) -> Self:
        self._spec = _dump(spec) if isinstance(spec, MigNodeSpec) else dict(spec)
        return self

    def status(self, status: MigNodeStatus | Mapping[str, Any]) -> Self:
        self._status = _dump(status) if isinstance(status, MigNodeStatus) else dict(status)
        return self

    def obj(self) -> dict[str, Any]:
        return self._object(MIGPART_API, "MigNode", spec=self._spec, status=self._status)


class SliceBuilder(_SpecFields):
    """A ResourceSlice of our driver: one pool per node, named after it."""

    def __init__(self, name: str, node: str, generation: int = 1) -> None:
        pool = {"name": node, "generation": generation, "resourceSliceCount": 1}
        super().__init__(name, None, {"driver": DRIVER, "nodeName": node, "pool": pool})
        self._spec["devices"] = []

    def device(self, name: str, **attributes: str | int) -> Self:
        """A device with these attributes (strings, or ints as `int`)."""
        self._spec["devices"].append(
            {
                "name": name,
                "attributes": {
                    k: {"int": v} if isinstance(v, int) else {"string": v}
                    for k, v in attributes.items()
                },
            }
        )
        return self

    def counter_set(self, name: str, counters: Mapping[str, int]) -> Self:
        """A shared counter set (KEP-4815); such a slice carries no devices, not even `[]`."""
        self._spec.pop("devices", None)
        self._spec.setdefault("sharedCounters", []).append(
            {"name": name, "counters": {k: {"value": str(v)} for k, v in counters.items()}}
        )
        return self

    def consumes(self, counter_set: str, counters: Mapping[str, int], **fields: Any) -> Self:
        """The last device consumes `counters` of `counter_set` (camelCase extras on the
        device: bindingConditions, taints, ...)."""
        device = self._spec["devices"][-1]
        device.setdefault("consumesCounters", []).append(
            {
                "counterSet": counter_set,
                "counters": {k: {"value": str(v)} for k, v in counters.items()},
            }
        )
        device.update(fields)
        return self

    def taint(self, key: str, effect: str, value: str = "") -> Self:
        """The last device gets a device taint (KEP-5055)."""
        taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
        self._spec["devices"][-1].setdefault("taints", []).append(taint)
        return self

    def obj(self) -> dict[str, Any]:
        return self._object(RESOURCE_API, "ResourceSlice", spec=self._spec)


class PolicyBuilder(_SpecFields):
    """A GpuPartitionPolicy."""

    def __init__(self, name: str) -> None:
        super().__init__(name, None, {})

    def pool(self, labels: Mapping[str, str]) -> Self:
        """The nodes it manages: those with all of these labels."""
        self._spec["nodeSelector"] = {"matchLabels": dict(labels)}
        return self

    def obj(self) -> dict[str, Any]:
        return self._object(MIGPART_API, "GpuPartitionPolicy", spec=dict(self._spec))


def _dump(model: MigNodeSpec | MigNodeStatus) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return dumped
