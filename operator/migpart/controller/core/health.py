"""The operator's health and its nodes' health.

- `/metrics`, `/healthz` and `/readyz` on one port (aiohttp, which kopf already brings).
  `/healthz` answers while the process runs; `/readyz` once kopf has started its watches and
  the API server serves migpart's CRDs (`await_crds`).
- `NodeHealth`: which nodes are unavailable (not opted in, offered by another publisher, agent
  Lease expired, or kubelet plugin not registered), fed by the Node watch, the Lease watch
  (`kube.leases`) and the MigNode events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import structlog
from aiohttp import web
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from migpart.api.leases import LEASE_DURATION_S
from migpart.api.models import (
    GROUP,
    MIGNODE_PLURAL,
    POLICY_PLURAL,
    VERSION,
    KubeletPluginStatus,
    UnavailableReason,
)
from migpart.clock import Clock
from migpart.kube.client import missing_resources

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 30.0
REGISTRATION_GRACE_S = 10.0
"""How long a node whose plugin kubelet had registered stays in service after its agent reports
it not registered (a restarted agent does so until kubelet registers it again, about a second
later), while its Lease is fresh. Well under kubelet's own 30 s before it wipes the slices of a
plugin that went away."""


async def serve(
    port: int,
    registry: CollectorRegistry,
    ready: asyncio.Event,
    host: str = "0.0.0.0",
    served: asyncio.Event | None = None,
) -> web.AppRunner:
    """Start serving; the caller cleans the returned runner up. Ready once `ready` (kopf's
    watches) and `served` (the CRDs, when given) are both set."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if served is not None and not served.is_set():
            return web.Response(status=503, text="waiting for migpart's CRDs to be served")
        if ready.is_set():
            return web.Response(text="ok")
        return web.Response(status=503, text="starting")

    app = web.Application()
    app.add_routes(
        [web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def await_crds(api: ApiClient, served: asyncio.Event, clock: Clock) -> None:
    """Set `served` once the API server serves MigNodes and GpuPartitionPolicies. Until then
    retry with back-off, telling each missing resource in one log line (not one per attempt).
    kopf itself starts watching a CRD's resource when the CRD appears; this only makes the
    wait visible and keeps `/readyz` false meanwhile."""
    backoff = 0.5
    told: list[str] = []
    while True:
        try:
            missing = await missing_resources(api, GROUP, VERSION, (MIGNODE_PLURAL, POLICY_PLURAL))
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            missing = told or [f"{p}.{GROUP}/{VERSION}" for p in (MIGNODE_PLURAL, POLICY_PLURAL)]
            log.warning("crd_check_failed", error=str(err).splitlines()[0] if str(err) else "")
        if not missing:
            if told:
                log.info("resources_served", resources=told)
            served.set()
            return
        if missing != told:
            log.warning(
                "resource_not_served",
                resources=missing,
                retry=f"with back-off up to {MAX_BACKOFF_S:g} s",
            )
            told = missing
        await clock.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


@dataclass
class StaleMarks:
    """The `Stale` condition of MigNodes whose agent stopped renewing its Lease: what must
    still be written, what the MigNodes say now, and what our last write went over."""

    # node -> the Stale condition its MigNode must still get (True) or lose (False)
    pending: dict[str, bool] = field(default_factory=dict)
    # nodes whose MigNode says Stale=True now (from the MigNode events)
    flagged: set[str] = field(default_factory=set)
    # node -> the resourceVersion our last Stale write went over: while the newest body seen is
    # still that one, it does not show the write yet and cannot tell whether one is needed
    written_over: dict[str, str] = field(default_factory=dict)

    def seen(self, node: str, stale: bool) -> None:
        """The node's MigNode, as the watch shows it, says Stale=True (`stale`) or not."""
        if stale:
            self.flagged.add(node)
        else:
            self.flagged.discard(node)

    def forget(self, node: str) -> None:
        self.pending.pop(node, None)
        self.flagged.discard(node)
        self.written_over.pop(node, None)


@dataclass
class NodeHealth:
    """Which nodes the operator leaves alone, and why, in this order: the Node does not carry
    the opt-in labels (`selects`, the operator's `--node-selector`: `NotOptedIn`), the agent
    reports that NVIDIA's device plugin or DRA driver already offers the node's GPUs (its
    MigNode's `PublisherOverlap` condition: `PublisherOverlap`), the agent's Lease has not been
    seen renewed for `timeout_s` (`LeaseExpired`), or the agent reports that kubelet has not
    registered its plugin (`PluginNotRegistered`). Such a node is left out of every policy's
    scope (nothing planned there, its `maxConcurrentNodes` slot free) and its slice lists no
    device.

    Until the Node watch has listed once no node is judged by its labels: a restarted operator
    that saw the MigNodes first must not empty every slice for a moment.

    Freshness is judged by when *this operator* saw a Lease's renewTime change (its own
    monotonic clock), not by the renewTime itself: clocks of nodes and operator may differ, as
    the node lifecycle controller also assumes. Until the Lease watch has listed once nothing is
    stale, and a node is given `timeout_s` from that first list (or from when it was last seen
    renewed, if later): a restarted operator takes no node out of service for a Lease it merely
    has not seen yet. A node that has no Lease at all is not judged by one: its agent predates
    Leases (during an upgrade, old agents run next to a new operator until the DaemonSet has
    rolled, and their nodes must not lose their devices meanwhile).

    Registration has a grace (`registration_grace_s`): a node whose agent reported the plugin
    registered and now reports it not registered stays available that long, measured from the
    first report that said so, as a restarted agent reports "waiting for kubelet" until
    kubelet registers it again. A node never seen registered by this operator gets no grace.

    `check()` (every tick) recomputes lease staleness and registration graces and returns what
    changed; `reason()` answers from the last check, so a planning round and the slice
    publisher read a dict, never a clock per node. A check costs what can have changed, not
    the cluster's size (at 1,000 nodes a pass over all of them every second was a fifth of the
    idle operator's CPU): renewals are kept in the order they were seen, so the nodes whose
    Lease can have expired are the oldest ones, at the front; besides those it looks only at
    nodes already unavailable, nodes in a registration grace, and, after a (re)list, at all.
    """

    # the operator's (`migpart.clock`): when a renewal was seen, a registration grace's end
    clock: Clock
    timeout_s: float = float(LEASE_DURATION_S)
    registration_grace_s: float = REGISTRATION_GRACE_S
    # node -> (renewTime last seen, monotonic time it was seen to change), oldest change first
    _renewals: dict[str, tuple[str, float]] = field(default_factory=dict)
    # the next check looks at every known node (set by each (re)list of the Leases)
    _full: bool = True
    _synced_at: float | None = None
    # the Lease watch broke and has not listed again: renewals are not seen, so nothing may be
    # judged stale (an operator cut off from the API server must not empty every slice)
    _blind: bool = False
    _nodes: set[str] = field(default_factory=set)
    # node -> kubelet's refusal or "waiting", while the agent reports it not registered
    _unregistered: dict[str, str] = field(default_factory=dict)
    _registered: set[str] = field(default_factory=set)  # nodes last reported registered
    # node -> until when it stays in service, not registered after it was (registration grace)
    _grace_until: dict[str, float] = field(default_factory=dict)
    _unavailable: dict[str, UnavailableReason] = field(default_factory=dict)
    # nodes whose verdict changed since the last check (by a check, or by a MigNode event)
    _changed: set[str] = field(default_factory=set)
    # whether a Node's labels opt it in (None: every node is managed)
    selects: Callable[[Mapping[str, str]], bool] | None = None
    _nodes_listed: bool = False
    _not_selected: set[str] = field(default_factory=set)  # Nodes that did not opt in
    # node -> the agent's PublisherOverlap message, while that condition is True
    _overlap: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------ the Node watch

    def nodes_listed(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        """Every Node with its labels, at each (re)list of the Node watch."""
        self._not_selected = {n for n, lbl in labels.items() if not self._selected(lbl)}
        self._nodes_listed = True
        self._full = True

    def node_changed(self, name: str, labels: Mapping[str, str] | None) -> None:
        """A Node event (None: the Node was deleted); its verdict follows at once."""
        if labels is not None and self._selected(labels):
            self._not_selected.discard(name)
        else:
            self._not_selected.add(name)
        if name in self._nodes:
            self._update(name)

    def _selected(self, labels: Mapping[str, str]) -> bool:
        return self.selects is None or self.selects(labels)

    # ------------------------------------------------------------ the Lease watch (LeaseSink)

    def leases_listed(self, renewals: Mapping[str, str]) -> None:
        now = self.clock.monotonic()
        for gone in set(self._renewals) - set(renewals):
            del self._renewals[gone]
        for node, renew in renewals.items():
            self._renewed(node, renew, now)
        if self._synced_at is None or self._blind:
            self._synced_at = now  # every Lease gets a full timeout from here
            self._blind = False
        self._full = True

    def lease_watch_broken(self) -> None:
        self._blind = True

    def lease_renewed(self, node: str, renew_time: str) -> None:
        self._renewed(node, renew_time, self.clock.monotonic())

    def lease_deleted(self, node: str) -> None:
        self._renewals.pop(node, None)

    def _renewed(self, node: str, renew_time: str, now: float) -> None:
        known = self._renewals.get(node)
        if known is None or known[0] != renew_time:
            self._renewals.pop(node, None)  # to the back: the order is the order seen
            self._renewals[node] = (renew_time, now)

    # ------------------------------------------------------------ MigNodes

    def mignode(
        self, name: str, plugin: KubeletPluginStatus | None, overlap: str | None = None
    ) -> bool:
        """A MigNode event (`overlap`: the message of its `PublisherOverlap` condition while
        True); returns whether the node's availability changed. A registration or overlap
        change takes effect at once (the slice published right after must follow it); the
        next check still reports it, so that it is acted on in one place."""
        self._nodes.add(name)
        if overlap is None:
            self._overlap.pop(name, None)
        else:
            self._overlap[name] = overlap
        if plugin is not None and not plugin.registered:
            if name in self._registered:  # registered until now: a restarted agent, likely
                self._grace_until[name] = self.clock.monotonic() + self.registration_grace_s
            self._registered.discard(name)
            self._unregistered[name] = plugin.message
        else:
            if plugin is not None:
                self._registered.add(name)
            self._unregistered.pop(name, None)
            self._grace_until.pop(name, None)
        return self._update(name)

    def forget(self, name: str) -> None:
        self._nodes.discard(name)
        self._unregistered.pop(name, None)
        self._registered.discard(name)
        self._grace_until.pop(name, None)
        self._unavailable.pop(name, None)
        self._changed.discard(name)
        self._overlap.pop(name, None)

    # ------------------------------------------------------------ verdicts

    @property
    def synced(self) -> bool:
        """Whether the Lease watch has listed once (before that, no node is stale)."""
        return self._synced_at is not None

    def silent_s(self, node: str) -> float | None:
        """Seconds since this node's Lease was last seen renewed (None before the first list,
        and for a node without a Lease)."""
        renewal = self._renewals.get(node)
        if self._synced_at is None or renewal is None:
            return None
        return self.clock.monotonic() - max(renewal[1], self._synced_at)

    def heard_since_listed(self, node: str) -> bool:
        """Whether this node's Lease was seen renewed after the first list: proof that its
        agent lives now, not only that a Lease exists."""
        renewal = self._renewals.get(node)
        return self._synced_at is not None and renewal is not None and renewal[1] > self._synced_at

    def _reason(self, node: str) -> UnavailableReason | None:
        if self._nodes_listed and node in self._not_selected:
            return "NotOptedIn"
        if node in self._overlap:
            return "PublisherOverlap"
        silent = self.silent_s(node)
        if silent is not None and silent > self.timeout_s:
            return "LeaseExpired"
        if node in self._unregistered:
            if self.clock.monotonic() < self._grace_until.get(node, 0.0):
                return None  # registered within the grace: kubelet is registering it again
            return "PluginNotRegistered"
        return None

    def _update(self, node: str) -> bool:
        reason = self._reason(node)
        if reason == self._unavailable.get(node):
            return False
        if reason is None:
            del self._unavailable[node]
        else:
            self._unavailable[node] = reason
        self._changed.add(node)
        return True

    def check(self) -> list[str]:
        """Recompute every known node; returns the nodes whose availability changed since the
        last check (here or by a MigNode event). While the Lease watch is broken no Lease
        verdict changes."""
        if not self._blind:
            for node in self._candidates():
                self._update(node)
        changed = sorted(self._changed)
        self._changed.clear()
        return changed

    def _candidates(self) -> set[str]:
        """The known nodes whose verdict can have changed since the last check: those whose
        Lease has gone unrenewed for longer than the timeout (the front of `_renewals`), those
        unavailable now (a renewal, a deleted Lease or an ended grace can bring them back),
        those in a registration grace; all of them after a (re)list."""
        if self._full:
            self._full = False
            return set(self._nodes)
        candidates = {*self._unavailable, *self._grace_until}
        if self._synced_at is not None:
            # renewed before this (and not since) means silent for longer than the timeout
            cutoff = self.clock.monotonic() - self.timeout_s
            if self._synced_at < cutoff:
                for node, (_, seen) in self._renewals.items():
                    if seen >= cutoff:
                        break
                    candidates.add(node)
        return candidates & self._nodes

    def reason(self, node: str) -> UnavailableReason | None:
        """Why `node` is unavailable as of the last check (None: it is available)."""
        return self._unavailable.get(node)

    def unavailable(self) -> Mapping[str, UnavailableReason]:
        """Every unavailable node with its reason, as of the last check (a live view)."""
        return self._unavailable

    def describe(self, node: str) -> str:
        """A sentence for conditions and logs."""
        reason = self.reason(node)
        if reason == "NotOptedIn":
            return "the Node does not carry the labels of the operator's --node-selector"
        if reason == "PublisherOverlap":
            return self._overlap.get(node) or "another publisher offers the node's GPUs"
        if reason == "LeaseExpired":
            silent = self.silent_s(node) or 0.0
            return (
                f"the agent's Lease was not renewed for {silent:.0f} s "
                f"(timeout {self.timeout_s:g} s): agent down or cut off from the API server"
            )
        if reason == "PluginNotRegistered":
            why = self._unregistered.get(node) or "no reason given"
            return f"kubelet has not registered the DRA plugin: {why}"
        return "available"
