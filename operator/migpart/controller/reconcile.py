"""One planning round of one GpuPartitionPolicy: scope -> plan -> destroy protocol -> spec.

A round reads the cluster from the kopf indexes (a `Cluster` value), never lists per event,
and is level-triggered: it recomputes its decisions from what the cluster says now (through
`scope.ScopeCache`, which redoes only what changed since the last round), and writes a
MigNode spec only when the plan changes a GPU's layout, so running it twice changes nothing.
Which nodes and claims a policy sees is decided in `controller.scope`. A claim no policy can
satisfy is reported once per generation (Warning `Unsatisfiable`) and never triggers a plan.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import kopf
import structlog
from pydantic import ValidationError

from migpart.api.models import (
    Condition,
    GpuPartitionPolicy,
    GpuPartitionPolicyStatus,
    GpuSpec,
    LastPlan,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
)
from migpart.controller.scope import Cluster, Demand, Scope, parse_policy, strip
from migpart.controller.state import FRESH_S, JournalEntry, OperatorState, PlanTiming, Sighting
from migpart.kube.claims import (
    AllocatedDevice,
    all_allocated,
    allocated_devices,
    body_key,
    claim_generation,
    is_allocated,
    list_claims_quorum,
)
from migpart.kube.objects import patch_mignode_spec, patch_policy_status
from migpart.kube.snapshot import build_snapshot, node_name, reconfiguring
from migpart.mig import Instance, device_name
from migpart.planning.model import GpuPlan, Plan, Snapshot
from migpart.planning.planner import plan as make_plan

log = structlog.get_logger(__name__)

Body = Mapping[str, Any]
MAX_REDO = 3


# A policy plans again at the earliest this many times its last plan's cost later: under a
# stream of changes (a burst of pods at 1,000 nodes) planning takes at most a fifth of a core
# per policy, while a cheap plan (small clusters) is not held back noticeably.
PACE_FACTOR = 4.0


@dataclass
class RoundResult:
    planned: bool = False
    written_nodes: list[str] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)
    plan: Plan | None = None
    # the round held a plan back (batch window open, or paced): run again within a tick even
    # if nothing changes
    deferred: bool = False


class Redo(Exception):
    """A device chosen for destruction was allocated meanwhile: plan again from scratch."""


def as_body(body: Body) -> kopf.Body:
    """kopf posts events for its own Body type; index values are plain dicts."""
    return body if isinstance(body, kopf.Body) else kopf.Body(cast("kopf.RawBody", dict(body)))


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def uid_of(body: Body) -> str:
    return str((body.get("metadata") or {}).get("uid") or "")


def previous_status(
    body: Body, written: tuple[str, dict[str, Any]] | None = None
) -> GpuPartitionPolicyStatus:
    """The status the next write builds on: what this operator last wrote for this very object
    (`written`, as (uid, status)), else the body's own (after a restart).

    The body can lag our last write; building on it would take `lastPlan` and the conditions'
    transition times back to an older round.
    """
    if written is not None and written[0] == uid_of(body):
        source: Any = written[1]
    else:
        source = body.get("status") or {}
    try:
        return GpuPartitionPolicyStatus.model_validate(source)
    except ValidationError:
        return GpuPartitionPolicyStatus()


def _stale(seen: float) -> bool:
    """A quorum-read sighting the watch has had ample time to show (or the claim went away
    before it did): forget it rather than keep a device counted as used for good."""
    return time.monotonic() - seen > FRESH_S


def current_layouts(snapshot: Snapshot) -> dict[tuple[str, int], frozenset[Instance]]:
    return {
        (n.name, g.index): frozenset(i.geometry for i in g.instances)
        for n in snapshot.nodes
        for g in n.gpus
    }


def changed_nodes(snapshot: Snapshot, plan: Plan) -> list[str]:
    now = current_layouts(snapshot)
    return sorted(
        {g.node for g in plan.gpus if now.get((g.node, g.index), frozenset()) != set(g.instances)}
    )


def choose_nodes(
    changed: list[str], nodes: Iterable[MigNode], plan: Plan, max_concurrent: int
) -> list[str]:
    """The changed nodes to reconfigure now: never one still reconfiguring, and at most
    `max_concurrent` reconfiguring at once; nodes serving more requests go first."""
    busy = {node_name(n) for n in nodes if reconfiguring(n)}
    slots = max(0, max_concurrent - len(busy))
    served: dict[str, int] = {}
    for a in plan.assignments:
        served[a.node] = served.get(a.node, 0) + 1
    candidates = sorted((n for n in changed if n not in busy), key=lambda n: (-served.get(n, 0), n))
    return candidates[:slots]


def removed_devices(node: MigNode, targets: Iterable[GpuPlan]) -> frozenset[str]:
    """Created instances (status) that the target layout drops: these need the protocol."""
    want = {g.index: set(g.instances) for g in targets}
    gone: set[str] = set()
    for gpu in node.status.gpus if node.status else []:
        target = want.get(gpu.index)
        if target is None:
            continue
        for inst in gpu.instances:
            if Instance(inst.profile, inst.start) not in target:
                gone.add(device_name(gpu.index, inst.profile, inst.start))
    return frozenset(gone)


def node_spec(plan_id: str, targets: Iterable[GpuPlan]) -> MigNodeSpec:
    return MigNodeSpec(
        plan_id=plan_id,
        gpus=[
            GpuSpec(
                index=g.index,
                instances=[MigInstanceSpec(profile=i.profile, start=i.start) for i in g.instances],
            )
            for g in sorted(targets, key=lambda g: g.index)
        ],
    )


def ready_condition(status: str, reason: str, message: str, previous: list[Condition]) -> Condition:
    old = next((c for c in previous if c.type == "Ready"), None)
    same = old is not None and old.status == status
    return Condition(
        type="Ready",
        status="True" if status == "True" else "False",
        reason=reason,
        message=message,
        last_transition_time=old.last_transition_time if same and old else now_iso(),
    )


def _revision(body: Body) -> int | None:
    value = (body.get("metadata") or {}).get("resourceVersion")
    if not isinstance(value, str | int):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def with_own_writes(cluster: Cluster, written: dict[str, dict[str, Any]]) -> Cluster:
    """The cluster with the MigNodes this operator wrote and the watch has not shown yet.

    Watches lag: a round that started right after another one wrote a spec could still see the
    old spec in the index, take the node for idle, and plan it a second time. The patch
    response is the whole object at a newer revision, so it stands in until the index catches
    up (then it is forgotten). Resource versions are etcd revisions; where one is not a number,
    the written body wins until the index shows the same plan.
    """
    if not written:
        return cluster
    mignodes = dict(cluster.mignodes)
    for name, body in list(written.items()):
        seen = mignodes.get(name)
        if seen is None:
            written.pop(name)
            continue
        mine, theirs = _revision(body), _revision(seen)
        if mine is not None and theirs is not None:
            caught_up = theirs >= mine
        else:
            caught_up = (seen.get("spec") or {}).get("planId") == (body.get("spec") or {}).get(
                "planId"
            )
        if caught_up:
            written.pop(name)
        else:
            mignodes[name] = body
    return Cluster(
        mignodes=mignodes,
        node_labels=cluster.node_labels,
        policies=cluster.policies,
        claims=cluster.claims,
        waiting=cluster.waiting,
        device_classes=cluster.device_classes,
        node_facts=cluster.node_facts,
    )


class PolicyRound:
    """One round for one policy; `run` is the whole thing, the steps are methods so that the
    protocol reads top-down."""

    def __init__(self, state: OperatorState, name: str, body: Body, cluster: Cluster) -> None:
        self.state = state
        self.name = name
        self.body = body
        self.cluster = with_own_writes(cluster, state.written)
        self.log = log.bind(policy=name)
        # set by run: a plan was held back (batch window open, or paced), until when (s)
        self.deferred = False
        self.retry_in_s = 0.0

    async def run(self) -> RoundResult:
        policy = parse_policy(self.body)
        await self.restore_leftovers()
        scope = self.state.scopes.scope(self.name, self.cluster, self.fresh_claims())
        if scope is None:
            return RoundResult()
        self.warn_unsatisfiable(scope.demand.unsatisfiable)
        self.state.metrics.pending_requests.labels(self.name).set(scope.demand.pending)
        result = RoundResult()
        last_plan: LastPlan | None = None
        deferred = not self.may_plan(policy, scope.demand)
        if scope.nodes and not deferred:
            for _ in range(MAX_REDO):
                try:
                    result, last_plan = await self.plan_and_apply(policy, scope)
                    break
                except Redo:
                    self.state.wake_all()
                    # plan again on the specs this round already wrote, not on the ones the
                    # round started with: a node given a spec must not get a second one
                    self.cluster = with_own_writes(self.cluster, self.state.written)
                    scope = (
                        self.state.scopes.scope(self.name, self.cluster, self.fresh_claims())
                        or scope
                    )
        await self.write_status(policy, scope, last_plan)
        self.deferred = result.deferred = deferred
        return result

    async def restore_leftovers(self) -> None:
        """Devices still withdrawn at the start of a round belong to a round that failed
        before writing its spec: publish them again; this round withdraws anew if needed."""
        for name in self.state.publisher.withdrawing():
            leftover = self.state.publisher.withdrawn(name)
            if leftover:
                await self.state.publisher.restore(name, leftover)
                self.state.hooks.record(JournalEntry("restored", name, leftover))

    def may_plan(self, policy: GpuPartitionPolicy, demand: Demand) -> bool:
        """Gather pending requests for `batchWindowSeconds` before planning for them; with
        nothing pending, plan at once (spares only; an unchanged plan writes nothing). Either
        way, not sooner than PACE_FACTOR times the last plan's cost after it."""
        now = time.monotonic()
        if demand.requests:
            first = self.state.first_pending.setdefault(self.name, now)
            window_s = policy.spec.reconfiguration.batch_window_seconds
            if now - first < window_s:
                self.retry_in_s = first + window_s - now
                return False
        else:
            self.state.first_pending.pop(self.name, None)
        last = self.state.last_plans.get(self.name)
        if last is not None and now - last.at < PACE_FACTOR * last.cost_s:
            self.retry_in_s = last.at + PACE_FACTOR * last.cost_s - now
            return False
        return True

    def fresh(self) -> dict[str, Sighting]:
        """The quorum read's sightings the claim index has not caught up with yet (those it
        has, and stale ones, are forgotten here)."""
        fresh = self.state.fresh_allocations
        if not fresh:
            return fresh
        caught_up = {uid_of(c) for c in self.cluster.claims.values() if is_allocated(c)}
        for uid in [u for u, s in fresh.items() if u in caught_up or _stale(s.seen)]:
            del fresh[uid]
        return fresh

    def allocated(self) -> frozenset[AllocatedDevice]:
        indexed = all_allocated(self.cluster.claims.values())
        return indexed.union(*(s.devices for s in self.fresh().values()))

    def fresh_claims(self) -> frozenset[str]:
        """Keys of the claims the quorum read saw allocated while the index still shows them
        unallocated (by uid: a claim made again under the same name is not one of them)."""
        fresh = self.fresh()
        if not fresh:
            return frozenset()
        return frozenset(
            body_key(c)
            for c in self.cluster.claims.values()
            if not is_allocated(c) and uid_of(c) in fresh
        )

    async def plan_and_apply(
        self, policy: GpuPartitionPolicy, scope: Scope
    ) -> tuple[RoundResult, LastPlan | None]:
        began = time.perf_counter()
        snapshot = build_snapshot(scope.nodes, self.allocated(), scope.tables)
        started = time.perf_counter()
        plan = make_plan(snapshot, scope.demand.requests, policy.spec.policy_view())
        duration_s = time.perf_counter() - started
        self.state.last_plans[self.name] = PlanTiming(time.monotonic(), time.perf_counter() - began)
        self.state.metrics.plan_duration.labels(self.name).observe(duration_s)
        changed = changed_nodes(snapshot, plan)
        result = RoundResult(planned=True, plan=plan)
        if not changed:
            return result, None
        chosen = choose_nodes(
            changed, scope.nodes, plan, policy.spec.reconfiguration.max_concurrent_nodes
        )
        plan_id = uuid.uuid4().hex[:16]
        now = current_layouts(snapshot)
        targets = [g for g in plan.gpus if g.node in chosen]
        created = sum(
            len(set(g.instances) - now.get((g.node, g.index), frozenset())) for g in targets
        )
        destroyed = sum(
            len(now.get((g.node, g.index), frozenset()) - set(g.instances)) for g in targets
        )
        last_plan = LastPlan(
            plan_id=plan_id,
            time=now_iso(),
            duration_millis=round(duration_s * 1000, 3),
            satisfied=len({a.request for a in plan.assignments}),
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
            if self.state.dry_reports.get(self.name) != repr(targets):
                self.state.dry_reports[self.name] = repr(targets)
                kopf.event(as_body(self.body), type="Normal", reason="DryRunPlan", message=message)
                return result, last_plan
            return result, None
        if not chosen:
            return result, None
        kopf.event(as_body(self.body), type="Normal", reason="Repartitioning", message=message)
        self.log.info(
            "plan_decided",
            plan_id=plan_id,
            nodes=chosen,
            created=created,
            destroyed=destroyed,
            satisfied=sorted({a.request for a in plan.assignments}),
            unsatisfied=sorted(plan.unsatisfied),
            targets={
                f"{g.node}/{g.index}": sorted(f"{i.profile}@{i.start}" for i in g.instances)
                for g in targets
            },
        )
        by_name = {node_name(n): n for n in scope.nodes}
        for name in chosen:
            node_targets = [g for g in targets if g.node == name]
            await self.destroy_protocol(by_name[name], node_targets, result)
            written = await patch_mignode_spec(
                self.state.api, name, node_spec(plan_id, node_targets)
            )
            self.state.written[name] = written
            self.state.publisher.observe(MigNode.model_validate(strip(written)))
            self.state.hooks.record(JournalEntry("spec_written", name, detail=plan_id))
            self.state.metrics.repartitions.labels(self.name).inc()
            self.log.info("mignode_spec_written", node=name, plan_id=plan_id)
            result.written_nodes.append(name)
        return result, last_plan

    async def destroy_protocol(
        self, node: MigNode, targets: list[GpuPlan], result: RoundResult
    ) -> None:
        """Withdraw, confirm by a quorum read, and only then let the spec drop the devices.

        Raises Redo when a device got allocated in the window (it is published again, and
        counts as used in the next plan).
        """
        name = node_name(node)
        gone = removed_devices(node, targets)
        if not gone:
            return
        published = await self.state.publisher.withdraw(name, gone)
        self.state.hooks.record(
            JournalEntry("withdrawn", name, gone, f"generation {published.generation}")
        )
        if self.state.hooks.after_withdraw is not None:
            await self.state.hooks.after_withdraw(name, gone)
        # A scheduling cycle that read the slice before the withdrawal writes its allocation
        # later (PreBind): give cycles in flight time to land before the confirming read.
        await asyncio.sleep(self.state.withdraw_grace_s)
        claims = await list_claims_quorum(self.state.api)
        hit = {
            d
            for claim in claims
            for d in allocated_devices(claim)
            if d.pool == name and d.device in gone
        }
        if hit:
            kept = frozenset(d.device for d in hit)
            now = time.monotonic()
            for claim in claims:
                devices = allocated_devices(claim) & hit
                if devices:
                    self.state.fresh_allocations[uid_of(claim)] = Sighting(devices, now)
            await self.state.publisher.restore(name, kept)
            self.state.metrics.devices_kept.inc(len(kept))
            self.state.hooks.record(JournalEntry("kept", name, kept))
            result.kept |= kept
            kopf.event(
                as_body(self.body),
                type="Warning",
                reason="DestroyAborted",
                message=f"node {name}: {', '.join(sorted(kept))} got allocated while being "
                "withdrawn; kept, planning again",
            )
            self.log.warning("destroy_aborted", node=name, devices=sorted(kept))
            raise Redo(name)
        self.state.hooks.record(JournalEntry("confirmed", name, gone))

    def warn_unsatisfiable(self, claims: Iterable[tuple[Body, str]]) -> None:
        """Warning Event once per claim generation (not once per round)."""
        for claim, reason in claims:
            meta = claim.get("metadata") or {}
            key = (str(meta.get("uid", body_key(claim))), claim_generation(claim))
            if key in self.state.warned:
                continue
            self.state.warned.add(key)
            kopf.event(
                as_body(claim),
                type="Warning",
                reason="Unsatisfiable",
                message=reason[:1000],
            )
            self.log.warning("claim_unsatisfiable", claim=body_key(claim), reason=reason)

    async def write_status(
        self, policy: GpuPartitionPolicy, scope: Scope, last_plan: LastPlan | None
    ) -> None:
        previous = previous_status(self.body, self.state.statuses.get(self.name))
        gpus = scope.gpus
        if not scope.nodes:
            ready = ready_condition(
                "False", "NoNodes", "the node selector matches no MigNode", previous.conditions
            )
        elif scope.demand.unsatisfiable:
            ready = ready_condition(
                "True",
                "Unsatisfiable",
                f"{len(scope.demand.unsatisfiable)} pending claim(s) no permitted profile can "
                "satisfy",
                previous.conditions,
            )
        else:
            ready = ready_condition("True", "Reconciled", "", previous.conditions)
        status = GpuPartitionPolicyStatus(
            observed_generation=int((self.body.get("metadata") or {}).get("generation") or 0),
            nodes=len(scope.nodes),
            gpus=gpus,
            pending_requests=scope.demand.pending,
            last_plan=last_plan or previous.last_plan,
            conditions=[ready, *(c for c in previous.conditions if c.type != "Ready")],
        )
        dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        written = (uid_of(self.body), dumped)
        if self.state.statuses.get(self.name) == written:
            return
        await patch_policy_status(self.state.api, self.name, status)
        self.state.statuses[self.name] = written


async def report_invalid(
    state: OperatorState, name: str, body: Body, error: ValidationError
) -> str:
    """Write the ValidationError as the Ready condition; returns the message for kopf."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = f"spec invalid at {where}: {first['msg']}"
    previous = previous_status(body, state.statuses.get(name))
    status = GpuPartitionPolicyStatus(
        observed_generation=int((body.get("metadata") or {}).get("generation") or 0),
        conditions=[ready_condition("False", "InvalidSpec", message, previous.conditions)],
    )
    await patch_policy_status(state.api, name, status)
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    state.statuses[name] = (uid_of(body), dumped)
    return message
