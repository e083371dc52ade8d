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

The Lease record and where it is kept: `kube/election_lease.py`; the thread the operator runs
the elector in: `kube/election_thread.py`.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

import aiohttp
import structlog
from kubernetes_asyncio.client.exceptions import ApiException

from migpart import __version__
from migpart.kube.election_lease import LEASE_DURATION_S, Conflict, LeaseRecord, LeaseStore
from migpart.slices.dra import micro_time

log = structlog.get_logger(__name__)

# each operator's user agent, so each write's managedFields manager names the identity
MANAGER_PREFIX = "migpart-operator-"
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


def user_agent(identity: str) -> str:
    """The user agent of an operator that campaigns as `identity`."""
    return f"{MANAGER_PREFIX}{identity}/{__version__}"


def new_identity() -> str:
    """hostname + random, as client-go callers do: a restarted process is a new candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"


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
