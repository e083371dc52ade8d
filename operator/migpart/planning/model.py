"""The planner's inputs and outputs: a cluster snapshot, requests, a policy view, a plan.

Plain frozen dataclasses so that the planner stays pure and hashable inputs can be cached.
The JSON form of these types is the `migpart plan` contract (docs: shared plan-json contract,
implemented in `migpart.planning.codec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from migpart.mig import Instance, ModelTable, lookup_table


@dataclass(frozen=True, slots=True)
class InstanceState:
    """An existing MIG instance. `used`: allocated to a claim or running processes."""

    profile: str
    start: int
    used: bool = False

    @property
    def geometry(self) -> Instance:
        return Instance(self.profile, self.start)


@dataclass(frozen=True, slots=True)
class GpuState:
    node: str
    index: int
    model: str
    instances: tuple[InstanceState, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuState, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The GPUs the planner may change. `tables` are supplied profile tables (they win over
    the built-in catalog, see `migpart.mig.lookup_table`)."""

    nodes: tuple[NodeState, ...]
    tables: Mapping[str, ModelTable] = field(default_factory=dict)

    def table(self, model: str) -> ModelTable:
        return lookup_table(model, dict(self.tables))


@dataclass(frozen=True, slots=True)
class Request:
    """`count` devices on one node, each of any profile in `profiles` (preference order).

    `nodes`, when set, restricts the request to those nodes (e.g. the nodes of the policy the
    request falls under, or nodes a pod's selector allows). `same_gpu` puts all `count` devices
    on one GPU of that node: a DRA claim whose constraints `matchAttribute` the GPU's
    `parentUUID` or `gpuIndex`.
    """

    name: str
    profiles: tuple[str, ...]
    count: int = 1
    priority: int = 0
    nodes: frozenset[str] | None = None
    same_gpu: bool = False


@dataclass(frozen=True, slots=True)
class Spare:
    profile: str
    count: int


@dataclass(frozen=True, slots=True)
class PolicyView:
    """What a GpuPartitionPolicy lets the planner do. `allowed` None means every profile."""

    allowed: frozenset[str] | None = None
    denied: frozenset[str] = frozenset()
    spares: tuple[Spare, ...] = ()

    def permits(self, profile: str) -> bool:
        if profile in self.denied:
            return False
        return self.allowed is None or profile in self.allowed


@dataclass(frozen=True, slots=True)
class DeviceRef:
    gpu: int
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Assignment:
    request: str
    node: str
    devices: tuple[DeviceRef, ...]


@dataclass(frozen=True, slots=True)
class GpuPlan:
    node: str
    index: int
    instances: tuple[Instance, ...]


@dataclass(frozen=True, slots=True)
class PlanStats:
    destroyed: int = 0
    created: int = 0
    gpus_changed: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """Target layout of every GPU of the snapshot, and which request gets which device."""

    gpus: tuple[GpuPlan, ...]
    assignments: tuple[Assignment, ...]
    unsatisfied: tuple[str, ...]
    stats: PlanStats
