"""kopf wiring: indexes over the watched objects, one planning loop per policy (started and
stopped from the policy watch, see workers.py), the slice publisher on MigNode changes, login,
startup and cleanup.

Handlers are registered on a registry built by `build_registry`, not on kopf's global one,
so that a test can run a whole operator in-process next to its own test code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard, cast

import kopf
import structlog
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError

from migpart.api.models import GROUP, MIGNODE_PLURAL, POLICY_PLURAL, VERSION
from migpart.controller.errors import Outcome, kopf_errors, survive
from migpart.controller.metrics import Metrics
from migpart.controller.reconcile import PolicyRound, report_invalid
from migpart.controller.scope import Cluster, parse_policy
from migpart.controller.state import Hooks, JournalEntry, OperatorState
from migpart.controller.workers import Signals
from migpart.errors import MigpartError
from migpart.kube.claims import claim_key, pod_claim_keys, pod_unschedulable
from migpart.kube.client import open_client
from migpart.kube.placement import NodeFacts, node_facts, pod_placement
from migpart.kube.slices import Published, SlicePublisher

log = structlog.get_logger(__name__)

RESOURCE = ("resource.k8s.io", "v1")
# A MigNode's slice is written on every MigNode event, on its deletion, and checked every period
# (resync_slices).
SLICE_RESYNC_S = 30.0
# The kopf indexes (their ids), which every round reads.
INDEXES = (
    "claims_index",
    "waiting_index",
    "mignodes_index",
    "nodes_index",
    "policies_index",
    "classes_index",
)
# How long a woken planning loop waits before its round (see plan_policy).
SETTLE_S = 0.02
# A loop runs a round at least this often even when nothing it watches changed (a safety net,
# and what ends a quorum-read sighting that the claim watch never confirmed).
FULL_ROUND_S = 30.0


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


def _state(memo: Any) -> OperatorState:
    state: OperatorState = memo.state
    return state


def _plain(body: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Some top-level fields as a plain dict. No copy: kopf parses every watch event into new
    dicts and never changes them afterwards, and nothing in migpart writes to an index value
    (a deep copy per event was a tenth of the operator's CPU at 1,000 nodes)."""
    return {k: body[k] for k in keys if k in body}


def _flatten(index: Mapping[Any, Any]) -> dict[str, Any]:
    """A kopf index (key -> store of values) as key -> the one value per key."""
    out: dict[str, Any] = {}
    for key, store in index.items():
        for value in store:
            out[str(key)] = value
    return out


def cluster_from(indexes: Mapping[str, Any]) -> Cluster:
    """The round's view of the cluster, read from the live indexes."""
    nodes = {
        name: NodeFacts(facts["labels"], tuple(facts["taints"]))
        for name, facts in _flatten(indexes["nodes_index"]).items()
    }
    return Cluster(
        mignodes=_flatten(indexes["mignodes_index"]),
        node_labels={name: facts.labels for name, facts in nodes.items()},
        policies=_flatten(indexes["policies_index"]),
        claims=_flatten(indexes["claims_index"]),
        waiting={str(k): tuple(store) for k, store in indexes["waiting_index"].items()},
        device_classes=_flatten(indexes["classes_index"]),
        node_facts=nodes,
    )


async def resync_slices(publisher: SlicePublisher, period_s: float = SLICE_RESYNC_S) -> None:
    """Publish every known node's slice again each period: repairs a write that failed (event
    handlers are not retried). The publisher knows each slice from the watch, so this costs no
    request for a slice that is as it should be.

    One loop for all nodes instead of a kopf timer per MigNode: a timer makes kopf put its
    finalizer on every MigNode, which then cannot be deleted while the operator is down.
    """
    while True:
        await asyncio.sleep(period_s)
        for name in publisher.nodes():
            try:
                await publisher.publish(name)
            except (MigpartError, ApiException) as error:
                log.warning("slice_resync_failed", node=name, error=str(error))
            except Exception:  # a bug must not end the loop for every node
                log.exception("slice_resync_crashed", node=name)


def build_registry(
    kubeconfig: Path | None,
    hooks: Hooks | None = None,
    tick_s: float = 1.0,
    slice_resync_s: float = SLICE_RESYNC_S,
    withdraw_grace_s: float = 1.0,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        settings.posting.enabled = True
        settings.posting.reporting_component = "migpart"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        api, credentials = await open_client(kubeconfig)
        metrics: Metrics = getattr(memo, "metrics", None) or Metrics()
        publisher = SlicePublisher(api)
        memo.state = OperatorState(
            api=api,
            credentials=credentials,
            publisher=publisher,
            metrics=metrics,
            hooks=hooks or Hooks(),
            tick_s=tick_s,
            withdraw_grace_s=withdraw_grace_s,
        )

        def published(result: Published) -> None:
            metrics.slice_publishes.inc()
            memo.state.hooks.record(
                JournalEntry(
                    "slice_published",
                    result.node,
                    result.devices,
                    f"generation {result.generation}",
                )
            )

        publisher.on_publish.append(published)
        memo.state.resync = asyncio.create_task(
            resync_slices(publisher, slice_resync_s), name="slice-resync"
        )
        log.info("operator_started", server=credentials.server)

    @kopf.on.login(registry=registry)
    def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
        creds = _state(memo).credentials
        return kopf.ConnectionInfo(
            server=creds.server,
            token=creds.token,
            ca_path=creds.ca_path,
            certificate_path=creds.certificate_path,
            private_key_path=creds.private_key_path,
            insecure=creds.insecure,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        state = getattr(memo, "state", None)
        if state is not None:
            await state.workers.close()  # each loop finishes its round (10 s at most)
            if state.resync is not None:
                state.resync.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await state.resync
            await state.api.close()
        log.info("operator_stopped")

    # ------------------------------------------------------------------ indexes

    @kopf.index(*RESOURCE, "resourceclaims", registry=registry, id="claims_index")
    async def claims_index(
        namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
    ) -> Any:
        _state(memo).wake_all()
        value = _plain(body, ("metadata", "spec", "status"))
        value["apiVersion"] = "resource.k8s.io/v1"
        value["kind"] = "ResourceClaim"
        return {claim_key(namespace or "", name): value}

    @kopf.index("v1", "pods", registry=registry, id="waiting_index")
    async def waiting_index(body: kopf.Body, memo: Any, **_: Any) -> Any:
        claims = pod_claim_keys(body)
        if not claims:
            return None
        _state(memo).wake_all()  # also when it stops waiting: the claim may be served
        if not pod_unschedulable(body):
            return None
        placement = pod_placement(body)
        return {key: placement for key in claims}

    @kopf.index(GROUP, VERSION, MIGNODE_PLURAL, registry=registry, id="mignodes_index")
    async def mignodes_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
        _state(memo).wake_all()
        return {name: _plain(body, ("apiVersion", "kind", "metadata", "spec", "status"))}

    @kopf.index("v1", "nodes", registry=registry, id="nodes_index")
    async def nodes_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
        _state(memo).wake_all()
        return {name: node_facts(body)}

    @kopf.index(GROUP, VERSION, POLICY_PLURAL, registry=registry, id="policies_index")
    async def policies_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
        _state(memo).wake_all()
        # status too: a restarted operator builds the next status on the last one written
        return {name: _plain(body, ("apiVersion", "kind", "metadata", "spec", "status"))}

    @kopf.index(*RESOURCE, "deviceclasses", registry=registry, id="classes_index")
    async def classes_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
        _state(memo).wake_all()
        return {name: _plain(body, ("metadata", "spec"))}

    # ------------------------------------------------------------------ slices

    async def publish(name: str, body: Mapping[str, Any], memo: Any) -> None:
        state = _state(memo)
        view = state.scopes.node(name, body)  # parsed once per resourceVersion, for both
        if view is None:
            return  # logged by the cache
        state.publisher.observe(view.node)
        with kopf_errors():
            await state.publisher.publish(name)

    @kopf.on.event(GROUP, VERSION, MIGNODE_PLURAL, registry=registry)
    async def mignode_changed(
        type: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
    ) -> None:
        if type == "DELETED":
            _state(memo).publisher.forget(name)
            return
        await publish(name, body, memo)

    @kopf.on.event(
        *RESOURCE,
        "resourceslices",
        registry=registry,
        labels={"app.kubernetes.io/managed-by": "migpart"},
    )
    async def slice_changed(type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
        """The publisher's view of our slices comes from here, not from GETs; a slice deleted
        under a known node (by hand, or by a kubelet wiping its node's slices) is written
        again at once."""
        publisher = _state(memo).publisher
        if type != "DELETED":
            publisher.observe_slice(body)
            return
        node = publisher.slice_deleted(body)
        if node is not None and node in publisher.nodes():
            log.info("resource_slice_deleted", node=node)
            with kopf_errors():
                await publisher.publish(node)

    # ------------------------------------------------------------------ policies

    @kopf.on.event(GROUP, VERSION, POLICY_PLURAL, registry=registry)
    async def policy_changed(
        type: str | None, name: str, body: kopf.Body, memo: Any, **kwargs: Any
    ) -> None:
        state = _state(memo)
        if state.indexes is None:  # the same live index views for every handler call
            state.indexes = {key: kwargs[key] for key in INDEXES}
        if type == "DELETED":
            state.workers.stop(name)
            return
        state.workers.ensure(name, functools.partial(plan_policy, state, name))
        try:
            parse_policy(body)
        except ValidationError as error:
            message = await report_invalid(state, name, body, error)
            raise kopf.PermanentError(message) from error

    return registry


def _plannable(body: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    if body is None:
        return False
    try:
        parse_policy(body)
    except ValidationError:
        return False  # reported by policy_changed; wait for the next change
    return True


async def plan_policy(state: OperatorState, name: str, signals: Signals) -> None:
    """The planning loop of one policy (run by `state.workers`): a round whenever something it
    watches changed, when a held-back plan is due (batch window, pacing), after a failure's
    retry delay, and every FULL_ROUND_S regardless; every round recomputes from the indexes
    (through the shared scope cache). Ends when stopped (the policy's DELETED event, or the
    operator's exit)."""
    wake, stopped = signals.wake, signals.stopped
    reported: str | None = None  # the failure last told in an Event, while it lasts
    seen = -1  # state.changes when the last round began
    again = True  # the last round wants another one even if nothing changes
    last_round = 0.0
    try:
        while not stopped.is_set():
            wake.clear()
            assert state.indexes is not None  # set before the first worker starts
            wait = state.tick_s
            if again or seen != state.changes or time.monotonic() - last_round > FULL_ROUND_S:
                seen, last_round = state.changes, time.monotonic()
                body = _flatten(state.indexes["policies_index"]).get(name)
                again = False
                if _plannable(body):
                    round_ = PolicyRound(state, name, body, cluster_from(state.indexes))
                    outcome = await survive(round_.run, state.tick_s)
                    wait = outcome.wait
                    again = round_.deferred or outcome.failure is not None
                    if round_.deferred and outcome.failure is None:
                        wait = min(wait, max(round_.retry_in_s, SETTLE_S))
                    if outcome.failure is not None:
                        report_failure(state, name, body, outcome, tell=outcome.failure != reported)
                    reported = outcome.failure
            if stopped.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=wait)
                # Woken by an index handler, which runs before kopf stores its result:
                # let the index settle (and a burst of events coalesce) first.
                await asyncio.sleep(SETTLE_S)
    finally:
        state.metrics.forget_policy(name)


def report_failure(
    state: OperatorState, name: str, body: Mapping[str, Any], outcome: Outcome, *, tell: bool
) -> None:
    """Count and log a failed round; `tell`: also post a RoundFailed Event (once per distinct
    failure, not once per retry)."""
    assert outcome.failure is not None
    kind = "permanent" if outcome.permanent else "temporary"
    state.metrics.round_failures.labels(name, kind).inc()
    log.warning(
        "policy_round_failed",
        policy=name,
        kind=kind,
        error=outcome.failure,
        retry_in_s=outcome.wait,
    )
    if tell:
        state.effects.event(body, "Warning", "RoundFailed", outcome.failure[:1000])
