"""Leader election with a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does.

Several operators may run (a Deployment of 2 replicas, a rollout, someone's laptop): one holds
the Lease and writes, the others keep their watches warm and write nothing. The record and its
rules are client-go's:

- a candidate takes the Lease when nobody holds it, or when it has not seen the holder's record
  change for `leaseDurationSeconds` of *its own* monotonic clock (the other side's renewTime is
  never compared with our wall clock);
- every write is an update at the resourceVersion read (optimistic concurrency): of two
  candidates, one gets 409 Conflict and stays a candidate;
- a new holder increments `leaseTransitions` and sets `acquireTime`; the holder renews
  `renewTime` every `retry_s`, by updating the record it last wrote at that resourceVersion
  without reading it first (client-go's fast path; a conflict falls back to read and update);
  on a clean exit it releases the Lease (holder cleared, duration 1 s) so that a standby takes
  over at once.

One departure from client-go: a process that lost its term and takes the Lease again (nobody
else took it) starts a new term and increments `leaseTransitions` too, so that every term has
its own number. That number is the *fencing token* (`Term.token`) the operator writes into each
MigNode spec: an agent refuses a spec whose token is lower than one it already applied.

The fence itself is local (`holds`): a term lasts while the last successful renewal (its start
on the monotonic clock, before the request was sent) is younger than `renew_deadline_s`. That
is shorter than the lease duration another candidate waits for, so a leader whose renewals fail,
whose process was frozen, or whose Lease was taken stops writing before anyone else can start:
`holds` needs no request and cannot be fooled by a renewal that succeeds late.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from migpart import __version__
from migpart.dra import micro_time

log = structlog.get_logger(__name__)

LEASE_NAME = "migpart-operator"
# the Lease's namespace outside a pod (no $POD_NAMESPACE, no service account): the manifests'
DEFAULT_NAMESPACE = "migpart-system"
# each operator's user agent, so each write's managedFields manager names the identity
MANAGER_PREFIX = "migpart-operator-"
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


def user_agent(identity: str) -> str:
    """The user agent of an operator that campaigns as `identity`."""
    return f"{MANAGER_PREFIX}{identity}/{__version__}"


def new_identity() -> str:
    """hostname + random, as client-go callers do: a restarted process is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"


class Conflict(Exception):
    """The Lease changed (or was created) since it was read: read it again."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The spec of the election Lease, and the resourceVersion it was read at."""

    holder: str = ""
    duration_s: int = int(LEASE_DURATION_S)
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""

    @staticmethod
    def of(body: dict[str, Any]) -> LeaseRecord:
        spec = body.get("spec") or {}
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((body.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time is not None:
            out["acquireTime"] = self.acquire_time
        if self.renew_time is not None:
            out["renewTime"] = self.renew_time
        return out

    def seen_as(self) -> tuple[str, str | None, int, str]:
        """What makes a record new to an observer (client-go compares the whole record)."""
        return (self.holder, self.renew_time, self.transitions, self.resource_version)


class LeaseStore(Protocol):
    """The election Lease on the API server (`KubeLeaseStore`) or in memory (tests)."""

    async def get(self) -> LeaseRecord | None:
        """The Lease now (None: there is none)."""
        ...

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create it; raises `Conflict` when it exists."""
        ...

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace it at `record.resource_version`; raises `Conflict` when it changed."""
        ...


class KubeLeaseStore:
    """`LeaseStore` on the API server; bodies read as plain JSON."""

    def __init__(self, api: ApiClient, namespace: str, name: str, timeout_s: float) -> None:
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s
        self._leases: Any = CoordinationV1Api(api)

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
        response = await method(*args, _preload_content=False, _request_timeout=self.timeout_s)
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status == 409:
            raise Conflict(body.decode(errors="replace")[:200])
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=body.decode(errors="replace"))
        parsed: dict[str, Any] = json.loads(body)
        return parsed

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": "migpart"},
        }
        if record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": record.spec(),
        }

    async def get(self) -> LeaseRecord | None:
        try:
            body = await self._call(self._leases.read_namespaced_lease, self.name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return LeaseRecord.of(body)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(replace(record, resource_version=""))
        created = await self._call(self._leases.create_namespaced_lease, self.namespace, body)
        return LeaseRecord.of(created)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(record)
        try:
            replaced = await self._call(
                self._leases.replace_namespaced_lease, self.name, self.namespace, body
            )
        except ApiException as err:
            if err.status == 404:  # deleted since it was read
                raise Conflict("the Lease was deleted") from err
            raise
        return LeaseRecord.of(replaced)


class UnopenedLeaseStore:
    """The store of an elector whose client a thread opens later (`ElectionThread`)."""

    async def get(self) -> LeaseRecord | None:
        raise RuntimeError("the election's Lease store is not open yet")

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        raise RuntimeError("the election's Lease store is not open yet")

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        raise RuntimeError("the election's Lease store is not open yet")


@dataclass(frozen=True, slots=True, eq=False)
class Term:
    """One leadership of one process. Compared by identity: a process that leads again has a
    new term, and a write decided under the old one must not pass under the new one."""

    token: int | None
    """The fencing token written into specs (the Lease's transitions when the term began;
    None: no election, nothing to fence)."""
    identity: str


class Leadership(Protocol):
    """What the operator's writes ask before they are sent."""

    def holds(self, term: Term | None) -> bool:
        """Whether `term` is this process's term and has not ended."""
        ...

    def current(self) -> Term | None:
        """The term held now (None: not leading)."""
        ...


@dataclass
class Unelected:
    """`Leadership` without election (`--leader-elect=false`): one term that never ends and
    carries no token. The operator is then the only writer by its user's word."""

    term: Term = field(default_factory=lambda: Term(None, "unelected"))

    def holds(self, term: Term | None) -> bool:
        return term is self.term

    def current(self) -> Term | None:
        return self.term


Callback = Callable[[Term | None], None]


@dataclass
class LeaderElector:
    """Campaign for the Lease in `store`, renew it while leading (`run`), release it at the end.

    `clock` is monotonic (expiry and the fence); `wall` gives the times written into the record
    (informational, as in client-go). `on_change(term)` is called when this process starts
    leading (the new term) and when it stops (None)."""

    store: LeaseStore
    identity: str
    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_s: float = RETRY_PERIOD_S
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    on_change: list[Callback] = field(default_factory=list)
    _term: Term | None = None
    _renewed_at: float = 0.0  # monotonic start of the last successful renewal of `_term`
    _observed: tuple[str, str | None, int, str] | None = None
    _observed_at: float = 0.0  # monotonic time `_observed` was first seen
    _record: LeaseRecord | None = None  # as we last wrote or read it

    # ------------------------------------------------------------------ the fence

    def holds(self, term: Term | None) -> bool:
        return (
            term is not None
            and term is self._term
            and self.clock() - self._renewed_at < self.renew_deadline_s
        )

    def current(self) -> Term | None:
        term = self._term  # read once: `ElectionThread` changes it from another thread
        return term if self.holds(term) else None

    @property
    def holder(self) -> str:
        """The holder as last observed ("" : none seen)."""
        return self._record.holder if self._record is not None else ""

    # ------------------------------------------------------------------ one attempt

    async def try_acquire_or_renew(self) -> bool:
        """One attempt, client-go's `tryAcquireOrRenew`: True when this process leads after it
        (a new term begins when it did not lead before). Raises API and network errors."""
        started = self.clock()
        now = micro_time(self.wall())
        renewed = await self._renew_as_written(started, now)
        if renewed is not None:
            return renewed
        current = await self.store.get()
        if current is None:
            record = LeaseRecord(self.identity, round(self.lease_duration_s), now, now, 0, "")
            try:
                written = await self.store.create(record)
            except Conflict:
                return False
            return self._won(written, started)
        self._observe(current, started)
        ours = current.holder == self.identity
        if current.holder and not ours and started < self._observed_at + current.duration_s:
            return False  # held by another, and not expired by our clock
        leading = self._term is not None and self.holds(self._term) and ours
        record = LeaseRecord(
            holder=self.identity,
            duration_s=round(self.lease_duration_s),
            acquire_time=current.acquire_time if leading else now,
            renew_time=now,
            transitions=current.transitions if leading else current.transitions + 1,
            resource_version=current.resource_version,
        )
        try:
            written = await self.store.update(record)
        except Conflict:
            return False
        return self._renewed(written, started) if leading else self._won(written, started)

    async def _renew_as_written(self, started: float, now: str) -> bool | None:
        """client-go's fast path for a leader: update the record it last wrote, at that
        resourceVersion, without reading it first. One request instead of two, so a renewal
        under a slow API server or a busy process takes half as long. If anyone wrote the Lease
        since, the update conflicts and this returns None: the caller reads it (the slow path).
        """
        term, written = self._term, self._record
        if (
            term is None
            or not self.holds(term)
            or written is None
            or written.holder != self.identity
            or not written.resource_version
        ):
            return None
        try:
            renewed = await self.store.update(replace(written, renew_time=now))
        except Conflict:
            return None
        return self._renewed(renewed, started)

    def _renewed(self, written: LeaseRecord, started: float) -> bool:
        """The leader's renewal `written`, begun at `started`, came back."""
        if not self.holds(self._term):
            # renewed, but only after the deadline (the process stalled with the request in
            # flight): the term is over; the next attempt begins a new one, with a new token
            self._lost("the renewal came back after the renew deadline")
            return False
        return self._won(written, started)

    def _observe(self, record: LeaseRecord, at: float) -> None:
        self._record = record
        if record.seen_as() != self._observed:
            self._observed, self._observed_at = record.seen_as(), at

    def _won(self, written: LeaseRecord, started: float) -> bool:
        """We wrote `written` with a request begun at `started`."""
        self._record = written
        self._observed, self._observed_at = written.seen_as(), started
        if self._term is not None and self.holds(self._term):
            self._renewed_at = started
            return True
        if self._term is not None:
            self._lost("the renew deadline passed")
        self._term = Term(written.transitions, self.identity)
        self._renewed_at = started
        log.info(
            "leadership_acquired",
            identity=self.identity,
            token=written.transitions,
        )
        self._tell(self._term)
        return True

    def _lost(self, why: str) -> None:
        if self._term is None:
            return
        log.warning("leadership_lost", identity=self.identity, token=self._term.token, why=why)
        self._term = None
        self._tell(None)

    def _tell(self, term: Term | None) -> None:
        for callback in self.on_change:
            callback(term)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Campaign and renew until cancelled; every `retry_s` one attempt. A term ends when
        the Lease shows another holder or no renewal succeeded for `renew_deadline_s`."""
        failing = False
        while True:
            if self._term is not None and not self.holds(self._term):
                self._lost(f"not renewed for {self.renew_deadline_s:g} s")
            try:
                leading = await self.try_acquire_or_renew()
                if failing:
                    log.info("leader_lease_reachable", identity=self.identity)
                failing = False
            except (ApiException, aiohttp.ClientError, TimeoutError) as err:
                if not failing:
                    log.warning(
                        "leader_lease_failed",
                        identity=self.identity,
                        error=str(err).splitlines()[0] if str(err) else type(err).__name__,
                    )
                failing, leading = True, self._term is not None and self.holds(self._term)
            if not leading and self._term is not None and self.holder != self.identity:
                self._lost(f"the Lease is held by {self.holder or 'nobody'}")
            await self.sleep(self.retry_s)

    async def release(self) -> None:
        """End the term and give the Lease up (holder cleared), so that a standby takes over at
        once; a failure only costs the standby one lease duration."""
        term, record = self._term, self._record
        self._lost("released")
        if term is None or record is None or record.holder != self.identity:
            return
        now = micro_time(self.wall())
        released = replace(record, holder="", duration_s=1, acquire_time=now, renew_time=now)
        try:
            await self.store.update(released)
            log.info("leadership_released", identity=self.identity)
        except (Conflict, ApiException, aiohttp.ClientError, TimeoutError) as err:
            log.warning("leader_lease_release_failed", error=str(err)[:200])


# (store, close): a Lease store on a client of its own, and how to close that client
StoreOpener = Callable[[], Awaitable[tuple[LeaseStore, Callable[[], Awaitable[None]]]]]


class ElectionThread:
    """A `LeaderElector` run in a thread of its own, with its own event loop and API client.

    The operator's event loop is busy exactly when renewals matter: a burst brings thousands of
    watch events and rounds that plan for seconds at a time. A renewal that waits behind them
    for its turn on that loop comes back late, the term ends and the next one republishes what
    differs (measured at 1,000 nodes: two Lease losses in each of two bursts). client-go runs
    its renewals in a goroutine of their own; this is that goroutine. The fence is unchanged:
    `holds` reads the term and the start of its last renewal, which the thread writes (a
    reader that sees the new term before its renewal time refuses, the safe side).

    `on_change` callbacks run on the loop that called `start`, in the order the terms changed."""

    def __init__(self, elector: LeaderElector, open_store: StoreOpener) -> None:
        self.elector = elector
        self.on_change: list[Callback] = []
        self._open_store = open_store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._campaign: asyncio.Task[None] | None = None  # on the thread's loop

    @property
    def identity(self) -> str:
        return self.elector.identity

    def holds(self, term: Term | None) -> bool:
        return self.elector.holds(term)

    def current(self) -> Term | None:
        return self.elector.current()

    async def start(self) -> None:
        """Start the thread, open its client and begin campaigning; raises what opening the
        client raised (the thread is then stopped)."""
        caller = asyncio.get_running_loop()

        def tell(term: Term | None) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop closed: it exits
                caller.call_soon_threadsafe(self._deliver, term)

        self.elector.on_change.append(tell)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=loop.run_forever, name="leader-election", daemon=True
        )
        self._thread.start()
        try:
            await self._on_thread(self._begin())
        except BaseException:
            await self._end_thread()
            raise

    def _deliver(self, term: Term | None) -> None:
        for callback in self.on_change:
            callback(term)

    async def _on_thread(self, work: Coroutine[Any, Any, None]) -> None:
        if self._loop is None:
            raise RuntimeError("the election thread is not running")
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _begin(self) -> None:
        self.elector.store, close = await self._open_store()

        async def campaign() -> None:
            try:
                await self.elector.run()
            finally:
                await self.elector.release()  # a standby takes over at once
                await close()

        self._campaign = asyncio.create_task(campaign(), name="leader-election")

    async def _finish(self) -> None:
        campaign = self._campaign
        if campaign is not None:
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign

    async def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)
        loop.close()
        self._loop = self._thread = None

    async def stop(self) -> None:
        """End the term, release the Lease, close the thread's client and end the thread."""
        if self._loop is None:
            return
        await self._on_thread(self._finish())
        await self._end_thread()
