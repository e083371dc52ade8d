"""Hypothesis strategies for random snapshots and requests over the built-in catalog."""

from __future__ import annotations

from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, addable_placements
from migpart.planning.model import (
    GpuState,
    InstanceState,
    NodeState,
    PolicyView,
    Request,
    Snapshot,
    Spare,
)

MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA A30"]
ALL_PROFILES = sorted({p.name for m in MODELS for p in CATALOG[m].profiles})


@st.composite
def layouts(draw: st.DrawFn, model: str) -> tuple[InstanceState, ...]:
    """A random valid layout, grown one addable instance at a time, with random used flags."""
    table = CATALOG[model]
    chosen: list[Instance] = []
    for _ in range(draw(st.integers(0, 7))):
        options = addable_placements(table, chosen)
        if not options:
            break
        chosen.append(draw(st.sampled_from(options)))
    return tuple(InstanceState(i.profile, i.start, draw(st.booleans())) for i in chosen)


@st.composite
def snapshots(draw: st.DrawFn, max_nodes: int = 4, max_gpus: int = 3) -> Snapshot:
    nodes = []
    for n in range(draw(st.integers(1, max_nodes))):
        gpus = []
        for g in range(draw(st.integers(0, max_gpus))):
            model = draw(st.sampled_from(MODELS))
            gpus.append(GpuState(f"n{n}", g, model, draw(layouts(model))))
        nodes.append(NodeState(f"n{n}", tuple(gpus)))
    return Snapshot(tuple(nodes))


@st.composite
def request_lists(
    draw: st.DrawFn, nodes: tuple[str, ...] = (), restricted_one_in: int = 5, most: int = 12
) -> list[Request]:
    """Requests; with `nodes`, one in `restricted_one_in` is restricted to some of them."""
    count = draw(st.integers(0, most))
    requests = []
    for i in range(count):
        profiles = draw(
            st.lists(st.sampled_from(ALL_PROFILES), min_size=1, max_size=3, unique=True)
        )
        restrict = None
        if nodes and draw(st.integers(1, restricted_one_in)) == 1:
            restrict = frozenset(draw(st.lists(st.sampled_from(nodes), min_size=1, unique=True)))
        requests.append(
            Request(
                f"r{i}",
                tuple(profiles),
                draw(st.integers(1, 3)),
                draw(st.integers(0, 2)),
                restrict,
                draw(st.integers(0, 3)) == 0,
            )
        )
    return requests


@st.composite
def policies(draw: st.DrawFn) -> PolicyView:
    allowed = None
    if draw(st.booleans()):
        allowed = frozenset(draw(st.lists(st.sampled_from(ALL_PROFILES), max_size=8)))
    denied = frozenset(draw(st.lists(st.sampled_from(ALL_PROFILES), max_size=3)))
    spares = tuple(
        Spare(p, c)
        for p, c in draw(
            st.lists(st.tuples(st.sampled_from(ALL_PROFILES), st.integers(1, 2)), max_size=2)
        )
    )
    return PolicyView(allowed=allowed, denied=denied, spares=spares)
