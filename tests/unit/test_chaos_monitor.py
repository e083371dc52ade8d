"""The chaos harness's election monitor (bench/chaos_faults.py): a write counts as a
non-leader write only when it lands outside the times its writer held the Lease."""

from __future__ import annotations

from bench import chaos_faults as FAULTS

T0 = 1_795_000_000.0  # 2026-11-18T...: any whole second


def _stamp(at: float) -> str:
    return FAULTS.time.strftime("%Y-%m-%dT%H:%M:%SZ", FAULTS.time.gmtime(at))


def _write(identity: str, at: float) -> dict[str, object]:
    manager = f"{FAULTS.MANAGER}{identity}"
    return {
        "metadata": {"name": "node-1", "managedFields": [{"manager": manager, "time": _stamp(at)}]}
    }


def _lease(holder: str, acquired: float) -> dict[str, object]:
    return {"holderIdentity": holder, "acquireTime": _stamp(acquired).replace("Z", ".189000Z")}


def test_a_write_right_after_the_take_over_is_the_holders_though_the_monitor_looked_late() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("a", T0), T0 + 6.0)  # the API server was down until then
    monitor.writes_seen([_write("a", T0 + 1.0)])
    assert monitor.violations == set()


def test_a_write_before_the_take_over_is_counted() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen(_lease("b", T0 - 60.0), T0 - 30.0)
    monitor.lease_seen(_lease("a", T0), T0 + 1.0)
    monitor.writes_seen([_write("a", T0 - 10.0)])
    assert monitor.violations == {f"a wrote node-1 at {_stamp(T0 - 10.0)}"}


def test_a_lease_without_acquire_time_starts_the_stretch_when_seen() -> None:
    monitor = FAULTS.ElectionMonitor()
    monitor.lease_seen({"holderIdentity": "a"}, T0 + 6.0)
    monitor.writes_seen([_write("a", T0)])
    assert len(monitor.violations) == 1
