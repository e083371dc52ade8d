"""kopf wiring: what the operator registers, and its lifecycle (startup, login, cleanup).

The handlers themselves live where their subject does: the indexes in `indexes.py`, the
planning loop in `loop.py` (one per policy, started and stopped from the policy watch here,
run by `workers.py`), the slice publisher in `kube/slice_publisher.py` and the slice watch in
`kube/slice_watch.py`. `build_registry` puts them on a registry of its own rather than kopf's
global one, so that a test can run a whole operator in-process next to its own test code;
`operate` runs kopf on it, for `migpart operator` and for those tests alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

import aiohttp
import kopf
import structlog
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from migpart.api.leases import LEASE_DURATION_S, LEASE_NAMESPACE
from migpart.api.models import (
    GROUP,
    POLICY_PLURAL,
    VERSION,
    UnavailableReason,
)
from migpart.api.selectors import DEFAULT_NODE_SELECTOR, LabelSelector, parse_node_selector
from migpart.clock import Clock
from migpart.controller.core.bodies import parse_policy
from migpart.controller.core.effects import KubeEffects
from migpart.controller.core.health import REGISTRATION_GRACE_S, NodeHealth, await_crds
from migpart.controller.core.metrics import Metrics
from migpart.controller.core.state import (
    DestroyMemory,
    Hooks,
    JournalEntry,
    OfferState,
    OperatorState,
    Running,
)
from migpart.controller.rounds.loop import plan_policy
from migpart.controller.rounds.reconcile import assign_offers, report_invalid
from migpart.controller.rounds.scope import ScopeCache
from migpart.controller.watching.indexes import (
    WATCHED,
    Indexes,
    cluster_now,
    state_of,
    watch_index,
    watched_indexes,
)
from migpart.controller.watching.mignodes import MigNodeWatch, watch_mignodes
from migpart.errors import MigpartError
from migpart.kube.client import open_client
from migpart.kube.election import (
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    LeaderElector,
    Leadership,
    Term,
    Unelected,
    new_identity,
    user_agent,
)
from migpart.kube.election_lease import LEASE_DURATION_S as ELECTION_LEASE_S
from migpart.kube.election_lease import LEASE_NAME, KubeLeaseStore, LeaseStore, UnopenedLeaseStore
from migpart.kube.election_thread import ElectionThread
from migpart.kube.events import REPORTING_COMPONENT
from migpart.kube.features import discover_dra_features, dry_run_create
from migpart.kube.leases import stale_conditions, watch_leases
from migpart.kube.slice_publisher import Published, SlicePublisher
from migpart.kube.slice_watch import SliceWatch, watch_slices
from migpart.offer.nodes import HoldingIndex, OfferingNodes

log = structlog.get_logger(__name__)

# A MigNode's slice is written on every MigNode event, on its deletion, and checked every period
# (resync_slices).
SLICE_RESYNC_S = 30.0


@dataclass(frozen=True)
class Election:
    """Leader election (`migpart operator --leader-elect`): the Lease and its timings."""

    namespace: str
    name: str = LEASE_NAME
    identity: str = field(default_factory=new_identity)
    lease_duration_s: float = ELECTION_LEASE_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_s: float = RETRY_PERIOD_S


@dataclass(frozen=True)
class OperatorConfig:
    """What `migpart operator` (or a test) sets; `metrics` is the registry its /metrics
    endpoint serves and `clock` the time its decisions read (`RealClock`, made by whoever
    composes the operator), so neither has a default."""

    kubeconfig: Path | None
    metrics: Metrics
    clock: Clock
    hooks: Hooks = field(default_factory=Hooks)
    tick_s: float = 1.0
    slice_resync_s: float = SLICE_RESYNC_S
    withdraw_grace_s: float = 1.0
    # the agents' Leases: where they are, and how long unrenewed makes a node unavailable
    lease_namespace: str = LEASE_NAMESPACE
    lease_timeout_s: float = float(LEASE_DURATION_S)
    # how long a node stays in service after its agent reports the plugin no longer registered
    registration_grace_s: float = REGISTRATION_GRACE_S
    # set once the API server serves migpart's CRDs (`/readyz` waits for it)
    served: asyncio.Event = field(default_factory=asyncio.Event)
    # None: no election, this operator writes from the start (the only one, by its user's word)
    election: Election | None = None
    # `--offer-publishing`: nodes of policies whose mode in effect is Offer publish one stable
    # pool (migpart.offer); off, every policy runs Reactive
    offer_publishing: bool = False
    # `--node-selector`: the Nodes migpart manages (opted in); no device is published elsewhere
    node_selector: LabelSelector = field(
        default_factory=lambda: parse_node_selector(DEFAULT_NODE_SELECTOR)
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf builds a *diff-base* (the object's essence, for on.create/update/resume handlers
    to see what changed) for every event of every watched resource, by a deep copy of the
    whole body, status included. migpart has no such handlers (only indexes and on.event),
    so nothing reads it; at 1,000 nodes those copies were a sixth of the operator's CPU."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast("kopf.BodyEssence", {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


async def startup(
    config: OperatorConfig, settings: kopf.OperatorSettings, memo: Any, **_: Any
) -> None:
    settings.posting.enabled = True
    settings.posting.reporting_component = REPORTING_COMPONENT
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    api, credentials = await open_client(config.kubeconfig)
    elector = _elector(config)
    leadership: Leadership = elector if elector is not None else Unelected()
    if elector is not None:
        # the identity in every request's user agent, so in each write's managedFields manager
        api.user_agent = user_agent(elector.identity)
    health = NodeHealth(
        config.clock,
        timeout_s=config.lease_timeout_s,
        registration_grace_s=config.registration_grace_s,
        selects=config.node_selector.matches,
    )
    publisher = SlicePublisher(api, gate=health.reason)
    scopes = ScopeCache()
    effects = KubeEffects(api, publisher, scopes, leadership)
    effects.on_refused.append(lambda write: config.metrics.fenced_writes.labels(write).inc())
    state = OperatorState(
        api=api,
        credentials=credentials,
        publisher=publisher,
        effects=effects.under(leadership.current()),
        clock=config.clock,
        scopes=scopes,
        running=Running(elector=elector),
        metrics=config.metrics,
        hooks=config.hooks,
        tick_s=config.tick_s,
        destroy=DestroyMemory(grace_s=config.withdraw_grace_s),
        health=health,
        offer=OfferState(dra=await discover_dra_features(dry_run_create(api), config.clock)),
    )
    memo.state = state

    def published(result: Published) -> None:
        state.metrics.slice_publishes.inc()
        state.hooks.record(
            JournalEntry(
                "slice_published", result.node, result.devices, f"generation {result.generation}"
            )
        )

    publisher.on_publish.append(published)
    state.running.resync = asyncio.create_task(
        resync_slices(state, config.slice_resync_s), name="slice-resync"
    )
    state.metrics.leader.set(1 if state.leading() else 0)
    mignodes = MigNodeWatch(state, state.watches.slices_listed)
    slices = SliceWatch(publisher, state.watches.slices_listed, mignodes.publish)
    watched = watched_indexes(state)
    offering = _wire_offers(state, config.offer_publishing, mignodes)
    watched["claims_index"] = HoldingIndex(offering, WATCHED["claims_index"].entry, state.wake_all)
    state.watches.watched = watched
    state.watches.mignodes = mignodes
    state.watches.indexes = Indexes.of(mignodes, watched)
    state.running.tasks = [
        asyncio.create_task(await_crds(api, config.served, config.clock), name="await-crds"),
        asyncio.create_task(watch_leases(api, config.lease_namespace, health), name="leases"),
        asyncio.create_task(follow_node_health(state), name="node-health"),
        asyncio.create_task(watch_slices(api, slices), name="resourceslices"),
        asyncio.create_task(watch_mignodes(api, mignodes), name="mignodes_index"),
        *(
            asyncio.create_task(watch_index(api, index_id, index), name=index_id)
            for index_id, index in watched.items()
        ),
    ]
    if elector is not None:
        elector.on_change.append(functools.partial(lead, state))
        await elector.start()
    elif config.offer_publishing:
        # it leads from the start, and publishes no slice before it knows which nodes offer
        _start_take_over(state)
    log.info(
        "operator_started",
        identity=elector.identity if elector is not None else None,
        server=credentials.server,
        lease_namespace=config.lease_namespace,
        lease_timeout_s=config.lease_timeout_s,
        registration_grace_s=config.registration_grace_s,
        offer_served=state.offer.dra.offer_served,
        offer_publishing=config.offer_publishing,
    )


def _wire_offers(state: OperatorState, publishing: bool, mignodes: MigNodeWatch) -> OfferingNodes:
    """Offer mode (migpart.offer): with `publishing` the publisher asks `OfferingNodes.slices`
    what a node's pool holds (without it, reactive mode's `node_slices` for every node)."""
    publisher = state.publisher
    state.offer.publishing = publishing

    def recompute(node: str) -> None:
        publisher.invalidate(node)
        mignodes.publish(node)

    state.offer.nodes = OfferingNodes(on_change=recompute, taints=state.offer.dra.device_taints)
    if publishing:
        publisher.slices = state.offer.nodes.slices
    return state.offer.nodes


def _elector(config: OperatorConfig) -> ElectionThread | None:
    """The election, in a thread with a client of its own (`ElectionThread`: renewals must not
    wait behind a busy round)."""
    election = config.election
    if election is None:
        return None

    async def open_store() -> tuple[LeaseStore, Callable[[], Awaitable[None]]]:
        api, _ = await open_client(config.kubeconfig)
        api.user_agent = user_agent(election.identity)
        timeout_s = election.renew_deadline_s / 2
        return KubeLeaseStore(api, election.namespace, election.name, timeout_s), api.close

    elector = LeaderElector(
        UnopenedLeaseStore(),
        election.identity,
        lease_duration_s=election.lease_duration_s,
        renew_deadline_s=election.renew_deadline_s,
        retry_s=election.retry_s,
    )
    return ElectionThread(elector, open_store)


def lead(state: OperatorState, term: Term | None) -> None:
    """The elector's callback: bind the write port to the new term (None: to none, so every
    write is refused) and, on taking over, plan and publish at once."""
    state.effects = state.effects.under(term)
    # which nodes offer is known again once this term's take-over has said it
    state.offer.known = False
    state.metrics.leader.set(1 if term is not None else 0)
    state.metrics.leadership_changes.inc()
    if term is None:
        return
    state.wake_all()
    _start_take_over(state)


def _start_take_over(state: OperatorState) -> None:
    task = asyncio.create_task(take_over(state), name="take-over")
    state.running.tasks.append(task)

    def forget(done: asyncio.Task[None]) -> None:
        if done in state.running.tasks:
            state.running.tasks.remove(done)

    task.add_done_callback(forget)


async def take_over(state: OperatorState) -> None:
    """A new leader (or, with offer publishing, an operator without election at start) says
    which nodes offer, from its synced view (every watch listed, the slices' too), then writes
    every slice whose content differs from what that view computes, and the `Stale` marks it
    has kept meanwhile (the watches were warm). Until it has said which nodes offer, nothing
    else publishes a slice (`OperatorState.publishing`): a standby runs no round, so it would
    write reactive mode's slice over each offering node's pool, and its first round the pool
    again."""
    await state.watches.synced()
    await state.watches.slices_listed.wait()
    if state.offer.publishing:
        assign_offers(state.scopes, state.offer, cluster_now(state))
    state.offer.known = True
    nodes = state.publisher.nodes()
    for name in nodes:
        if not state.leading():
            return
        await _publish(state, name)
    await mark_stale(state)
    log.info("took_over", nodes=len(nodes))


async def _publish(state: OperatorState, name: str) -> None:
    """Write one node's slice (if its content changed); a failure is logged, not raised: the
    caller goes on with the other nodes, and the periodic resync tries it again."""
    try:
        await state.effects.publish(name)
    except (MigpartError, ApiException, aiohttp.ClientError, TimeoutError) as error:
        log.warning("slice_publish_failed", node=name, error=str(error)[:300])
    except Exception:  # a bug must not stop the slices of every other node
        log.exception("slice_publish_crashed", node=name)


def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
    creds = state_of(memo).credentials
    return kopf.ConnectionInfo(
        server=creds.server,
        token=creds.token,
        ca_path=creds.ca_path,
        certificate_path=creds.certificate_path,
        private_key_path=creds.private_key_path,
        insecure=creds.insecure,
    )


async def cleanup(memo: Any, **_: Any) -> None:
    state = getattr(memo, "state", None)
    if state is not None:
        await state.workers.close()  # each loop finishes its round (10 s at most)
        running = state.running
        for task in [*running.tasks, *([running.resync] if running.resync is not None else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if running.elector is not None:
            await running.elector.stop()  # releases the Lease: a standby takes over at once
        await state.api.close()
    log.info("operator_stopped")


async def resync_slices(state: OperatorState, period_s: float = SLICE_RESYNC_S) -> None:
    """Publish every known node's slice again each period, while publishing (leading, and
    once the take-over said which nodes offer): repairs a write that failed (event handlers
    are not retried). The publisher knows each slice from the watch, so this costs no request
    for a slice that is as it should be.

    One loop for all nodes instead of a kopf timer per MigNode: a timer makes kopf put its
    finalizer on every MigNode, which then cannot be deleted while the operator is down.
    """
    while True:
        await state.clock.sleep(period_s)
        for name in state.publisher.nodes():
            if not state.publishing():
                break
            await _publish(state, name)


async def follow_node_health(state: OperatorState) -> None:
    """Every tick, find the nodes whose availability changed (`NodeHealth.check`) and act on
    it: wake the planners (the node leaves or rejoins every scope), publish its slice (empty
    while unavailable) and set its MigNode's `Stale` condition. A failed write is tried again
    on the next tick."""
    while True:
        await state.clock.sleep(state.tick_s)
        try:
            await _node_health_tick(state)
        except Exception:  # a bug must not end node health for every node
            log.exception("node_health_crashed")


async def _node_health_tick(state: OperatorState) -> None:
    """One check of `follow_node_health`."""
    health = state.health
    changed = health.check()
    for node in changed:
        reason = health.reason(node)
        if reason is None:
            log.info("node_available", node=node)
        else:
            log.warning("node_unavailable", node=node, reason=reason, why=health.describe(node))
        if reason == "LeaseExpired":
            state.stale.pending[node] = True
    # Stale=True on a node whose agent renews again (set before this tick, or by an earlier
    # operator): cleared once a renewal is seen, not merely because a Lease exists
    for node in state.stale.flagged:
        if health.reason(node) is None and health.heard_since_listed(node):
            state.stale.pending.setdefault(node, False)
    if changed:
        state.wake_all()
        counts: Counter[str] = Counter(health.unavailable().values())
        for reason in get_args(UnavailableReason):
            state.metrics.unavailable_nodes.labels(reason).set(counts.get(reason, 0))
    if not state.leading():
        return  # a standby keeps its verdicts and marks; a new leader acts on them (take_over)
    if state.publishing():  # else the take-over publishes every node
        for node in changed:
            await _publish(state, node)
    await mark_stale(state)


async def mark_stale(state: OperatorState) -> None:
    """Write the `Stale` condition of the MigNodes in `state.stale.pending` (while leading)."""
    for node, stale in list(state.stale.pending.items()):
        if not state.leading():
            return
        mignode = state.publisher.node(node)
        if mignode is None:
            state.stale.pending.pop(node, None)
            state.stale.written_over.pop(node, None)
            continue
        conditions = stale_conditions(
            list(mignode.status.conditions) if mignode.status else [],
            stale,
            state.health.describe(node) if stale else "the agent renews its Lease again",
        )
        version = str(mignode.metadata.get("resourceVersion") or "")
        if conditions is None:
            if version and state.stale.written_over.get(node) == version:
                continue  # our last write is not in this body yet: decide on the next one
        else:
            try:
                await state.effects.write_conditions(node, version, conditions)
            except (ApiException, aiohttp.ClientError, TimeoutError, MigpartError) as error:
                # 409: the agent wrote meanwhile; the next tick reads its status again
                log.info("stale_condition_deferred", node=node, error=str(error)[:200])
                continue
            state.stale.written_over[node] = version
        state.stale.pending.pop(node, None)


async def policy_changed(type: str | None, name: str, body: kopf.Body, memo: Any, **_: Any) -> None:
    """Start (or stop) the policy's planning loop; report an invalid spec in its status."""
    state = state_of(memo)
    if type == "DELETED":
        state.workers.stop(name)
        state.offer.nodes.drop(name)  # its nodes publish reactively again
        return
    state.workers.ensure(name, functools.partial(plan_policy, state, name))
    try:
        parse_policy(body)
    except ValidationError as error:
        if not state.leading():
            return  # the leader reports it; a standby writes nothing
        message = await report_invalid(state, name, body, error)
        raise kopf.PermanentError(message) from error


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, on a registry of its own."""
    registry = kopf.OperatorRegistry()
    on_startup = cast("Callable[..., Awaitable[None]]", functools.partial(startup, config))
    kopf.on.startup(registry=registry, id="startup")(on_startup)
    kopf.on.login(registry=registry)(login)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.event(GROUP, VERSION, POLICY_PLURAL, registry=registry)(policy_changed)
    return registry


async def operate(
    config: OperatorConfig,
    memo: kopf.Memo,
    ready_flag: asyncio.Event | threading.Event,
    stop_flag: threading.Event | None = None,
) -> None:
    """kopf running the operator's handlers until `stop_flag` is set (or it is cancelled):
    cluster-wide, and standalone (one writer by leader election, not kopf's peering)."""
    await kopf.operator(
        registry=build_registry(config),
        clusterwide=True,
        standalone=True,
        ready_flag=ready_flag,
        stop_flag=stop_flag,
        memo=memo,
    )
