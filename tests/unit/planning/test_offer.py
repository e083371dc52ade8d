"""Offer mode's steering on hand-built nodes, and its invariants on random ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, layout_problems
from migpart.planning.model import InstanceState, PolicyView, Spare
from migpart.planning.offer import (
    DEFAULT_DEPTH,
    Holdback,
    Offered,
    OfferGpu,
    Step,
    node_spares,
    offer,
)
from tests.unit.planning.strategies import MODELS, layouts

H100 = CATALOG["NVIDIA H100 80GB HBM3"]
EVERY = PolicyView()


def used(profile: str, start: int) -> InstanceState:
    return InstanceState(profile, start, used=True)


def free(profile: str, start: int) -> InstanceState:
    return InstanceState(profile, start, used=False)


def first(offered: tuple[Offered, ...], profile: str) -> Offered:
    return next(o for o in offered if o.instance.profile == profile)


def test_free_instances_come_first_then_beside_used_then_empty_gpus() -> None:
    gpus = [
        OfferGpu(0, H100, ()),
        OfferGpu(1, H100, (used("3g.40gb", 0), free("2g.20gb", 4))),
    ]
    offered = offer(gpus, EVERY)
    assert offered[0] == Offered(1, Instance("2g.20gb", 4), Step.FREE)
    steps = [o.step for o in offered]
    assert steps == sorted(steps)
    # A new 1g goes beside the used 3g (GPU 1), not on the empty GPU 0.
    assert first(offered, "1g.10gb") == Offered(1, Instance("1g.10gb", 6), Step.BESIDE_USED)
    assert first(offered, "7g.80gb") == Offered(0, Instance("7g.80gb", 0), Step.EMPTY)


def test_small_profiles_go_where_they_cut_the_fewest_large_placements() -> None:
    offered = offer([OfferGpu(0, H100, ())], EVERY)
    # 1g at 6 leaves 4g and 3g at 0 and 2g at 0 and 2 possible; at 0 it would kill the 4g.
    assert first(offered, "1g.10gb").instance == Instance("1g.10gb", 6)
    assert first(offered, "3g.40gb").instance == Instance("3g.40gb", 4)


def test_the_busiest_gpu_is_filled_first() -> None:
    gpus = [
        OfferGpu(0, H100, (used("1g.10gb", 6),)),
        OfferGpu(1, H100, (used("4g.40gb", 0),)),
    ]
    assert first(offer(gpus, EVERY), "2g.20gb").gpu == 1


def test_free_space_taken_by_free_instances_is_offered_last_displacing_them() -> None:
    gpus = [OfferGpu(0, H100, (free("1g.10gb", 0), free("1g.10gb", 1)))]
    offered = offer(gpus, EVERY)
    seven = first(offered, "7g.80gb")
    assert seven.step == Step.DISPLACING
    assert set(seven.displaces) == {Instance("1g.10gb", 0), Instance("1g.10gb", 1)}
    # The 4g beside nothing but the two free 1g displaces both; the 3g at 4 displaces none.
    assert first(offered, "3g.40gb") == Offered(0, Instance("3g.40gb", 4), Step.EMPTY)


def test_displacing_placements_only_of_the_profiles_that_wait() -> None:
    gpus = [OfferGpu(0, H100, (free("1g.10gb", 0),))]
    offered = offer(gpus, EVERY, waiting={"7g.80gb"})
    displacing = [o for o in offered if o.step == Step.DISPLACING]
    assert displacing == [
        Offered(0, Instance("7g.80gb", 0), Step.DISPLACING, (Instance("1g.10gb", 0),))
    ]
    assert not [o for o in offer(gpus, EVERY, waiting=()) if o.step == Step.DISPLACING]


def test_instances_in_use_and_spares_are_never_displaced() -> None:
    gpus = [OfferGpu(0, H100, (used("1g.10gb", 0), free("3g.40gb", 4)))]
    spares = node_spares(gpus, [Spare("3g.40gb", 1)])
    assert spares == {(0, Instance("3g.40gb", 4))}
    offered = offer(gpus, EVERY, Holdback(spares=spares))
    assert Offered(0, Instance("3g.40gb", 4), Step.FREE) in offered
    assert all(o.step != Step.DISPLACING for o in offered)
    assert all(o.instance.profile != "7g.80gb" for o in offered)
    without_spares = offer(gpus, EVERY)
    assert any(o.step == Step.DISPLACING for o in without_spares)


def test_only_permitted_profiles_are_offered_new_but_free_ones_stay_offered() -> None:
    gpus = [OfferGpu(0, H100, (free("2g.20gb", 0),))]
    policy = PolicyView(allowed=frozenset({"1g.10gb", "2g.20gb"}), denied=frozenset({"2g.20gb"}))
    offered = offer(gpus, policy)
    assert offered[0] == Offered(0, Instance("2g.20gb", 0), Step.FREE)
    assert {o.instance.profile for o in offered[1:]} == {"1g.10gb"}


def test_a_gpu_held_whole_offers_only_whole_gpu_devices() -> None:
    gpus = [OfferGpu(0, H100, (free("1g.10gb", 0),)), OfferGpu(1, H100, (free("7g.80gb", 0),))]
    offered = offer(gpus, EVERY, Holdback(whole=frozenset({0, 1})))
    assert offered == (
        Offered(1, Instance("7g.80gb", 0), Step.FREE),
        Offered(0, Instance("7g.80gb", 0), Step.DISPLACING, (Instance("1g.10gb", 0),)),
    )


def test_a_full_gpu_offers_its_free_instances_only() -> None:
    gpus = [OfferGpu(0, H100, (used("4g.40gb", 0), used("3g.40gb", 4)))]
    assert offer(gpus, EVERY) == ()


def test_depth_keeps_the_best_placements_of_each_profile_and_every_free_instance() -> None:
    gpus = [
        OfferGpu(0, H100, (used("3g.40gb", 0), free("1g.10gb", 4))),
        OfferGpu(1, H100, ()),
        OfferGpu(2, H100, (free("2g.20gb", 0),)),
    ]
    whole = offer(gpus, EVERY)
    capped = offer(gpus, EVERY, depth=2)
    # the capped offer is the whole one, in its order, less what is past the depth
    assert [o for o in whole if o in capped] == list(capped)
    assert [o for o in capped if o.step == Step.FREE] == [o for o in whole if o.step == Step.FREE]
    for profile in {o.instance.profile for o in whole}:
        new = [o for o in whole if o.instance.profile == profile and o.step != Step.FREE]
        kept = [o for o in capped if o.instance.profile == profile and o.step != Step.FREE]
        assert kept == new[:2] or len(kept) == 2, profile


def test_depth_never_offers_more_of_a_profile_on_a_gpu_than_it_could_hold() -> None:
    gpus = [OfferGpu(0, H100, ()), OfferGpu(1, H100, ())]
    capped = offer(gpus, EVERY, depth=8)
    me = [o for o in capped if o.instance.profile == "1g.10gb+me"]
    assert sorted(o.gpu for o in me) == [0, 1]  # one per GPU (its instance limit), not seven
    small = [o for o in capped if o.instance.profile == "1g.10gb"]
    assert len(small) == 8
    assert {o.gpu for o in small[:7]} == {small[0].gpu}  # best fit: one GPU filled first
    assert len([o for o in offer(gpus, EVERY) if o.instance.profile == "1g.10gb+me"]) == 14


def test_the_default_depth_offers_two_of_each_profile_and_every_gpu_whole() -> None:
    gpus = [OfferGpu(g, H100, ()) for g in range(8)]
    capped = offer(gpus, EVERY, depth=DEFAULT_DEPTH)
    by_profile: dict[str, list[Offered]] = {}
    for o in capped:
        by_profile.setdefault(o.instance.profile, []).append(o)
    # a request of one whole GPU per GPU of the node can still be met from the offer
    assert len(by_profile.pop("7g.80gb")) == 8
    assert {p: len(o) for p, o in by_profile.items()} == dict.fromkeys(by_profile, 2)
    # two of a profile on one GPU (a request with matchAttribute parentUUID) where it fits
    for profile in ("1g.10gb", "2g.20gb", "3g.40gb"):
        assert len({o.gpu for o in by_profile[profile]}) == 1, profile
    assert len(capped) == 6 * 2 + 8
    assert len(offer(gpus, EVERY)) == 200


@st.composite
def nodes(draw: st.DrawFn) -> list[OfferGpu]:
    model = draw(st.sampled_from(MODELS))
    count = draw(st.integers(1, 4))
    return [OfferGpu(g, CATALOG[model], draw(layouts(model))) for g in range(count)]


@settings(max_examples=150, deadline=None)
@given(nodes(), st.none() | st.integers(1, 9))
def test_every_offered_device_fits_and_the_order_holds(
    gpus: list[OfferGpu], depth: int | None
) -> None:
    offered = offer(gpus, EVERY, depth=depth)
    if depth is not None:
        whole = offer(gpus, EVERY)
        assert [o for o in whole if o in offered] == list(offered), "a sub-sequence"
        whole = {len(gpus)} | {depth}
        for profile in {o.instance.profile for o in offered}:
            new = [o for o in offered if o.instance.profile == profile and o.step != Step.FREE]
            assert len(new) <= max(whole)
    keys = [(o.gpu, o.instance) for o in offered]
    assert len(keys) == len(set(keys)), "no device offered twice"
    steps = [o.step for o in offered]
    assert steps == sorted(steps), "free instances first, then beside used, empty, displacing"
    by_index = {g.index: g for g in gpus}
    free_ones = {(g.index, i.geometry) for g in gpus for i in g.instances if not i.used}
    assert {(o.gpu, o.instance) for o in offered if o.step == Step.FREE} == free_ones
    for o in offered:
        if o.step == Step.FREE:
            continue
        gpu = by_index[o.gpu]
        kept = [i.geometry for i in gpu.instances if i.geometry not in o.displaces]
        assert not layout_problems(gpu.table, [*kept, o.instance]), o
        assert all(not i.used for i in gpu.instances if i.geometry in o.displaces)
        assert bool(o.displaces) == (o.step == Step.DISPLACING)
        if o.step == Step.BESIDE_USED:
            assert any(i.used for i in gpu.instances)
