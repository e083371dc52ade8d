"""One planning round of one GpuPartitionPolicy: scope -> plan -> destroy protocol -> spec.

A round reads the cluster from the operator's indexes, which its own watches fill
(`controller.watching.indexes`, turned into a `Cluster` value), never lists per event,
and is level-triggered: it recomputes its decisions from what the cluster says now (through
`scope.ScopeCache`, which redoes only what changed since the last round), and writes a
MigNode spec only when the plan changes a GPU's layout, so running it twice changes nothing.
Which nodes and claims a policy sees is decided in `controller.rounds.scope`. A claim no policy can
satisfy is reported once per generation (Warning `Unsatisfiable`) and never triggers a plan.

A policy whose mode in effect is Offer (`migpart.offer`) plans nothing: its rounds tell
`state.offer.nodes` which nodes offer (their pools list every placement, and kube-scheduler
allocates from them), and give each node the offering spec (`decisions.offer_spec`). A node
that stops offering gets a spec of what it has (`decisions.handed_back_spec`) before any plan
of it is made, so that its agent stops making room at prepare first.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from migpart.api.models import (
    AllocationStatus,
    GpuPartitionPolicy,
    LastPlan,
    MigNode,
    MigNodeSpec,
)
from migpart.controller.core.bodies import uid_of
from migpart.controller.core.decisions import handed_back_spec, node_spec, offer_spec
from migpart.controller.core.state import (
    JournalEntry,
    OfferState,
    OperatorState,
    PlanInputs,
    PlanTiming,
)
from migpart.controller.rounds import screening
from migpart.controller.rounds.destroy import DestroyProtocol, Redo
from migpart.controller.rounds.scope import PolicyDemand, Scope, ScopeCache
from migpart.controller.rounds.status import invalid_status, round_status
from migpart.controller.watching.indexes import Cluster, with_own_writes
from migpart.kube.claims import body_key, claim_generation
from migpart.kube.snapshot import node_name, reconfiguring
from migpart.mig import device_name
from migpart.offer.mode import acting, fell_back, resolve_allocation
from migpart.offer.nodes import NodeOffer
from migpart.planning.changes import changed_nodes, choose_nodes, layout_changes
from migpart.planning.model import GpuPlan, Plan, Snapshot
from migpart.planning.overtime import aged_requests
from migpart.planning.planner import plan as make_plan
from migpart.slices.dra import as_iso
from migpart.types import Body

log = structlog.get_logger(__name__)
MAX_REDO = 3
# Spec writes of one plan in flight at once.
SPEC_WRITES = 16


# A policy plans again at the earliest this many times its last plan's cost later, times the
# number of policies with pending requests: under a stream of changes (a burst of pods at
# 1,000 nodes) planning takes at most about a fifth of a core however many policies are busy,
# while a cheap plan (small clusters) is not held back noticeably.
PACE_FACTOR = 4.0

# A status whose only change is `pendingRequests` is written at most this often: under a burst
# of claims the count moves with every event, and a patch per move (600 in an offering
# policy's 600-pod burst) costs the API server and wakes every watcher of the policy. Any
# other change (a condition, a plan, the mode) is written at once.
STATUS_INTERVAL_S = 2.0


@dataclass
class RoundResult:
    planned: bool = False
    written_nodes: list[str] = field(default_factory=list)
    plan: Plan | None = None
    # the round held a plan back (batch window open, or paced): run again within a tick even
    # if nothing changes
    deferred: bool = False


class PolicyRound:
    """One round for one policy; `run` is the whole thing, the steps are methods so that the
    protocol reads top-down. Every effect goes through `state.effects`
    (controller/core/effects.py)."""

    def __init__(self, state: OperatorState, name: str, body: Body, cluster: Cluster) -> None:
        self.state = state
        self.effects = state.effects
        self.clock = state.clock
        self.name = name
        self.body = body
        self.cluster = with_own_writes(cluster, state.watches.written)
        self.destroy = DestroyProtocol(
            state.effects, state.hooks, state.metrics, state.clock, state.destroy
        )
        self.log = log.bind(policy=name)
        # set by run: this policy's nodes offer (migpart.offer)
        self.offering = False
        # set by run: a plan was held back (batch window open, or paced), until when (s)
        self.deferred = False
        self.retry_in_s = 0.0
        # set by write_status: a change of the pending count alone waits this long (s) to be
        # written (STATUS_INTERVAL_S); the loop runs a round again by then
        self.status_due_in_s = 0.0

    def scope(self) -> Scope | None:
        claims = self.cluster.claims
        return self.state.scopes.scope(self.name, self.cluster, self.destroy.unseen_claims(claims))

    async def run(self) -> RoundResult:
        self.state.metrics.rounds.labels(self.name).inc()
        await self.destroy.restore_leftovers()
        policy = self.state.scopes.policy(self.name, self.body)
        scope = self.scope()
        if policy is None or scope is None:
            return RoundResult()
        scope = screening.oversized(scope, self.cluster.claims)
        self.offering = self.offer_scope(policy, scope)
        excluded = screening.excluded_for(policy, self.state.scopes.excluded, self.cluster)
        self.warn_excluded(excluded)
        self.warn_unsatisfiable(scope.demand.unsatisfiable)
        self.state.metrics.pending_requests.labels(self.name).set(scope.demand.pending)
        result = RoundResult()
        last_plan: LastPlan | None = None
        # an offering policy plans nothing; a node's mode changing is written before a plan
        modes_written = await self.write_modes(scope)
        plans = not self.offering and not modes_written
        deferred = plans and not self.may_plan(policy, scope.demand)
        if scope.nodes and plans and not deferred:
            for _ in range(MAX_REDO):
                try:
                    result, last_plan = await self.plan_and_apply(policy, scope)
                    break
                except Redo:
                    self.state.wake_all()
                    # plan again on the specs this round already wrote, not on the ones the
                    # round started with: a node given a spec must not get a second one
                    self.cluster = with_own_writes(self.cluster, self.state.watches.written)
                    scope = screening.oversized(self.scope() or scope, self.cluster.claims)
        await self.write_status(policy, scope, last_plan, excluded)
        self.deferred = result.deferred = deferred
        return result

    def may_plan(self, policy: GpuPartitionPolicy, demand: PolicyDemand) -> bool:
        """Gather pending requests for `batchWindowSeconds` before planning for them; with
        nothing pending, plan at once (spares only; an unchanged plan writes nothing). Either
        way, not sooner than PACE_FACTOR times the last plan's cost after it, times the number
        of policies with pending requests (they share the budget)."""
        now = self.clock.monotonic()
        if demand.requests:
            memory = self.state.rounds.memory(self.name)
            if memory.first_pending is None:
                memory.first_pending = now
            first = memory.first_pending
            window_s = policy.spec.reconfiguration.batch_window_seconds
            if now - first < window_s:
                self.retry_in_s = first + window_s - now
                return False
        else:
            self.state.rounds.memory(self.name).first_pending = None
        paced_s = self.paced_s()
        if paced_s > 0:
            self.retry_in_s = paced_s
            return False
        return True

    def paced_s(self) -> float:
        """How long until pacing lets this policy plan again (0: now)."""
        last = self.state.rounds.memory(self.name).last_plan
        if last is None:
            return 0.0
        pace_s = PACE_FACTOR * max(1, self.state.rounds.pending_policies()) * last.cost_s
        return max(0.0, last.at + pace_s - self.clock.monotonic())

    async def plan_and_apply(
        self, policy: GpuPartitionPolicy, scope: Scope
    ) -> tuple[RoundResult, LastPlan | None]:
        began = time.perf_counter()
        allocated = self.destroy.allocated(self.cluster.claims)
        # The planner is a pure function of these: the same inputs give the same plan, whose
        # changes were written (then the nodes differ now) or could not be (nothing changed,
        # or every changed node still reconfiguring: `nodes` holds their status too).
        # Within a priority, the claims that waited longest rank first (they age by level, so
        # the inputs stay equal between levels and a known plan is still reused).
        requests = tuple(
            aged_requests(scope.demand.requests, self.cluster.waiting, self.clock.now())
        )
        inputs = PlanInputs(scope.nodes, allocated, requests, policy.metadata.get("generation"))
        memory = self.state.rounds.memory(self.name)
        known = memory.plan
        if known is not None and known[0] == inputs:
            return RoundResult(planned=True, plan=known[1]), None
        snapshot = memory.snapshots.build(scope.nodes, allocated, scope.tables)
        started = time.perf_counter()
        plan = make_plan(snapshot, requests, policy.spec.policy_view())
        duration_s = time.perf_counter() - started
        memory.last_plan = PlanTiming(self.clock.monotonic(), time.perf_counter() - began)
        self.state.metrics.plan_duration.labels(self.name).observe(duration_s)
        result, last_plan = await self.apply(policy, scope, snapshot, plan, duration_s)
        memory.plan = (inputs, plan)  # applied in full (no Redo, no error)
        return result, last_plan

    async def apply(
        self,
        policy: GpuPartitionPolicy,
        scope: Scope,
        snapshot: Snapshot,
        plan: Plan,
        duration_s: float,
    ) -> tuple[RoundResult, LastPlan | None]:
        """Carry out `plan`: the nodes it changes, as many as may reconfigure at once, get
        their spec, each after the destroy protocol cleared what it drops."""
        changes = layout_changes(snapshot, plan)
        changed = changed_nodes(changes)
        result = RoundResult(planned=True, plan=plan)
        satisfied = frozenset(a.request for a in plan.assignments)
        if not changed:
            return result, None
        busy = {node_name(n) for n in scope.nodes if reconfiguring(n)}
        chosen = choose_nodes(changed, busy, plan, policy.spec.reconfiguration.max_concurrent_nodes)
        plan_id = uuid.uuid4().hex[:16]
        targets = [g for g in plan.gpus if g.node in chosen]
        created = sum(len(c[1] - c[0]) for (node, _), c in changes.items() if node in chosen)
        destroyed = sum(len(c[0] - c[1]) for (node, _), c in changes.items() if node in chosen)
        last_plan = LastPlan(
            plan_id=plan_id,
            time=as_iso(self.clock.now()),
            duration_millis=round(duration_s * 1000, 3),
            satisfied=len(satisfied),
            unsatisfied=len(plan.unsatisfied),
            created=created,
            destroyed=destroyed,
        )
        where = ", ".join(chosen) or "(none now: waiting for nodes still reconfiguring)"
        message = (
            f"plan {plan_id}: nodes {where}; create {created}, destroy {destroyed}; "
            f"satisfies {last_plan.satisfied}, unsatisfied {last_plan.unsatisfied}"
        )
        if policy.spec.mode == "DryRun":
            memory = self.state.rounds.memory(self.name)
            if memory.dry_report != repr(targets):
                memory.dry_report = repr(targets)
                self.effects.event(self.body, "Normal", "DryRunPlan", message)
                return result, last_plan
            return result, None
        if not chosen:
            return result, None
        self.effects.event(self.body, "Normal", "Repartitioning", message)
        self.log.info(
            "plan_decided",
            plan_id=plan_id,
            nodes=chosen,
            created=created,
            destroyed=destroyed,
            satisfied=sorted(satisfied),
            unsatisfied=sorted(plan.unsatisfied),
            targets={
                f"{g.node}/{g.index}": sorted(f"{i.profile}@{i.start}" for i in g.instances)
                for g in targets
            },
        )
        by_name = {node_name(n): n for n in scope.nodes}
        work = [(by_name[name], [g for g in targets if g.node == name]) for name in chosen]
        with self.destroy.owning(chosen):
            return await self.reconfigure(work, plan_id, result, last_plan)

    async def reconfigure(
        self,
        work: list[tuple[MigNode, list[GpuPlan]]],
        plan_id: str,
        result: RoundResult,
        last_plan: LastPlan,
    ) -> tuple[RoundResult, LastPlan | None]:
        """The destroy protocol for the chosen nodes, then their specs (see `apply`)."""
        per_node = {node_name(node): targets for node, targets in work}
        cleared, kept = await self.destroy.clear(work, self.body)
        # the nodes are independent: their specs are written concurrently (at 1,000 nodes a
        # plan may reconfigure dozens, and one write after the other took seconds)
        writing = asyncio.Semaphore(SPEC_WRITES)

        async def write(name: str) -> None:
            async with writing:
                await self.write_spec(name, node_spec(plan_id, per_node[name]), plan_id)
            self.state.metrics.repartitions.labels(self.name).inc()
            result.written_nodes.append(name)

        outcomes = await asyncio.gather(*(write(n) for n in cleared), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
        if kept:
            raise Redo(kept[0])  # plan again: a device got allocated while being withdrawn
        return result, last_plan

    async def write_spec(self, name: str, spec: MigNodeSpec, plan_id: str) -> None:
        """Write MigNode `name`'s spec, and remember it until the watch shows it."""
        self.state.watches.written[name] = await self.effects.write_spec(name, spec)
        self.state.hooks.record(JournalEntry("spec_written", name, detail=plan_id))
        self.log.info("mignode_spec_written", node=name, plan_id=plan_id)

    async def write_modes(self, scope: Scope) -> bool:
        """Give every node of the scope the spec of its mode where it has the other one: an
        offering node `offer_spec`, a node that offers no more `handed_back_spec` (a DryRun
        policy's too: it makes and destroys nothing). A node is handed back only once every
        placement a claim holds there is made: its pool stays the stable one until then
        (`OfferingNodes.slices` follows the spec), so an allocation in flight is prepared
        with room made, as it was allocated. Returns whether a node's mode is changing (then
        this round plans nothing: the next plans on the new specs)."""
        plan_id = uuid.uuid4().hex[:16]
        specs: dict[str, MigNodeSpec] = {}
        waiting = False
        for node in scope.nodes:
            name = node_name(node)
            offers = node.spec is not None and node.spec.allocation == "Offer"
            if self.offering and not offers:
                specs[name] = offer_spec(plan_id)
            elif offers and not self.offering:
                spec = handed_back_spec(node, plan_id)
                if spec is not None and made(node, self.state.offer.nodes.held(name)):
                    specs[name] = spec
                else:
                    waiting = True
        if not specs:
            return waiting
        mode = "Offer" if self.offering else "Reactive"
        self.effects.event(
            self.body,
            "Normal",
            "AllocationModeChanged",
            f"nodes {', '.join(sorted(specs))} now allocate in mode {mode}"[:1000],
        )
        writing = asyncio.Semaphore(SPEC_WRITES)

        async def write(name: str, spec: MigNodeSpec) -> None:
            async with writing:
                await self.write_spec(name, spec, plan_id)

        await asyncio.gather(*(write(name, spec) for name, spec in specs.items()))
        self.state.wake_all()
        return True

    def offer_scope(self, policy: GpuPartitionPolicy, scope: Scope) -> bool:
        """Tell `state.offer.nodes` which nodes publish offers: this policy's, where it offers
        (`policy_offer`). Returns whether they do."""
        offer = policy_offer(self.state.offer, self.name, policy)
        self.state.offer.nodes.assign(self.name, (node_name(n) for n in scope.nodes), offer)
        return offer is not None

    def warn_unsatisfiable(self, claims: Iterable[tuple[Body, str]]) -> None:
        """Warning Event once per claim generation (not once per round)."""
        for claim, reason in claims:
            meta = claim.get("metadata") or {}
            key = (str(meta.get("uid", body_key(claim))), claim_generation(claim))
            if key in self.state.rounds.warned:
                continue
            self.state.rounds.warned.add(key)
            self.effects.event(claim, "Warning", "Unsatisfiable", reason[:1000])
            self.log.warning("claim_unsatisfiable", claim=body_key(claim), reason=reason)

    def warn_excluded(self, excluded: Mapping[str, str]) -> None:
        """Warning Event on each left-out MigNode, once per node and reason."""
        for name, why in excluded.items():
            key = (f"MigNode {name}: {why}", 0)
            if key in self.state.rounds.warned:
                continue
            self.state.rounds.warned.add(key)
            body = self.cluster.mignodes[name]
            self.effects.event(body, "Warning", "NodeExcluded", f"not planned: {why}"[:1000])

    def allocation(self, policy: GpuPartitionPolicy) -> AllocationStatus:
        """The allocation mode in effect; a Warning Event once per generation when the policy
        asks for Offer and the API server does not serve it."""
        requested = policy.spec.allocation
        resolved = resolve_allocation(requested, self.state.offer.dra, self.state.offer.publishing)
        key = (f"{uid_of(self.body)}/allocation", int(policy.metadata.get("generation") or 0))
        if fell_back(requested, resolved) and key not in self.state.rounds.warned:
            self.state.rounds.warned.add(key)
            self.effects.event(self.body, "Warning", "OfferNotServed", resolved.reason[:1000])
            self.log.warning("offer_not_served", reason=resolved.reason)
        return acting(resolved, policy.spec.mode)

    async def write_status(
        self,
        policy: GpuPartitionPolicy,
        scope: Scope,
        last_plan: LastPlan | None,
        excluded: Mapping[str, str],
    ) -> None:
        """Write the policy status if it changed since our last write."""
        status = round_status(
            self.body,
            scope,
            last_plan,
            self.state.rounds.memory(self.name).status,
            excluded,
            now=as_iso(self.clock.now()),
            allocation=self.allocation(policy),
        )
        dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        written = (uid_of(self.body), dumped)
        memory = self.state.rounds.memory(self.name)
        last = memory.status
        if last == written:
            return
        if last is not None and last[0] == written[0] and _observed(last[1]) > _observed(dumped):
            # the policy changed while this round ran, and its new generation was reported
            # already (an invalid spec, by policy_changed): an older verdict must not hide it
            return
        now = self.clock.monotonic()
        if last is not None and memory.status_at is not None and _count_only(last, written):
            due_s = memory.status_at + STATUS_INTERVAL_S - now
            if due_s > 0:
                self.status_due_in_s = due_s
                return
        await self.effects.write_status(self.name, status)
        memory.status, memory.status_at = written, now


def policy_offer(offer: OfferState, name: str, policy: GpuPartitionPolicy) -> NodeOffer | None:
    """Why the nodes of policy `name` offer, where its mode in effect is Offer and it acts (a
    DryRun policy creates nothing, so offers nothing); None: reactive mode's slices."""
    resolved = resolve_allocation(policy.spec.allocation, offer.dra, offer.publishing)
    if acting(resolved, policy.spec.mode).mode != "Offer":
        return None
    return NodeOffer(name, policy.spec.policy_view())


def assign_offers(scopes: ScopeCache, offer: OfferState, cluster: Cluster) -> None:
    """Tell `offer.nodes` which nodes offer under every valid policy of `cluster`, as each
    policy's next round will (`PolicyRound.offer_scope`: the same nodes, the same view). A
    standby runs no round, so a new leader calls this on its synced view before it publishes
    anything (`handlers.take_over`): else it would publish an offering node's pool as reactive
    mode's slice, and write it again at its first round (two pool generations for nothing)."""
    for name, policy in scopes.refresh(cluster).items():
        offer.nodes.assign(name, scopes.nodes(name), policy_offer(offer, name, policy))


def _observed(status: Mapping[str, Any]) -> int:
    return int(status.get("observedGeneration") or 0)


def _count_only(last: tuple[str, dict[str, Any]], written: tuple[str, dict[str, Any]]) -> bool:
    """Whether two written statuses (uid, status) differ in `pendingRequests` alone."""

    def rest(status: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in status.items() if k != "pendingRequests"}

    return last[0] == written[0] and rest(last[1]) == rest(written[1])


async def report_invalid(
    state: OperatorState, name: str, body: Body, error: ValidationError
) -> str:
    """Write the ValidationError as the Ready condition; returns the message for kopf."""
    now = as_iso(state.clock.now())
    status, message = invalid_status(body, error, state.rounds.memory(name).status, now)
    await state.effects.write_status(name, status)
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    state.rounds.memory(name).status = (uid_of(body), dumped)
    return message


def made(node: MigNode, held: frozenset[str]) -> bool:
    """Whether every device in `held` is an instance the node's status reports made."""
    if not held:
        return True
    gpus = node.status.gpus if node.status else []
    have = {device_name(g.index, i.profile, i.start) for g in gpus for i in g.instances if i.uuid}
    return held <= have
