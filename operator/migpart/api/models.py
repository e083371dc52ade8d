"""pydantic models of the migpart CRDs: the single source of truth for `crds/*.yaml`.

Every CRD body is parsed once at the boundary (`Model.model_validate(body)`) and dumped with
`model.model_dump(by_alias=True, exclude_none=True, mode="json")`. Python attributes are
snake_case, JSON is camelCase. The validation rules live twice on purpose: as pydantic
validators (so `migpart plan` and unit tests reject bad input with a field path) and as OpenAPI
constraints plus `x-kubernetes-validations` CEL rules in the generated CRDs (so the API server
rejects bad objects before anything reads them). `migpart.api.crdgen` turns the pydantic JSON
schema of these models into the CRDs; keep the CEL rules below in step with the validators.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from migpart.api.base import _map_list, _Model, _rules, _set_list
from migpart.api.selectors import LabelSelector
from migpart.mig import Instance
from migpart.mig.profiles import PROFILE_NAME_RE, ModelTable, Profile
from migpart.planning.model import PolicyView, Spare

GROUP = "migpart.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
"""`apiVersion` of both kinds (the models' `api_version` literals must equal it)."""

MIGNODE_KIND = "MigNode"
MIGNODE_PLURAL = "mignodes"
POLICY_KIND = "GpuPartitionPolicy"
POLICY_PLURAL = "gpupartitionpolicies"

# Bounds that keep the CEL rules within the API server's cost budget and objects small;
# docs/api.md states them. Every catalog model fits (at most 7 instances per GPU, starts up to
# 6); a MigNode spec lists at most MAX_GPUS GPUs, so a node with more cannot be repartitioned.
MAX_PROFILES = 32
MAX_SPARES = 16
MAX_GPUS = 16
MAX_GPU_INDEX = 63
MAX_INSTANCES_PER_GPU = 8
MAX_START = 15
MAX_PROFILE_NAME = 32

ProfileName = Annotated[
    str, StringConstraints(pattern=PROFILE_NAME_RE.pattern, max_length=MAX_PROFILE_NAME)
]
# Names read from NVML on a node are reported as they are, even if a future GPU uses a syntax
# that the spec-side pattern does not know yet.
ReportedProfileName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
NonNegative = Annotated[int, Field(ge=0)]


class Condition(_Model):
    """A metav1.Condition: the state of one aspect of the object."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, StringConstraints(max_length=128)]
    message: Annotated[str, StringConstraints(max_length=4096)] = ""
    last_transition_time: str | None = None
    observed_generation: NonNegative | None = None


def condition_of(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition `type_`, or None when it is absent."""
    return next((c for c in conditions if c.type == type_), None)


def condition_status(conditions: list[Condition], type_: str) -> str | None:
    """The status of the condition `type_`, or None when it is absent."""
    found = condition_of(conditions, type_)
    return found.status if found is not None else None


# --------------------------------------------------------------------------- MigNode


class MigInstanceSpec(_Model):
    """One desired MIG instance: profile at a start index in memory-slice units."""

    profile: ProfileName
    start: Annotated[int, Field(ge=0, le=MAX_START)]


class GpuSpec(_Model):
    """The desired instances of one GPU (by NVML index)."""

    index: Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
    instances: Annotated[list[MigInstanceSpec], Field(max_length=MAX_INSTANCES_PER_GPU)] = []
    """Every instance the GPU should have; anything else that is free gets destroyed."""


class MigNodeSpec(_Model):
    """Desired layout; written by the operator only."""

    plan_id: Annotated[str, StringConstraints(max_length=128)] | None = None
    """Identifies this desired layout; the agent echoes it as status.observedPlanId."""
    gpus: Annotated[list[GpuSpec], _map_list("index", MAX_GPUS)] = []
    leader_term: NonNegative | None = None
    """The fencing token of the operator's leadership term that wrote this spec (the election
    Lease's leaseTransitions when the term began). The agent refuses a spec whose token is lower
    than one it already applied; absent: written without leader election, applied as before."""
    allocation: Literal["Reactive", "Offer"] | None = None
    """Offer: the node's pool lists every placement with its GPU's counters, and instances are
    made when kubelet prepares a claim (a free instance in the way destroyed first) and kept,
    free, after; the GPUs listed are instances to make ahead, and the agent destroys nothing on
    its own. Absent or Reactive: the agent makes the GPUs listed exactly what they say."""

    def desired(self) -> dict[int, frozenset[Instance]]:
        """What this spec wants: GPU index -> its instances, for the GPUs it lists.

        The one definition that the agent (what to create and destroy), the slice publisher
        (which devices are still wanted) and the planner's snapshot (the layout a node is
        moving to) share; the destroy protocol is safe only while they agree. Without a
        `planId` the spec wants nothing, whatever it lists: the operator always writes one,
        so such a spec was not written by a plan (the agent's own empty MigNode, or a hand
        edit), and a GPU absent here is left as it is by all three.
        """
        if self.plan_id is None:
            return {}
        return {
            g.index: frozenset(Instance(i.profile, i.start) for i in g.instances) for g in self.gpus
        }


class ProfileInfo(_Model):
    """One GPU-instance profile as NVML reports it on the node."""

    name: ReportedProfileName
    compute_slices: NonNegative
    memory_slices: NonNegative
    placements: list[NonNegative]
    max_instances: NonNegative
    memory_mib: NonNegative = Field(alias="memoryMiB")
    multiprocessors: NonNegative = 0
    copy_engines: NonNegative = 0
    decoders: NonNegative = 0
    encoders: NonNegative = 0
    jpegs: NonNegative = 0
    ofas: NonNegative = 0

    @classmethod
    def from_profile(cls, p: Profile) -> ProfileInfo:
        return cls.model_validate({name: getattr(p, name) for name in cls.model_fields})

    def to_profile(self) -> Profile:
        fields = self.model_dump()
        fields["placements"] = tuple(self.placements)
        return Profile(**fields)


InstanceStateName = Literal["Free", "Prepared", "Busy"]


class MigInstanceStatus(_Model):
    """An existing MIG instance. `claims`: "namespace/name" of the claims prepared on it."""

    profile: ReportedProfileName
    start: NonNegative
    uuid: str
    state: InstanceStateName
    claims: list[str] = []


class GpuStatus(_Model):
    """One GPU as the agent reads it from NVML."""

    index: NonNegative
    uuid: str
    model: str
    mig_enabled: bool
    compute_slices: NonNegative
    memory_slices: NonNegative
    profiles: list[ProfileInfo] = []
    """The GPU-instance profile table read from NVML."""
    instances: list[MigInstanceStatus] = []

    def table(self) -> ModelTable:
        """The profile table NVML reported for this GPU (wins over the built-in catalog)."""
        return ModelTable(
            model=self.model,
            compute_slices=self.compute_slices,
            memory_slices=self.memory_slices,
            profiles=tuple(p.to_profile() for p in self.profiles),
        )


class FailedInstance(MigInstanceSpec):
    """A spec instance not created, or an offering node's unusable placement (the reason)."""

    gpu: Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
    reason: Literal["Overlap", "NvmlError"]
    message: Annotated[str, StringConstraints(max_length=1024)] = ""


class MigNodeSummary(_Model):
    """Counts for `kubectl get mn` (printer columns take JSONPath only, no arithmetic), filled
    by the agent with every status write (`MigNodeStatus.summarized`): `synced` is
    `observedPlanId == spec.planId` at the time of the write."""

    gpus: NonNegative = 0
    instances: NonNegative = 0
    free: NonNegative = 0
    synced: bool = False


class KubeletPluginStatus(_Model):
    """Whether kubelet registered the agent's DRA plugin (its `NotifyRegistrationStatus`
    call). Reported only by agents started with `--report-registration`; the operator
    publishes a node's devices only while this is absent or `registered` is true."""

    registered: bool
    message: Annotated[str, StringConstraints(max_length=1024)] = ""


class MigNodeStatus(_Model):
    """Actual layout and inventory; written by the agent (the operator adds only the `Stale`
    condition while the agent's lease has expired, as the node lifecycle controller does for a
    Node whose kubelet stopped)."""

    observed_plan_id: Annotated[str, StringConstraints(max_length=128)] | None = None
    """The spec.planId whose layout the agent last carried out."""
    gpus: Annotated[list[GpuStatus], _map_list("index")] = []
    lost_gpus: Annotated[
        list[Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]], Field(max_length=MAX_GPU_INDEX + 1)
    ] = []
    """GPUs NVML reports lost (GPU_IS_LOST, fallen off the bus), left out of `gpus`: nothing
    is planned or published on them, and they do not hold back `observedPlanId`."""
    conditions: Annotated[list[Condition], _map_list("type")] = []
    failed_instances: Annotated[list[FailedInstance], Field(max_length=64)] = []
    summary: MigNodeSummary | None = None
    """Counts for the printer columns of `kubectl get mignodes`."""
    kubelet_plugin: KubeletPluginStatus | None = None
    """Whether kubelet registered the DRA plugin (absent: the agent does not report it)."""
    leader_term: NonNegative | None = None
    """The highest spec.leaderTerm the agent applied: kept here so that a restarted agent still
    refuses a spec from an older leadership."""

    def summarized(self, plan_id: str | None) -> MigNodeStatus:
        """This status with `summary` recomputed against the spec's `plan_id`."""
        instances = [i for g in self.gpus for i in g.instances]
        summary = MigNodeSummary(
            gpus=len(self.gpus),
            instances=len(instances),
            free=sum(1 for i in instances if i.state == "Free"),
            synced=self.observed_plan_id == plan_id,
        )
        return self.model_copy(update={"summary": summary})


class MigNode(_Model):
    """The MIG state of one node (cluster-scoped, named after the Node)."""

    api_version: Literal["migpart.io/v1alpha1"] = "migpart.io/v1alpha1"
    kind: Literal["MigNode"] = "MigNode"
    metadata: dict[str, Any] = {}
    spec: MigNodeSpec | None = None
    status: MigNodeStatus | None = None

    def desired(self) -> dict[int, frozenset[Instance]]:
        """`MigNodeSpec.desired` of the spec; nothing without one."""
        return self.spec.desired() if self.spec is not None else {}


# --------------------------------------------------------------------------- GpuPartitionPolicy

PolicyMode = Literal["Active", "DryRun"]
AllocationMode = Literal["Reactive", "Offer", "Auto"]
_ALLOW_DENY_RULE = {
    "rule": "!has(self.allow) || !has(self.deny) || !self.allow.exists(p, p in self.deny)",
    "message": "spec.profiles: allow and deny must not name the same profile",
    "reason": "FieldValueInvalid",
}


class ProfileFilter(_Model):
    """Which profiles may be created. Empty `allow`: every profile the GPU offers."""

    model_config = ConfigDict(json_schema_extra=_rules(_ALLOW_DENY_RULE))

    allow: Annotated[list[ProfileName], _set_list(MAX_PROFILES)] = []
    """Profiles migpart may create; empty or absent: every profile the GPU offers."""
    deny: Annotated[list[ProfileName], _set_list(MAX_PROFILES)] = []
    """Profiles migpart never creates; must not name a profile that allow names."""

    @model_validator(mode="after")
    def _allow_deny_disjoint(self) -> ProfileFilter:
        both = sorted(set(self.allow) & set(self.deny))
        if both:
            raise ValueError(
                f"allow and deny must not name the same profile (both name {', '.join(both)})"
            )
        for name, names in (("allow", self.allow), ("deny", self.deny)):
            if len(set(names)) != len(names):
                raise ValueError(f"{name} names a profile twice")
        return self


class SpareSpec(_Model):
    """Keep `count` free instances of `profile` ready across the policy's nodes."""

    profile: ProfileName
    count: Annotated[int, Field(ge=0, le=1024)]


class Reconfiguration(_Model):
    """Disruption limits."""

    batch_window_seconds: Annotated[int, Field(ge=0, le=3600)] = 2
    """Gather pending claims this long before planning."""
    max_concurrent_nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    """Nodes being repartitioned at once."""


_SPARES_NOT_DENIED_RULE = {
    "rule": "!has(self.spares) || !has(self.profiles) || !has(self.profiles.deny)"
    " || self.spares.all(s, !(s.profile in self.profiles.deny))",
    "message": "spec.spares: a spare profile must not be denied by spec.profiles.deny",
    "fieldPath": ".spares",
    "reason": "FieldValueInvalid",
}
_SPARES_ALLOWED_RULE = {
    "rule": "!has(self.spares) || !has(self.profiles) || !has(self.profiles.allow)"
    " || size(self.profiles.allow) == 0 || self.spares.all(s, s.profile in self.profiles.allow)",
    "message": "spec.spares: a spare profile must be listed in spec.profiles.allow when allow is"
    " set",
    "fieldPath": ".spares",
    "reason": "FieldValueInvalid",
}


class GpuPartitionPolicySpec(_Model):
    """Which nodes migpart manages, which profiles it may create, how fast it may change them."""

    model_config = ConfigDict(
        json_schema_extra=_rules(_SPARES_NOT_DENIED_RULE, _SPARES_ALLOWED_RULE)
    )

    mode: PolicyMode = "Active"
    """Active changes MIG layouts; DryRun plans and reports, and changes nothing."""
    priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    """A node matched by several policies follows the one with the highest priority."""
    node_selector: LabelSelector = LabelSelector()
    """Nodes (by Node labels) this policy manages; empty selects every node with a MigNode."""
    profiles: ProfileFilter = ProfileFilter()
    spares: Annotated[list[SpareSpec], _map_list("profile", MAX_SPARES)] = []
    """Free instances to keep ready across the policy's nodes."""
    reconfiguration: Reconfiguration = Reconfiguration()
    allocation: AllocationMode = "Auto"
    """Reactive, Offer, or Auto: Offer where the API server serves it (docs/offer-mode.md)."""

    @model_validator(mode="after")
    def _spares_permitted(self) -> GpuPartitionPolicySpec:
        seen: set[str] = set()
        for s in self.spares:
            if s.profile in seen:
                raise ValueError(f"spares: profile {s.profile} is listed twice")
            seen.add(s.profile)
            if s.profile in self.profiles.deny:
                raise ValueError(f"spares: profile {s.profile} is denied by profiles.deny")
            if self.profiles.allow and s.profile not in self.profiles.allow:
                raise ValueError(f"spares: profile {s.profile} is not in profiles.allow")
        return self

    def policy_view(self) -> PolicyView:
        """What this policy lets the planner do (empty `allow` means every profile)."""
        return PolicyView(
            allowed=frozenset(self.profiles.allow) if self.profiles.allow else None,
            denied=frozenset(self.profiles.deny),
            spares=tuple(Spare(s.profile, s.count) for s in self.spares if s.count > 0),
        )


class LastPlan(_Model):
    """The outcome of the policy's most recent planning round."""

    plan_id: str
    time: str
    duration_millis: Annotated[float, Field(ge=0)]
    satisfied: NonNegative
    unsatisfied: NonNegative
    created: NonNegative
    destroyed: NonNegative


MAX_LISTED_NODES = 64
UnavailableReason = Literal["NotOptedIn", "PublisherOverlap", "LeaseExpired", "PluginNotRegistered"]
"""Why the operator leaves a node alone (`controller/core/health.py`): the node lacks the
opt-in label (`--node-selector`), another publisher offers its GPUs (the agent's `PublisherOverlap`
condition), its agent's Lease expired, or kubelet has not registered the DRA plugin."""

PUBLISHER_OVERLAP = "PublisherOverlap"
"""The MigNode condition in which the agent says whether NVIDIA's device plugin or DRA driver
already offers the node's GPUs (True: the agent manages nothing there, the operator publishes
nothing; `migpart.agent.publishers`)."""


class UnavailableNode(_Model):
    """A node the operator does not plan on or publish devices for, and why."""

    name: Annotated[str, StringConstraints(max_length=253)]
    reason: UnavailableReason


class AllocationStatus(_Model):
    """The allocation mode in effect: spec.allocation resolved against the API server."""

    mode: Literal["Reactive", "Offer"]
    reason: Annotated[str, StringConstraints(max_length=1024)] = ""


class GpuPartitionPolicyStatus(_Model):
    """What the policy currently covers and what the operator last did; operator-written."""

    observed_generation: NonNegative | None = None
    nodes: NonNegative = 0
    """Nodes this policy manages."""
    gpus: NonNegative = 0
    """MIG-enabled GPUs on those nodes."""
    pending_requests: NonNegative = 0
    """Claims under this policy that no plan could satisfy yet."""
    last_plan: LastPlan | None = None
    unavailable_nodes: Annotated[list[UnavailableNode], Field(max_length=MAX_LISTED_NODES)] = []
    """Nodes of this policy left out of planning (first MAX_LISTED_NODES by name)."""
    allocation: AllocationStatus | None = None
    conditions: Annotated[list[Condition], _map_list("type")] = []


class GpuPartitionPolicy(_Model):
    """A GpuPartitionPolicy (cluster-scoped)."""

    api_version: Literal["migpart.io/v1alpha1"] = "migpart.io/v1alpha1"
    kind: Literal["GpuPartitionPolicy"] = "GpuPartitionPolicy"
    metadata: dict[str, Any] = {}
    spec: GpuPartitionPolicySpec = GpuPartitionPolicySpec()
    status: GpuPartitionPolicyStatus | None = None
