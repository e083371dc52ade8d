"""The objective over time: ageing, withdrawing freed instances, spares from the mix."""

from __future__ import annotations

from migpart.planning.model import Request, Spare
from migpart.planning.overtime import (
    AGE_LEVELS,
    age_level,
    aged,
    spares_from_mix,
    withdraw_on_release,
)


def test_age_levels_double_and_stop_at_the_top() -> None:
    assert [age_level(w, 100) for w in (0, 99, 100, 299, 300, 699, 700)] == [0, 0, 1, 1, 2, 2, 3]
    assert age_level(1e12, 100) == AGE_LEVELS - 1
    assert age_level(1e12, 0) == 0


def test_ageing_never_lifts_a_request_above_a_higher_priority() -> None:
    old_low = Request("old", ("1g.10gb",), priority=0)
    new_high = Request("new", ("1g.10gb",), priority=1)
    young_low = Request("young", ("1g.10gb",), priority=0)
    out = {r.name: r.priority for r in aged([old_low, new_high, young_low],
                                           {"old": 1e9, "new": 0, "young": 0}, 60)}  # fmt: skip
    assert out["new"] > out["old"] > out["young"]


def test_a_freed_instance_is_withdrawn_only_for_a_request_that_waited_much_longer() -> None:
    small = Request("small", ("3g.40gb",))
    whole = Request("whole", ("7g.80gb",))
    assert withdraw_on_release(["7g.80gb"], [(small, 5000), (whole, 100)], 1200)
    assert not withdraw_on_release(["7g.80gb"], [(small, 1000), (whole, 100)], 1200)
    assert not withdraw_on_release(["7g.80gb"], [(small, 5000), (whole, 4000)], 1200)
    # Nobody could take it now: it stays, and the next round may repartition it.
    assert not withdraw_on_release(["7g.80gb"], [(small, 5000)], 1200)
    # A multi-device request cannot take one freed device, so it does not count as served.
    eight = Request("eight", ("7g.80gb",), count=8)
    assert withdraw_on_release(["7g.80gb"], [(small, 5000), (eight, 100)], 1200) is False


def test_spares_follow_the_recent_mix() -> None:
    recent = [Request(f"r{i}", ("1g.10gb",)) for i in range(6)]
    recent += [Request(f"s{i}", ("3g.40gb",)) for i in range(3)]
    recent += [Request("multi", ("7g.80gb",), count=8)]
    assert spares_from_mix(recent, 3) == (Spare("1g.10gb", 2), Spare("3g.40gb", 1))
    assert spares_from_mix([], 3) == ()
    assert spares_from_mix(recent, 0) == ()
