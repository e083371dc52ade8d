"""`Occupancy` against the layout rules themselves (`layout_problems`) and brute force."""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, Occupancy, layout_problems
from tests.unit.planning.strategies import MODELS, layouts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_sums_of_a_layout() -> None:
    table = CATALOG["NVIDIA H100 80GB HBM3"]
    taken = Occupancy.of(table, [Instance("3g.40gb", 4), Instance("1g.10gb", 0)])
    assert taken.mask == 0b11110001
    assert taken.compute == 4
    assert (taken.count("3g.40gb"), taken.count("1g.10gb"), taken.count("7g.80gb")) == (1, 1, 0)
    assert taken.headroom(table.profile("3g.40gb")) == 1
    assert taken.fit(table.profile("1g.10gb")) == 3  # starts 1, 2, 3: compute allows 3
    assert taken.fit(table.profile("2g.20gb")) == 1  # start 2 only


@SETTINGS
@given(data=st.data())
def test_fit_is_the_most_that_can_be_added(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(MODELS))
    table = CATALOG[model]
    layout = [s.geometry for s in data.draw(layouts(model))]
    taken = Occupancy.of(table, layout)
    for prof in table.profiles:
        starts = prof.placements
        most = max(
            (
                k
                for k in range(len(starts) + 1)
                for chosen in combinations(starts, k)
                if not layout_problems(table, [*layout, *(Instance(prof.name, s) for s in chosen)])
            ),
            default=0,
        )
        assert taken.fit(prof) == most, prof.name


@SETTINGS
@given(data=st.data())
def test_admits_is_the_layout_rules(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(MODELS))
    table = CATALOG[model]
    first = {s.geometry for s in data.draw(layouts(model))}
    second = {s.geometry for s in data.draw(layouts(model))} - first
    joined = Occupancy.of(table, first).admits(Occupancy.of(table, second))
    assert joined == (not layout_problems(table, sorted(first | second)))
