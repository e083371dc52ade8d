"""MigNode status from a buggy or hostile agent, and claims larger than any node: the
operator leaves the node out (saying why) or reports the claim, and serves everything else."""

from __future__ import annotations

from typing import Any

import pytest

from migpart.api.models import GpuStatus, MigInstanceStatus, MigNode, MigNodeStatus, ProfileInfo
from migpart.controller.rounds.screening import node_problem
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import claim, mignode, world
from tests.unit.controller.harness import operator, run
from tests.unit.kube.factories import H100, gpu


def _node(*gpus: GpuStatus) -> MigNode:
    return MigNode(metadata={"name": "x"}, status=MigNodeStatus(gpus=list(gpus)))


def _with(g: GpuStatus, **changes: Any) -> GpuStatus:
    return g.model_copy(update=changes)


def _instance(profile: str, start: int) -> MigInstanceStatus:
    return MigInstanceStatus(
        profile=profile, start=start, uuid=f"MIG-{profile}-{start}", state="Free"
    )


def _profile(profile: str, **changes: Any) -> ProfileInfo:
    (found,) = [p for p in gpu(0).profiles if p.name == profile]
    return found.model_copy(update=changes)


HOSTILE = [
    pytest.param(
        _node(gpu(0, ("3g.40gb", 0, "Free"), ("1g.10gb", 2, "Free"))),
        "GPU 0: instances[1]: 1g.10gb@2 overlaps instances[0] in memory slices",
        id="overlapping-placements",
    ),
    pytest.param(
        _node(gpu(0, ("1g.10gb", 0, "Free"), ("1g.10gb", 0, "Free"))),
        "GPU 0: instances[1]: 1g.10gb@0 overlaps instances[0]",
        id="the-same-instance-twice",
    ),
    pytest.param(
        _node(gpu(0, ("9g.90gb", 0, "Free"))),
        "GPU 0: instances[0].profile: '9g.90gb' is not offered by NVIDIA H100 80GB HBM3",
        id="unknown-profile",
    ),
    pytest.param(
        _node(gpu(0, ("3g.40gb", 2, "Free"))),
        "GPU 0: instances[0].start: 3g.40gb cannot start at 2",
        id="impossible-start",
    ),
    pytest.param(
        _node(gpu(64)),
        "GPU 64: index out of range (a MigNode spec names GPUs 0 to 63)",
        id="gpu-index-out-of-range",
    ),
    pytest.param(
        _node(*(gpu(i) for i in range(17))),
        "17 MIG GPUs; a MigNode spec lists at most 16, so migpart cannot repartition this node",
        id="more-than-max-gpus",
    ),
    pytest.param(
        _node(*(gpu(i, mig=False) for i in range(200))),
        "status reports 200 GPUs; a node has at most 64",
        id="huge-status-gpus",
    ),
    pytest.param(
        _node(_with(gpu(0), instances=[_instance("1g.10gb", s) for s in range(7)] * 20)),
        "GPU 0: 140 instances reported; a GPU holds at most 8",
        id="huge-status-instances",
    ),
    pytest.param(
        _node(_with(gpu(0), profiles=[_profile("1g.10gb", name=f"p{i}") for i in range(100)])),
        "GPU 0: 100 profiles reported; at most 64 are read",
        id="huge-status-profiles",
    ),
    pytest.param(
        _node(_with(gpu(0), profiles=[_profile("1g.10gb", compute_slices=0)])),
        "GPU 0: profile 1g.10gb does not fit the GPU's 7 compute and 8 memory slices",
        id="profile-without-compute",
    ),
    pytest.param(
        _node(_with(gpu(0), profiles=[_profile("1g.10gb", placements=[0, 9])])),
        "GPU 0: profile 1g.10gb does not fit",
        id="placement-beyond-memory",
    ),
    pytest.param(
        _node(_with(gpu(0), profiles=[_profile("1g.10gb"), _profile("1g.10gb")])),
        "GPU 0: profile 1g.10gb is reported twice",
        id="profile-twice",
    ),
    pytest.param(
        _node(_with(gpu(0), profiles=[])),
        "GPU 0: MIG is enabled but no profile table is reported",
        id="no-profile-table",
    ),
    pytest.param(
        _node(_with(gpu(0), memory_slices=1000)),
        "GPU 0: 7 compute and 1000 memory slices are out of range",
        id="absurd-slices",
    ),
    pytest.param(
        _node(gpu(0), _with(gpu(1), profiles=[_profile("1g.10gb")])),
        "GPUs 0 and 1 are both NVIDIA H100 80GB HBM3 but report different profile tables",
        id="one-model-two-tables",
    ),
    pytest.param(
        # the same profiles, but not the same GPU: a table is reused only for the same report
        _node(gpu(0), _with(gpu(1), compute_slices=8)),
        "GPUs 0 and 1 are both NVIDIA H100 80GB HBM3 but report different profile tables",
        id="one-model-two-slice-counts",
    ),
]


@pytest.mark.parametrize(("node", "words"), HOSTILE)
def test_impossible_status_is_named(node: MigNode, words: str) -> None:
    problem = node_problem(node)
    assert problem is not None
    assert words in problem


@pytest.mark.parametrize(
    "node",
    [
        _node(),
        MigNode(metadata={"name": "x"}),
        _node(gpu(0, ("3g.40gb", 0, "Prepared"), ("3g.40gb", 4, "Free")), gpu(1)),
        _node(*(gpu(i) for i in range(16))),
        # GPUs without MIG are reported but never planned: their tables are not read
        _node(gpu(0), _with(gpu(70, mig=False), profiles=[])),
    ],
)
def test_sound_status_passes(node: MigNode) -> None:
    assert node_problem(node) is None


def test_each_models_table_is_read_once_and_handed_back() -> None:
    node = _node(*(gpu(i) for i in range(8)))
    tables: dict[str, Any] = {}
    assert node_problem(node, tables) is None
    assert node.status is not None
    assert tables == {H100: node.status.gpus[0].table()}


@pytest.mark.parametrize(("hostile", "words"), HOSTILE)
async def test_hostile_node_is_left_out_and_the_others_are_served(
    hostile: MigNode, words: str
) -> None:
    body = hostile.model_copy(
        update={"metadata": {"name": "evil", "resourceVersion": "1"}}
    ).model_dump(by_alias=True, exclude_none=True, mode="json")
    nodes = {"evil": body, "good": mignode("good", 1, gpus=[gpu(0)])}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    await run(state, world(nodes, [claim("c1", "3g.40gb")]))
    assert [node for node, _ in effects.specs] == ["good"]
    [(_, status)] = effects.statuses
    assert status.nodes == 1
    excluded = next(c for c in status.conditions if c.type == "NodesExcluded")
    assert excluded.status == "True"
    assert excluded.reason == "InvalidNodeStatus"
    assert excluded.message.startswith("1 node(s) not planned: evil: ")
    assert words in excluded.message
    warnings = [e for e in effects.events if e.reason == "NodeExcluded"]
    assert [e.object for e in warnings] == ["evil"]
    assert words in warnings[0].message

    # Once only; and when the agent reports a sound status again, the node is back.
    await run(state, world(nodes, [claim("c1", "3g.40gb")]))
    assert len([e for e in effects.events if e.reason == "NodeExcluded"]) == 1
    nodes["evil"] = mignode("evil", 2, gpus=[gpu(0)])
    await run(state, world(nodes, [claim("c1", "3g.40gb"), claim("c2", "7g.80gb")]))
    status = effects.statuses[-1][1]
    assert status.nodes == 2
    back = next(c for c in status.conditions if c.type == "NodesExcluded")
    assert (back.status, back.reason) == ("False", "AllNodesSound")


def _claim_of(name: str, count: int, profile: str = "1g.10gb") -> dict[str, Any]:
    body = claim(name, profile)
    body["spec"]["devices"]["requests"][0]["exactly"]["count"] = count
    return body


async def test_a_claim_larger_than_any_node_is_unsatisfiable_and_the_others_are_served() -> None:
    # two nodes of one and two H100s: seven 1g.10gb per GPU, so at most 14 on one node
    nodes = {
        "a": mignode("a", 1, gpus=[gpu(0)]),
        "b": mignode("b", 1, gpus=[gpu(0), gpu(1)]),
    }
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    claims = [_claim_of("huge", 15), _claim_of("fits", 14), claim("small", "3g.40gb")]
    await run(state, world(nodes, claims))
    [unsat] = [e for e in effects.events if e.reason == "Unsatisfiable"]
    assert unsat.object == "huge"
    assert "count 15 is more than any node can hold" in unsat.message
    assert "holds at most 14" in unsat.message
    [(_, status)] = effects.statuses
    assert status.pending_requests == 3
    assert status.last_plan is not None
    assert status.last_plan.satisfied == 2  # "fits" (all of node b) and "small"
    assert status.last_plan.unsatisfied == 0
    assert effects.specs


def test_the_count_bound_never_refuses_what_a_node_can_hold() -> None:
    """For every catalog profile, a request of exactly what one node of two GPUs holds of it
    passes, and one more is refused."""
    from migpart.controller.rounds.scope import PolicyDemand, Scope
    from migpart.controller.rounds.screening import oversized
    from migpart.mig import Occupancy
    from migpart.planning.model import Request

    node = MigNode.model_validate(mignode("a", 1, gpus=[gpu(0), gpu(1)]))
    table = gpu(0).table()
    for profile in table.profiles:
        most = 2 * Occupancy.of(table, []).fit(profile)
        for count, kept in ((most, True), (most + 1, False)):
            request = Request(name="ns/c", profiles=(profile.name,), count=count)
            scope = Scope(
                nodes=(node,),
                demand=PolicyDemand((request,), (), 1),
                tables={table.model: table},
            )
            got = oversized(scope, {"ns/c": {"metadata": {"name": "c", "namespace": "ns"}}})
            assert (got.demand.requests == (request,)) is kept, (profile.name, count)


async def test_a_status_that_fails_the_schema_is_left_out_naming_the_field() -> None:
    body = mignode("broken", 1, gpus=[gpu(0)])
    body["status"]["gpus"][0]["index"] = -1
    nodes = {"broken": body, "good": mignode("good", 1, gpus=[gpu(0)])}
    effects = InMemoryEffects(mignodes=dict(nodes))
    state = operator(effects)
    await run(state, world(nodes, [claim("c1", "3g.40gb")]))
    assert [node for node, _ in effects.specs] == ["good"]
    excluded = next(c for c in effects.statuses[-1][1].conditions if c.type == "NodesExcluded")
    assert "broken: invalid at status.gpus.0.index: " in excluded.message
