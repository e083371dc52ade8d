"""kube.election: client-go's Lease rules on the in-memory Lease store, time from an injected
clock (no sleeping, no wall clock); then `ElectionThread` on real clocks, whose point is what
happens while the caller's loop is blocked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.kube.election import LeaderElector, Term
from migpart.kube.election_lease import Conflict, LeaseRecord, LeaseStore
from migpart.kube.election_thread import ElectionThread, StoreOpener
from migpart.testing.leases import InMemoryLeaseStore


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def candidate(store: InMemoryLeaseStore, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(
        store,
        identity,
        lease_duration_s=15,
        renew_deadline_s=10,
        retry_s=2,
        clock=clock,
        wall=lambda: datetime(2026, 1, 1, tzinfo=UTC),
    )


async def test_the_first_candidate_creates_the_lease_and_leads() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a = candidate(store, "a", clock)
    terms: list[Term | None] = []
    a.on_change.append(terms.append)
    assert await a.try_acquire_or_renew()
    assert store.record is not None
    assert (store.record.holder, store.record.transitions) == ("a", 0)
    assert store.record.duration_s == 15
    assert store.record.acquire_time == store.record.renew_time == "2026-01-01T00:00:00.000000Z"
    (term,) = terms
    assert term is not None
    assert term.token == 0
    assert term.identity == "a"
    assert a.holds(term)
    assert a.current() is term


async def test_renewing_keeps_the_term_acquire_time_and_transitions() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a = candidate(store, "a", clock)
    await a.try_acquire_or_renew()
    term = a.current()
    first = store.record
    for _ in range(5):
        clock.now += 2
        assert await a.try_acquire_or_renew()
    assert a.current() is term
    assert store.record is not None
    assert first is not None
    assert store.record.transitions == first.transitions
    assert store.record.acquire_time == first.acquire_time
    assert int(store.record.resource_version) == int(first.resource_version) + 5


async def test_a_leader_renews_with_one_update_and_no_read() -> None:
    """client-go's fast path: the holder updates the record it wrote, at its version."""
    store, clock = InMemoryLeaseStore(), Clock()
    a = candidate(store, "a", clock)
    await a.try_acquire_or_renew()
    reads, writes = store.reads, store.writes
    for _ in range(3):
        clock.now += 2
        assert await a.try_acquire_or_renew()
    assert (store.reads - reads, store.writes - writes) == (0, 3)


async def test_a_leader_whose_lease_was_taken_falls_back_to_reading_it_and_stops() -> None:
    """Someone wrote the Lease since the leader's last renewal (another holder, say an
    operator that did not see it renew): the fast path's update conflicts, the read shows the
    other holder, and the leader renews nothing and stops at its deadline."""
    store, clock = InMemoryLeaseStore(), Clock()
    a = candidate(store, "a", clock)
    await a.try_acquire_or_renew()
    term = a.current()
    assert store.record is not None
    store.record = replace(store.record, holder="b", resource_version="taken")
    clock.now += 2
    reads = store.reads
    assert not await a.try_acquire_or_renew()
    assert store.reads == reads + 1
    assert store.record.holder == "b"
    clock.now += 8.1
    assert not a.holds(term)


async def test_a_second_candidate_waits_a_lease_duration_of_its_own_clock() -> None:
    store = InMemoryLeaseStore()
    clock_a, clock_b = Clock(), Clock(now=-50_000.0)  # the clocks need not agree
    a, b = candidate(store, "a", clock_a), candidate(store, "b", clock_b)
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # first sight of a's record
    clock_b.now += 14.9
    assert not await b.try_acquire_or_renew()  # not expired by b's clock yet
    assert store.record is not None
    assert store.record.holder == "a"
    clock_b.now += 0.2
    assert await b.try_acquire_or_renew()
    assert store.record.holder == "b"
    assert store.record.transitions == 1
    term = b.current()
    assert term is not None
    assert term.token == 1


async def test_a_renewal_seen_restarts_the_standbys_wait() -> None:
    store = InMemoryLeaseStore()
    clock_a, clock_b = Clock(), Clock()
    a, b = candidate(store, "a", clock_a), candidate(store, "b", clock_b)
    await a.try_acquire_or_renew()
    for _ in range(10):  # a renews every 2 s, b looks every 2 s: never expired
        clock_a.now += 2
        clock_b.now += 2
        await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()


async def test_of_two_racing_candidates_the_conflict_loses() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    await a.try_acquire_or_renew()
    await a.release()
    # both read the released Lease; a writes first, so b's update at the old version conflicts
    read = store.record
    assert read is not None
    assert read.holder == ""
    assert await b.try_acquire_or_renew()
    stale = replace(read, holder="a")
    with pytest.raises(Conflict):
        await store.update(stale)
    assert store.record is not None
    assert store.record.holder == "b"


async def test_a_leader_that_conflicts_on_renewal_keeps_the_term_until_the_deadline() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a = candidate(store, "a", clock)
    await a.try_acquire_or_renew()
    term = a.current()
    assert store.record is not None
    # someone else wrote the Lease (a's next update conflicts), its holder still a
    store.record = replace(store.record, resource_version="other")
    a._record = replace(store.record, resource_version="older")

    async def conflicting(record: LeaseRecord) -> LeaseRecord:
        raise Conflict("changed")

    store.update = conflicting  # type: ignore[method-assign]
    clock.now += 2
    assert not await a.try_acquire_or_renew()
    assert a.holds(term)  # 2 s since the last renewal: still within the renew deadline
    clock.now += 8.1
    assert not a.holds(term)  # 10.1 s: the fence has closed, no request needed
    assert a.current() is None


async def test_a_frozen_leader_wakes_up_fenced_and_its_next_term_is_new() -> None:
    store = InMemoryLeaseStore()
    clock_a, clock_b = Clock(), Clock()
    a, b = candidate(store, "a", clock_a), candidate(store, "b", clock_b)
    await a.try_acquire_or_renew()
    old = a.current()
    assert old is not None
    await b.try_acquire_or_renew()
    clock_a.now += 30  # SIGSTOP for 30 s
    clock_b.now += 16
    assert await b.try_acquire_or_renew()  # b takes over after the lease duration
    assert not a.holds(old)  # a, woken, is fenced before it sends anything
    assert not await a.try_acquire_or_renew()  # and cannot take the Lease back
    assert a.current() is None
    # b goes away without releasing; a takes the Lease again: a new term, a new token
    clock_a.now += 16
    assert await a.try_acquire_or_renew()
    new = a.current()
    assert new is not None
    assert new is not old
    assert old.token is not None
    assert new.token is not None
    assert new.token > old.token
    assert not a.holds(old)


async def test_release_clears_the_holder_and_a_standby_takes_over_at_once() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    a, b = candidate(store, "a", clock), candidate(store, "b", clock)
    changes: list[Term | None] = []
    a.on_change.append(changes.append)
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert changes[-1] is None
    assert a.current() is None
    assert store.record is not None
    assert (store.record.holder, store.record.duration_s) == ("", 1)
    assert await b.try_acquire_or_renew()  # no wait: nobody holds it
    assert store.record.holder == "b"


async def test_run_ends_the_term_when_renewals_fail_past_the_deadline() -> None:
    store, clock = InMemoryLeaseStore(), Clock()
    changes: list[Term | None] = []
    rounds = 0

    async def sleep(seconds: float) -> None:
        nonlocal rounds
        clock.now += seconds
        rounds += 1
        if rounds == 3:  # the API server goes away

            async def failing(*_: LeaseRecord) -> LeaseRecord | None:
                raise ApiException(status=503, reason="unavailable")

            store.get = failing  # type: ignore[method-assign]
            store.update = failing  # type: ignore[method-assign]
        if rounds == 12:
            raise asyncio.CancelledError

    a = candidate(store, "a", clock)
    a.sleep = sleep
    a.on_change.append(changes.append)
    with pytest.raises(asyncio.CancelledError):
        await a.run()
    assert len(changes) == 2
    assert changes[0] is not None
    assert changes[1] is None
    assert not a.holds(changes[0])


async def test_a_renewal_that_returns_after_the_deadline_ends_the_term() -> None:
    """The process stalls with a renewal in flight: it succeeds, but too late to count; the
    next attempt starts a new term with a new token, never the old one's."""
    store, clock = InMemoryLeaseStore(), Clock()
    a = candidate(store, "a", clock)
    await a.try_acquire_or_renew()
    old = a.current()
    update = store.update

    async def stalled(record: LeaseRecord) -> LeaseRecord:
        clock.now += 12  # frozen while the request was out
        return await update(record)

    store.update = stalled  # type: ignore[method-assign]
    assert not await a.try_acquire_or_renew()
    assert a.current() is None
    store.update = update  # type: ignore[method-assign]
    assert await a.try_acquire_or_renew()
    new = a.current()
    assert new is not None
    assert old is not None
    assert new is not old
    assert new.token == 1


# ---------------------------------------------------------------- ElectionThread (real time)


def quick(store: InMemoryLeaseStore) -> LeaderElector:
    """An elector on real clocks with short periods: these tests block an event loop."""
    return LeaderElector(store, "a", lease_duration_s=3, renew_deadline_s=1, retry_s=0.05)


def opener(store: InMemoryLeaseStore, closed: list[bool]) -> StoreOpener:
    async def open_store() -> tuple[LeaseStore, Callable[[], Awaitable[None]]]:
        async def close() -> None:
            closed.append(True)

        return store, close

    return open_store


def hold_the_loop(seconds: float) -> None:
    """What a long round does to the loop it runs on: compute, without awaiting (and holding
    the GIL but for the interpreter's switch interval)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def leading(elector: LeaderElector | ElectionThread) -> Term:
    for _ in range(500):
        term = elector.current()
        if term is not None:
            return term
        await asyncio.sleep(0.01)
    raise AssertionError("never led")


async def test_a_blocked_event_loop_ends_the_term_of_an_elector_that_runs_on_it() -> None:
    """Why the operator runs its election in a thread: a round that holds the loop past the
    renew deadline ends the term of an elector renewing on that loop."""
    store = InMemoryLeaseStore()
    elector = quick(store)
    task = asyncio.create_task(elector.run())
    term = await leading(elector)
    hold_the_loop(1.5)  # no renewal runs meanwhile
    assert not elector.holds(term)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_election_thread_renews_while_the_callers_loop_is_blocked() -> None:
    store, closed = InMemoryLeaseStore(), list[bool]()
    thread = ElectionThread(quick(store), opener(store, closed))
    terms: list[Term | None] = []
    thread.on_change.append(terms.append)
    await thread.start()
    term = await leading(thread)
    writes = store.writes
    hold_the_loop(1.5)  # past the renew deadline
    assert thread.holds(term)
    assert thread.current() is term
    assert store.writes > writes  # renewed meanwhile
    await asyncio.sleep(0)  # the callbacks run on the caller's loop
    assert terms == [term]
    await thread.stop()
    assert store.record is not None
    assert store.record.holder == ""  # released: a standby takes over at once
    assert closed == [True]  # the thread's client
    assert not thread.holds(term)
    await asyncio.sleep(0)
    assert terms == [term, None]


async def test_an_election_thread_whose_client_cannot_open_raises_and_ends() -> None:
    async def broken() -> tuple[LeaseStore, Callable[[], Awaitable[None]]]:
        raise ValueError("no kubeconfig")

    thread = ElectionThread(quick(InMemoryLeaseStore()), broken)
    with pytest.raises(ValueError, match="no kubeconfig"):
        await thread.start()
    assert thread.current() is None
    await thread.stop()  # nothing to stop: no error
