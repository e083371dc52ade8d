"""When an offering node's pool is written (controller/offers.py, the slice publisher's
`steering_delay_s`): a change the scheduler can act on at once, one it cannot after the delay,
once per allocation, and a pool left standing lists every instance and every held device."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.api.models import (
    FailedInstance,
    GpuSpec,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.clock import ManualClock
from migpart.controller.offers import NodeOffer, Offers, offer_pool, planned_overlaps
from migpart.controller.relay import placements, relay
from migpart.kube.slice_publisher import STEERING_DELAY_S, SlicePublisher
from migpart.mig import CATALOG, Instance, addable_placements, layout_problems
from migpart.offer_content import scheduler_needs
from migpart.planning.model import PolicyView
from migpart.planning.offer import DEFAULT_DEPTH
from migpart.slice_content import DeviceCache, SliceContent
from migpart.testing.builders import H100
from tests.unit.controller.offer_world import (
    EVERY_PROFILE,
    by_name,
    node,
)
from tests.unit.kube.factories import gpu
from tests.unit.kube.slice_store import SliceStore
from tests.unit.planning.strategies import layouts

# ------------------------------------------------------------------ what the scheduler needs now


def test_a_change_the_scheduler_can_act_on_is_needed_at_once() -> None:
    """`scheduler_needs`: what a pool write must not wait for. Placement `gpu-1-3g40gb-4` is
    held by a claim throughout unless said otherwise."""
    held = frozenset({"gpu-1-3g40gb-4"})
    empty = node(gpu(0), gpu(1))
    pool = offer_pool(empty, EVERY_PROFILE, frozenset(), True, held, frozenset())

    def needs(after: list[SliceContent], allocated: frozenset[str] = held) -> bool:
        return scheduler_needs(pool, after, allocated)

    assert not needs(pool)
    # a free instance made by a round: it may be allocated (and its counters must count)
    made = node(gpu(0, ("1g.10gb", 6, "Free")), gpu(1))
    assert needs(offer_pool(made, EVERY_PROFILE, frozenset(), True, held, frozenset()))
    # a profile no longer permitted: its placements must not be allocated
    deny = PolicyView(allowed=None, denied=frozenset({"1g.10gb"}))
    assert needs(offer_pool(empty, deny, frozenset(), True, held, frozenset()))
    # the held placement failed: tainted before its claim is failed
    failure = FailedInstance(gpu=1, profile="3g.40gb", start=4, reason="NvmlError", message="x")
    failed = node(gpu(0), gpu(1), failed=[failure])
    assert needs(offer_pool(failed, EVERY_PROFILE, frozenset(), True, held, frozenset()))
    # its claim let go: the placement, still listed, may be allocated again; which
    # placements of its profile are offered beside it is steering, and may wait
    released = offer_pool(empty, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset())
    assert not needs(released, frozenset())
    # a withdrawn free instance: tainted before the destroy protocol goes on
    free = node(gpu(0, ("7g.80gb", 0, "Free")), gpu(1))
    before = offer_pool(free, EVERY_PROFILE, frozenset(), True, held, frozenset())
    withdrawn = frozenset({"gpu-0-7g80gb-0"})
    after = offer_pool(free, EVERY_PROFILE, withdrawn, True, held, frozenset())
    assert scheduler_needs(before, after, held)


def test_which_placements_are_offered_may_wait_while_their_profile_is_offered() -> None:
    """The offer's depth: a claim takes a placement, and the next of its profile joins the
    offer; the scheduler can still take the others of that profile meanwhile, so the write may
    wait. A placement whose creation failed must leave at once; so must a profile's last."""
    empty = node(gpu(0), gpu(1))

    def pool(held: frozenset[str] = frozenset(), failed: frozenset[str] = frozenset()) -> Any:
        return offer_pool(
            empty, EVERY_PROFILE, frozenset(), True, held, frozenset(), None, failed, depth=2
        )

    before = pool()
    small = [n for n in by_name(before) if "-1g10gb-" in n]
    assert len(small) == 2
    taken = frozenset(small[:1])
    after = pool(taken)
    joined = [n for n in by_name(after) if "-1g10gb-" in n and n not in by_name(before)]
    assert joined  # the next 1g.10gb placement is offered
    assert not scheduler_needs(before, after, taken)
    # the other offered one failed (the relay backs off from it): leaving the offer, it must
    # not be allocated again
    failed = frozenset(small[1:])
    without = pool(failed=failed)
    assert small[1] not in by_name(without)
    assert scheduler_needs(before, without, frozenset(), unusable=failed)
    assert not scheduler_needs(before, without, frozenset())  # a mere re-steer may wait
    # a profile's last placement leaving the offer (not permitted now) may not wait
    deny = PolicyView(allowed=None, denied=frozenset({"1g.10gb"}))
    denied = offer_pool(empty, deny, frozenset(), True, frozenset(), frozenset(), depth=2)
    assert scheduler_needs(before, denied, frozenset())
    assert scheduler_needs(denied, before, frozenset())  # nor a profile joining it


def test_a_placement_a_planned_instance_overlaps_leaves_the_offer_at_once() -> None:
    """A round planned a 3g.40gb at 4 on GPU 0 (the spec wants it, the agent has not made it):
    the placements over it leave the offer. Their profiles are still offered elsewhere, so as
    a re-steer it could wait; over an instance on its way, it may not."""
    offers = Offers()
    offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
    plain = node(gpu(0), gpu(1))
    wanted = [MigInstanceSpec(profile="3g.40gb", start=4)]
    spec = MigNodeSpec(plan_id="p1", gpus=[GpuSpec(index=0, instances=wanted)])
    planned = plain.model_copy(update={"spec": spec})
    before = offers.slices(plain, frozenset(), True, DeviceCache())
    after = offers.slices(planned, frozenset(), True, DeviceCache())
    gone = set(by_name(before)) - set(by_name(after))
    assert gone
    assert gone <= planned_overlaps(planned)
    assert not scheduler_needs(before, after, frozenset())  # a re-steer alone may wait
    assert offers.needs("a", before, after)
    assert planned_overlaps(plain) == frozenset()


def test_a_free_instance_let_go_must_not_wait_behind_the_placements() -> None:
    """Allocated, a free instance moves behind the offer (the scheduler cannot take it twice:
    that may wait); let go, it must come first again at once, or first fit gives its next pod
    a new placement instead."""
    n = node(gpu(0, ("3g.40gb", 4, "Free")), gpu(1))
    taken = frozenset({"gpu-0-3g40gb-4"})
    offered_ = offer_pool(n, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset())
    held = offer_pool(n, EVERY_PROFILE, frozenset(), True, taken, frozenset())
    assert next(iter(by_name(offered_))) == "gpu-0-3g40gb-4"
    assert list(by_name(held))[-1] == "gpu-0-3g40gb-4"
    assert not scheduler_needs(offered_, held, taken)
    assert scheduler_needs(held, offered_, frozenset())


# ------------------------------------------------------------------ pool writes per allocation

GPUS = 8  # a full node: 8 H100s; the default offer is 19 devices, in 2 slices with the counters


def full_node(
    revision: int, *instances: tuple[str, int, str], spec: MigNodeSpec | None = None
) -> MigNode:
    """MigNode `a`: 8 H100s, `instances` on GPU 0 (profile, start, state)."""
    gpus = [gpu(0, *instances), *(gpu(i) for i in range(1, GPUS))]
    return MigNode(
        metadata={"name": "a", "resourceVersion": str(revision)},
        spec=spec,
        status=MigNodeStatus(gpus=gpus),
    )


class NodeSlices:
    """Node `a` offering under policy `pa` through the slice publisher on the in-memory slice
    store, with `needs` (`holding_back`) or without it (every change written at once, as
    before), and the devices claims hold there (`held`, what the relay tells)."""

    def __init__(self, body: MigNode, holding_back: bool, depth: int = DEFAULT_DEPTH) -> None:
        self.store = SliceStore()
        self.held: set[str] = set()
        self.offers = Offers(held=lambda node: frozenset(self.held), depth=depth)
        self.offers.assign("pa", ["a"], NodeOffer("pa", EVERY_PROFILE))
        self.clock = ManualClock()
        self.publisher = SlicePublisher(
            cast(Any, self.store),
            slices=self.offers.slices,
            needs=self.offers.needs if holding_back else None,
            clock=self.clock,
        )
        self.node = body
        self.publisher.observe(body)

    async def start(self) -> int:
        """The node's first pool; returns how many slices it has."""
        assert (await self.publisher.publish("a")).written
        self.store.requests.clear()
        return len(self.store.pool("a"))

    def stored(self) -> list[dict[str, Any]]:
        """The devices of the stored pool, in the order kube-scheduler tries them."""
        return [
            d
            for _, body in sorted(self.store.slices.items())
            for d in body["spec"].get("devices", [])
        ]

    def first_fit(self, profile: str) -> str:
        """The device a claim for `profile` gets on a pool no claim holds anything of yet:
        the first of that profile in the stored order."""
        return next(
            str(d["name"]) for d in self.stored() if d["attributes"]["profile"]["string"] == profile
        )

    async def publish(self, body: MigNode | None = None, compute: bool = False) -> tuple[int, int]:
        """Publish as the operator does after an event: a MigNode event (`body`), the held
        devices changed (`compute`: the relay's `changed`), or neither (the publish the MigNode
        watch makes once a held-back change may wait no longer). Returns (pools written,
        slice requests: created, replaced and deleted). Every held device stays listed in the
        stored pool."""
        taken = len(self.store.requests)
        if body is not None:
            self.node = body
            self.publisher.observe(body)
        if compute:
            self.publisher.invalidate("a")
        result = await self.publisher.publish("a")
        writes = [m for m, _ in self.store.requests[taken:] if m != "GET"]
        assert self.held <= {str(d["name"]) for d in self.stored()}
        return int(result.written), len(writes)


async def new_placement_allocated(
    holding_back: bool, depth: int = DEFAULT_DEPTH
) -> tuple[int, list[tuple[int, int]], Any]:
    """One claim for a 3g.40gb on a node with 8 empty H100s, from allocation to instance
    created, then the steering delay, then the claim let go: the pool's slice count, (pools,
    slices) written at each step, and the stored pool at the end."""
    world = NodeSlices(full_node(1), holding_back, depth)
    size = await world.start()
    device = world.first_fit("3g.40gb")
    where = placements(world.node)[device]
    assert where.gpu == 0
    steps: list[tuple[int, int]] = []
    world.held.add(device)  # kube-scheduler allocated the placement: the relay tells
    steps.append(await world.publish(compute=True))
    decision = relay(world.node, [("ns/c1", device)])  # the relay writes it into the spec
    assert decision.spec is not None
    steps.append(await world.publish(full_node(2, spec=decision.spec)))
    created = (where.instance.profile, where.instance.start, "Free")  # the agent created it
    steps.append(await world.publish(full_node(3, created, spec=decision.spec)))
    # the relay writes instance-ready into the claim: the devices held do not change
    world.clock.advance(STEERING_DELAY_S)
    steps.append(await world.publish())
    world.held.clear()  # the claim let go of it
    steps.append(await world.publish(compute=True))
    return size, steps, world.stored()


async def free_instance_allocated(holding_back: bool) -> tuple[int, list[tuple[int, int]], Any]:
    """The same for a free 3g.40gb instance on GPU 0: allocation, prepared by kubelet (the
    agent's status says so), the steering delay."""
    world = NodeSlices(full_node(1, ("3g.40gb", 4, "Free")), holding_back)
    size = await world.start()
    device = world.first_fit("3g.40gb")
    assert device == "gpu-0-3g40gb-4"  # the free instance comes first
    steps: list[tuple[int, int]] = []
    world.held.add(device)
    steps.append(await world.publish(compute=True))
    steps.append(await world.publish(full_node(2, ("3g.40gb", 4, "Prepared"))))
    world.clock.advance(STEERING_DELAY_S)
    steps.append(await world.publish())
    return size, steps, world.stored()


async def test_an_allocation_of_a_new_placement_writes_the_pool_once_after_the_delay() -> None:
    """Every change written at once (before): the allocation and the instance created each
    rewrite the node's pool (both slices: the counter sets and the devices).
    Held back, with an offer deep enough that every profile keeps a placement beside the
    allocation: neither can be acted on while the claim holds the placement (the placements
    beside it are blocked by its counters, and a held device's other fields are not read),
    so the pool is written once, when the steering delay is over, and at once when the claim
    lets go (the instance, free, must come before the placements). Both end with the same
    pool. With the default depth (2) the allocation blocks both `1g.10gb` placements offered
    (they were beside it, on its GPU): the next ones must be offered at once."""
    for depth in (8, DEFAULT_DEPTH):
        size, before, pool_before = await new_placement_allocated(False, depth)
        assert size == 2
        assert before == [(1, 2), (0, 0), (1, 2), (0, 0), (1, 2)]
        _, after, pool_after = await new_placement_allocated(True, depth)
        first = (0, 0) if depth == 8 else (1, 2)
        assert after == [first, (0, 0), (0, 0), (1, 2), (1, 2)]
        assert pool_after == pool_before


async def test_an_allocation_of_a_free_instance_writes_the_pool_once_after_the_delay() -> None:
    """Before: the allocation moves the instance behind the offer, and the whole pool (both
    slices) is rewritten for it. Held back: written once, after the delay."""
    size, before, pool_before = await free_instance_allocated(holding_back=False)
    assert size == 2
    assert before == [(1, 2), (0, 0), (0, 0)]
    _, after, pool_after = await free_instance_allocated(holding_back=True)
    assert after == [(0, 0), (0, 0), (1, 2)]
    assert pool_after == pool_before


@st.composite
def moves(draw: st.DrawFn) -> tuple[MigNode, MigNode, frozenset[str]]:
    """A node of 2 H100s before and after one change (an instance made, a free one gone, or
    a claim's device taken or let go), and the devices claims hold after it."""
    layouts_ = [draw(layouts(H100)) for _ in range(2)]

    def body(per_gpu: list[list[tuple[str, int, str]]]) -> MigNode:
        return node(*(gpu(i, *instances) for i, instances in enumerate(per_gpu)))

    states = [
        [(i.profile, i.start, "Prepared" if i.used else "Free") for i in layout]
        for layout in layouts_
    ]
    before = body(states)
    after_states = [list(s) for s in states]
    index = draw(st.integers(0, 1))
    table = CATALOG[H100]
    kind = draw(st.sampled_from(["made", "gone", "none"]))
    if kind == "made":
        have = [Instance(p, s) for p, s, _ in after_states[index]]
        options = addable_placements(table, have)
        if options:
            made = draw(st.sampled_from(options))
            after_states[index].append((made.profile, made.start, "Free"))
    elif kind == "gone":
        free = [e for e in after_states[index] if e[2] == "Free"]
        if free:
            after_states[index].remove(draw(st.sampled_from(free)))
    after = body(after_states)
    names = sorted(
        by_name(offer_pool(after, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset()))
    )
    # What claims hold is what kube-scheduler could allocate together: placements that fit
    # beside the GPU's instances and each other (an instance itself may be held).
    where = placements(after)
    layout = {i: {Instance(p, s) for p, s, _ in after_states[i]} for i in range(2)}
    held: set[str] = set()
    for name in draw(st.lists(st.sampled_from(names), max_size=2)) if names else []:
        place = where[name]
        if place.instance in layout[place.gpu]:
            held.add(name)
        elif not layout_problems(table, [*layout[place.gpu], place.instance]):
            layout[place.gpu].add(place.instance)
            held.add(name)
    return before, after, frozenset(held)


@settings(max_examples=200, deadline=None)
@given(moves(), st.integers(1, 3))
def test_a_pool_left_standing_lists_every_instance_and_every_held_device(
    move: tuple[MigNode, MigNode, frozenset[str]], depth: int
) -> None:
    """Whatever `scheduler_needs` lets wait, the pool kube-scheduler keeps has the counter
    sets, every instance the node has (its counters must count) and every device claims hold
    with the counters and taints it has now: never two placements NVML cannot hold both."""
    before, after, held = move
    published = offer_pool(
        before, EVERY_PROFILE, frozenset(), True, frozenset(), frozenset(), depth=depth
    )
    wanted = offer_pool(after, EVERY_PROFILE, frozenset(), True, held, frozenset(), depth=depth)
    if scheduler_needs(published, wanted, held):
        return
    old, new = by_name(published), by_name(wanted)
    assert [c.counter_sets for c in published if c.counter_sets] == [
        c.counter_sets for c in wanted if c.counter_sets
    ]
    for name, device in new.items():
        if device["attributes"]["created"]["bool"] or name in held:
            assert name in old, name
    for name in held:
        assert (old[name].get("consumesCounters"), old[name].get("taints")) == (
            new[name].get("consumesCounters"),
            new[name].get("taints"),
        )
