"""The chaos harness's election monitor (bench/chaos_faults.py): a write counts as a
non-leader write only when it lands outside every term its writer held the Lease for, a term
lasting from its acquireTime until the fence's renew deadline after its last renewal."""

from __future__ import annotations

from bench import chaos_faults as FAULTS

T0 = 1_795_000_000.0  # 2026-11-18T...: any whole second
DEADLINE = FAULTS.RENEW_DEADLINE_S


def _stamp(at: float) -> str:
    return FAULTS.time.strftime("%Y-%m-%dT%H:%M:%SZ", FAULTS.time.gmtime(at))


def _micro(at: float) -> str:
    return _stamp(at).replace("Z", ".189000Z")


def _write(identity: str, at: float, name: str = "node-1") -> dict[str, object]:
    manager = f"{FAULTS.MANAGER}{identity}"
    return {"metadata": {"name": name, "managedFields": [{"manager": manager, "time": _stamp(at)}]}}


def _lease(holder: str, acquired: float, renewed: float | None = None) -> dict[str, object]:
    return {
        "holderIdentity": holder,
        "acquireTime": _micro(acquired),
        "renewTime": _micro(acquired if renewed is None else renewed),
    }


def test_a_write_right_after_the_take_over_is_the_holders_though_the_monitor_looked_late() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("a", T0, T0 + 4.0), T0 + 6.0)  # the API server was down until then
    monitor.writes_seen([_write("a", T0 + 1.0)])
    assert monitor.judge() == set()


def test_a_write_before_the_take_over_is_counted() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("b", T0 - 60.0, T0 - 30.0), T0 - 30.0)
    monitor.lease_seen(_lease("a", T0), T0 + 1.0)
    monitor.writes_seen([_write("a", T0 - 10.0)])
    assert monitor.judge() == {f"a wrote node-1 at {_stamp(T0 - 10.0)}"}


def test_a_lease_without_acquire_time_starts_the_term_when_seen() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen({"holderIdentity": "a"}, T0 + 6.0)
    monitor.writes_seen([_write("a", T0)])
    assert len(monitor.judge()) == 1


def test_a_term_nobody_polled_is_known_from_its_versions() -> None:
    """The versions a watch delivers late (the harness busy elsewhere, an API server restart)
    still make a term: `a` took over, wrote and was superseded between two looks."""
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("b", T0 - 60.0, T0 - 20.0), T0 - 20.0)
    monitor.lease_seen(_lease("a", T0, T0 + 4.0), T0 + 30.0)
    monitor.lease_seen(_lease("c", T0 + 25.0), T0 + 30.0)
    monitor.writes_seen([_write("a", T0 + 5.0)])
    assert monitor.judge() == set()


def test_a_write_past_the_renew_deadline_of_the_last_renewal_is_counted() -> None:
    """The fence lets a holder write until `renew_deadline` after its last renewal, whoever
    holds the Lease next: a frozen leader that woke and wrote is caught even if nobody took
    the Lease meanwhile."""
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("a", T0, T0 + 10.0), T0 + 10.0)
    inside, past = T0 + 10.0 + DEADLINE, T0 + 10.0 + DEADLINE + FAULTS.SLACK_S + 2.0
    monitor.writes_seen([_write("a", inside), _write("a", past, "node-2")])
    assert monitor.judge() == {f"a wrote node-2 at {_stamp(past)}"}


def test_a_recent_write_waits_for_the_renewal_it_follows() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("a", T0), T0)
    late = T0 + DEADLINE + FAULTS.SLACK_S + 3.0
    monitor.writes_seen([_write("a", late)])
    assert monitor.judge(now=late + 1.0) == set()  # too young to judge
    monitor.lease_seen(_lease("a", T0, late - 1.0), late + 2.0)  # the watch delivers it
    assert monitor.judge() == set()
