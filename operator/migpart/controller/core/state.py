"""The operator's in-memory state, shared by its handlers through kopf's `memo`.

`OperatorState` holds what every part uses (the write port, the clock, node health, the scope
cache, the loops) and, in parts of their own, what only some take: `RoundMemory` (the rounds'
memory of each policy), `DestroyMemory` (the destroy protocol's), `OfferState` (offer mode),
`Watches` (the operator's own watches and their indexes) and `Running` (its own tasks).

Everything here can be lost on restart: the cluster (indexes rebuilt from watches, MigNode.spec,
the slices) holds the truth, and each round recomputes its decisions from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client import ApiClient

from migpart.api.models import MigNode
from migpart.clock import Clock
from migpart.controller.core.effects import Effects
from migpart.controller.core.health import NodeHealth, StaleMarks
from migpart.controller.core.metrics import Metrics
from migpart.controller.core.workers import Workers
from migpart.kube.claims import AllocatedDevices
from migpart.kube.client import Credentials
from migpart.kube.election_thread import ElectionThread
from migpart.kube.features import DraFeatures
from migpart.kube.slice_publisher import SlicePublisher
from migpart.kube.snapshot import SnapshotCache
from migpart.kube.watch import Index
from migpart.offer.nodes import OfferingNodes
from migpart.planning.model import Plan, Request
from migpart.slices.dra import DeviceId

if TYPE_CHECKING:
    # Types only: OperatorState names the parts the upper layers keep in it (the scope cache,
    # the watches), which the operator's start-up makes (runtime.handlers.startup).
    from migpart.controller.rounds.scope import ScopeCache
    from migpart.controller.watching.indexes import Indexes
    from migpart.controller.watching.mignodes import MigNodeWatch

# How long a quorum-read sighting of an allocation stands in for the claim watch (which
# normally shows it within a second): after that it is forgotten even if the watch never
# showed it, e.g. because the claim was deleted in between.
FRESH_S = 60.0

# Called after the destroy protocol withdrew devices from a node's slice and before it reads
# the claims: tests use it to allocate a claim inside the window, on purpose.
WithdrawHook = Callable[[str, frozenset[str]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Sighting:
    """A claim's allocation seen by a quorum read: its devices, and when (clock.monotonic)."""

    devices: frozenset[DeviceId]
    seen: float


@dataclass(frozen=True, slots=True)
class PlanTiming:
    """When a policy last planned (clock.monotonic) and what the snapshot and plan cost."""

    at: float
    cost_s: float


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One observable step of the operator (destroy protocol, spec writes, slice writes)."""

    step: str
    node: str
    devices: frozenset[str] = frozenset()
    detail: str = ""


@dataclass
class Hooks:
    after_withdraw: WithdrawHook | None = None
    journal: list[JournalEntry] = field(default_factory=list)

    def record(self, entry: JournalEntry) -> None:
        self.journal.append(entry)


@dataclass(frozen=True)
class PlanInputs:
    """Everything a policy's plan depends on (compared, not hashed: nodes by identity first,
    as the scope cache hands out the same parsed objects while they are unchanged)."""

    nodes: tuple[MigNode, ...]
    allocated: frozenset[DeviceId]
    requests: tuple[Request, ...]
    generation: object


@dataclass
class PolicyMemory:
    """What the operator remembers of one policy between its rounds."""

    # when (clock.monotonic) its oldest pending request was first seen
    first_pending: float | None = None
    # its last plan's timing (to pace planning under a stream of changes)
    last_plan: PlanTiming | None = None
    # the inputs of its last plan carried out in full, and the plan
    plan: tuple[PlanInputs, Plan] | None = None
    # its last snapshot, kept across rounds
    snapshots: SnapshotCache = field(default_factory=SnapshotCache)
    # what the last DryRun report said (to report each decision once)
    dry_report: str | None = None
    # (uid, the status last written): to write only changes, and to build the next status
    # from, since the watch may not have shown the last write yet
    status: tuple[str, dict[str, Any]] | None = None
    # when (clock.monotonic) that status was written: a change of `pendingRequests` alone
    # waits STATUS_INTERVAL_S after it (`PolicyRound.write_status`)
    status_at: float | None = None

    def loop_stopped(self) -> None:
        """Its planning loop stopped: what only a running loop uses goes; the status written,
        the last plan's timing and the last DryRun report stay (to write only changes)."""
        self.first_pending = None
        self.plan = None
        self.snapshots = SnapshotCache()


@dataclass
class RoundMemory:
    """What the rounds remember between them (controller/rounds/reconcile.py)."""

    # policy name -> what the operator remembers of it between rounds (`memory`)
    policies: dict[str, PolicyMemory] = field(default_factory=dict)
    # (claim uid, generation) already told that nothing can satisfy it
    warned: set[tuple[str, int]] = field(default_factory=set)

    def memory(self, policy: str) -> PolicyMemory:
        """What the operator remembers of `policy` (created empty the first time)."""
        return self.policies.setdefault(policy, PolicyMemory())

    def pending_policies(self) -> int:
        """How many policies have pending requests now (they share the planning budget)."""
        return sum(1 for memory in self.policies.values() if memory.first_pending is not None)


@dataclass
class DestroyMemory:
    """What the destroy protocol (controller/rounds/destroy.py) keeps across rounds."""

    # how long to wait between the withdrawal and the confirming read
    grace_s: float = 1.0
    # claim uid -> its allocation as the destroy protocol's quorum read saw it before the claim
    # watch showed it: its devices are used and the claim is not pending, whatever the index
    # says (forgotten once the index shows the claim allocated, or after FRESH_S)
    fresh_allocations: dict[str, Sighting] = field(default_factory=dict)
    # nodes whose devices a running round has withdrawn and not yet dropped from their spec:
    # the other policies' rounds leave those withdrawals alone
    withdrawing: set[str] = field(default_factory=set)
    # the claim index's allocated devices, kept across rounds
    allocations: AllocatedDevices = field(default_factory=AllocatedDevices)


@dataclass
class OfferState:
    """Offer mode's state (migpart.offer)."""

    # what the API server serves for offer mode, asked once at start-up (kube/features.py)
    dra: DraFeatures = field(default_factory=lambda: DraFeatures.unknown("not asked yet"))
    # `migpart operator --offer-publishing`: policies whose mode in effect is Offer publish
    # offers (off: every policy is Reactive, whatever the server serves)
    publishing: bool = False
    # which nodes offer, under which policy, and what claims hold there (migpart.offer.nodes)
    nodes: OfferingNodes = field(default_factory=OfferingNodes)
    # set once this leadership's take-over has told `nodes` which nodes offer, from its
    # synced view (handlers.take_over; cleared by handlers.lead)
    known: bool = False


@dataclass
class Watches:
    """What the operator's own watches keep (set at startup, handlers.startup)."""

    # the live index views the loops read (the MigNode watch's and `watched`)
    indexes: Indexes | None = None
    # the indexes kept by the operator's own watches, by id (controller.watching.indexes.WATCHED)
    watched: dict[str, Index] = field(default_factory=dict)
    # the MigNode watch's index (controller.watching.mignodes.MigNodeWatch)
    mignodes: MigNodeWatch | None = None
    # MigNode name -> the body our last spec patch returned, until the watch shows it
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    # set once the slice watch has listed (kube/slice_watch.py): before, the publisher does not
    # know which slices exist, and would create a pool that exists at a new generation
    slices_listed: asyncio.Event = field(default_factory=asyncio.Event)

    async def synced(self) -> None:
        """Until every watched index has listed once it is not the cluster's: a round must
        not read it (an empty claim index would hide every allocated device)."""
        for index in self.watched.values():
            await index.synced.wait()
        if self.mignodes is not None:
            await self.mignodes.synced.wait()


@dataclass
class Running:
    """The operator's own tasks besides the planning loops (`OperatorState.workers`)."""

    # the task that republishes every slice periodically (handlers.resync_slices)
    resync: asyncio.Task[None] | None = None
    # the others: Lease watch, health checks, CRD wait, the watches, a take-over
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # the leader election (None: none, this operator always writes)
    elector: ElectionThread | None = None


@dataclass
class OperatorState:
    api: ApiClient
    credentials: Credentials
    publisher: SlicePublisher
    # what the operator does to the world: the API server (`KubeEffects`), or a test's
    # `InMemoryEffects`; bound to the leadership term held now (`lead`)
    effects: Effects
    # when it is, and waiting (batch windows, pacing, sightings, the grace, the loops' ticks):
    # `RealClock` in the process, a test's `ManualClock`
    clock: Clock
    # which nodes are unavailable (agent Lease expired, plugin not registered), on that clock
    health: NodeHealth
    # parsed objects and per-claim outcomes, shared by every policy's rounds and the MigNode
    # watch (rounds/scope.py)
    scopes: ScopeCache
    metrics: Metrics = field(default_factory=Metrics)
    hooks: Hooks = field(default_factory=Hooks)
    tick_s: float = 1.0
    # bumped on every change the indexes see: a loop skips a round when nothing changed
    changes: int = 0
    # one planning loop per policy (loop.plan_policy)
    workers: Workers = field(default_factory=Workers)
    # the Stale condition of nodes whose agent stopped renewing its Lease
    stale: StaleMarks = field(default_factory=StaleMarks)
    rounds: RoundMemory = field(default_factory=RoundMemory)
    destroy: DestroyMemory = field(default_factory=DestroyMemory)
    offer: OfferState = field(default_factory=OfferState)
    watches: Watches = field(default_factory=Watches)
    running: Running = field(default_factory=Running)

    def leading(self) -> bool:
        """Whether this operator leads now (its writes would be sent)."""
        return self.effects.leading()

    def publishing(self) -> bool:
        """Whether slices may be published outside the take-over and the rounds: while leading
        and, with offer publishing, once `offer.known`. Before that an offering node's pool
        would be computed as reactive mode's slice (a round, or the take-over, says which
        nodes offer), and the take-over publishes every node anyway."""
        return self.leading() and (self.offer.known or not self.offer.publishing)

    def wake_all(self) -> None:
        self.changes += 1
        self.workers.wake_all()
