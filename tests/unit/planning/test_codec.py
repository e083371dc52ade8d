"""The snapshot JSON codec: valid documents parse, every invalid one names its field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from migpart.commands.plan import PARSERS
from migpart.errors import InvalidInput
from migpart.mig import Instance
from migpart.planning.codec import PlanInput, encode_plan, parse_input
from migpart.planning.model import Assignment, DeviceRef, GpuPlan, Plan, PlanStats
from tests.unit.planning.factories import BASE, EXAMPLE


def parse(document: object) -> PlanInput:
    """The document parsed as `migpart plan` parses it (policies by the api model)."""
    return parse_input(document, PARSERS)


def doc(**patches: Any) -> dict[str, Any]:
    """BASE with dotted-path patches; a value of ... deletes the key."""
    out = copy.deepcopy(BASE)
    for dotted, value in patches.items():
        *parents, last = dotted.split("__")
        target: Any = out
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        key: Any = int(last) if last.isdigit() else last
        if value is ...:
            del target[key]
        else:
            target[key] = value
    return out


def test_parses_the_base_document() -> None:
    parsed = parse(BASE)
    snapshot, requests = parsed.snapshot, parsed.requests
    gpu = snapshot.nodes[0].gpus[0]
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert [(i.profile, i.start, i.used) for i in gpu.instances] == [
        ("3g.40gb", 0, True),
        ("1g.10gb", 4, False),
    ]
    assert requests[0].count == 2
    assert requests[0].priority == 1
    assert requests[0].nodes is None


def test_example_document_parses() -> None:
    parsed = parse(json.loads(EXAMPLE.read_text()))
    assert "NVIDIA H100 80GB HBM3" in parsed.snapshot.tables
    assert len(parsed.requests) == 3


def test_defaults_and_policy() -> None:
    parsed = parse(
        {
            "nodes": [{"name": "n", "gpus": [{"index": 0, "model": "NVIDIA A30"}]}],
            "requests": [{"name": "r", "profiles": ["1g.6gb"], "nodes": ["n"]}],
            "policy": {
                "profiles": {"allow": ["1g.6gb"], "deny": ["2g.12gb"]},
                "spares": [{"profile": "1g.6gb", "count": 1}],
            },
        }
    )
    assert parsed.requests[0].count == 1
    assert parsed.requests[0].priority == 0
    assert parsed.requests[0].nodes == frozenset({"n"})
    assert not parsed.requests[0].same_gpu
    assert parsed.policy.permits("1g.6gb")
    assert not parsed.policy.permits("2g.12gb")
    assert parsed.policy.spares[0].count == 1


def test_policy_is_any_spec_the_api_model_accepts() -> None:
    """Every field of a GpuPartitionPolicy spec parses, not only the ones the planner reads."""
    parsed = parse(
        doc(
            policy={
                "mode": "DryRun",
                "priority": 5,
                "nodeSelector": {"matchLabels": {"pool": "a"}},
                "profiles": {"deny": ["7g.80gb"]},
                "spares": [{"profile": "1g.10gb", "count": 0}],
                "reconfiguration": {"batchWindowSeconds": 5, "maxConcurrentNodes": 2},
            }
        )
    )
    assert parsed.policy.allowed is None
    assert parsed.policy.denied == frozenset({"7g.80gb"})
    assert parsed.policy.spares == ()  # a spare of count 0 asks for nothing


BAD_POLICIES = [
    ({"colour": "blue"}, "policy.colour: Extra inputs are not permitted"),
    ({"profiles": {"allow": ["1g.10gb", "big"]}}, "policy.profiles.allow[1]: String should match"),
    ({"spares": [{"profile": "1g.10gb"}]}, "policy.spares[0].count: Field required"),
    (
        {"profiles": {"deny": ["1g.10gb"]}, "spares": [{"profile": "1g.10gb", "count": 1}]},
        "policy: Value error, spares: profile 1g.10gb is denied",
    ),
    ([], "policy: Input should be a valid dictionary"),
]


@pytest.mark.parametrize(("policy", "message"), BAD_POLICIES)
def test_invalid_policy_names_the_field(policy: object, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse(doc(policy=policy))
    assert str(info.value).startswith(message), str(info.value)


def test_same_gpu_request() -> None:
    parsed = parse(
        {
            "nodes": [{"name": "n", "gpus": [{"index": 0, "model": "NVIDIA A30"}]}],
            "requests": [{"name": "r", "profiles": ["1g.6gb"], "count": 2, "sameGpu": True}],
        }
    )
    assert parsed.requests[0].same_gpu
    with pytest.raises(InvalidInput, match=r"^requests\[0\]\.sameGpu: expected true or false"):
        parse(
            {
                "nodes": [{"name": "n", "gpus": [{"index": 0, "model": "NVIDIA A30"}]}],
                "requests": [{"name": "r", "profiles": ["1g.6gb"], "sameGpu": "yes"}],
            }
        )


TABLE = {
    "computeSlices": 2,
    "memorySlices": 2,
    "profiles": [
        {"name": "1g.5gb", "computeSlices": 1, "memorySlices": 1, "placements": [0, 1],
         "maxInstances": 2, "memoryMiB": 5000},
    ],
}  # fmt: skip


def test_supplied_table_for_unknown_model() -> None:
    parsed = parse(
        {
            "models": {"Fake GPU": TABLE},
            "nodes": [
                {
                    "name": "n",
                    "gpus": [
                        {
                            "index": 0,
                            "model": "Fake GPU",
                            "instances": [{"profile": "1g.5gb", "start": 1}],
                        }
                    ],
                }
            ],
            "requests": [{"name": "r", "profiles": ["1g.5gb"]}],
        }
    )
    assert parsed.snapshot.table("Fake GPU").compute_slices == 2


BAD = [
    ("not an object", [], "input: expected an object"),
    ("nodes missing", doc(nodes=...), "nodes: missing"),
    ("unknown top-level field", doc(extra=1), "extra: unknown field"),
    (
        "unknown model",
        doc(nodes__0__gpus__0__model="Mystery GPU"),
        "nodes[0].gpus[0].model: unknown model and no profile table given",
    ),
    ("node name missing", doc(nodes__0__name=...), "nodes[0].name: missing"),
    ("node name wrong type", doc(nodes__0__name=3), "nodes[0].name: expected a string"),
    ("gpu index negative", doc(nodes__0__gpus__0__index=-1), "nodes[0].gpus[0].index: must be"),
    ("gpu index bool", doc(nodes__0__gpus__0__index=True), "nodes[0].gpus[0].index: expected an"),
    (
        "instance profile not offered",
        doc(nodes__0__gpus__0__instances__1__profile="1g.18gb"),
        "nodes[0].gpus[0].instances[1].profile: '1g.18gb' is not offered",
    ),
    (
        "instance start not allowed",
        doc(nodes__0__gpus__0__instances__0__start=1),
        "nodes[0].gpus[0].instances[0].start: 3g.40gb cannot start at 1",
    ),
    (
        "overlapping instances",
        doc(nodes__0__gpus__0__instances__1__start=2),
        "nodes[0].gpus[0].instances[1]: 1g.10gb@2 overlaps instances[0]",
    ),
    (
        "used not a boolean",
        doc(nodes__0__gpus__0__instances__0__used="yes"),
        "nodes[0].gpus[0].instances[0].used: expected true or false",
    ),
    (
        "instance start missing",
        doc(nodes__0__gpus__0__instances__0__start=...),
        "nodes[0].gpus[0].instances[0].start: missing",
    ),
    ("request name missing", doc(requests__0__name=...), "requests[0].name: missing"),
    ("request count zero", doc(requests__0__count=0), "requests[0].count: must be at least 1"),
    ("request count negative", doc(requests__0__count=-2), "requests[0].count: must be at least 1"),
    ("request count string", doc(requests__0__count="2"), "requests[0].count: expected an integer"),
    ("request priority float", doc(requests__0__priority=1.5), "requests[0].priority: expected"),
    (
        "unknown request profile",
        doc(requests__0__profiles=["1g.10gb", "9g.1gb"]),
        "requests[0].profiles[1]: unknown profile '9g.1gb'",
    ),
    ("empty request profiles", doc(requests__0__profiles=[]), "requests[0].profiles: must not be"),
    ("requests not a list", doc(requests={}), "requests: expected a list"),
    ("nodes not a list", doc(nodes="n1"), "nodes: expected a list"),
]


@pytest.mark.parametrize(("name", "document", "message"), BAD, ids=[b[0] for b in BAD])
def test_invalid_input_names_the_field(name: str, document: Any, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse(document)
    assert str(info.value).startswith(message), str(info.value)


def test_duplicates_are_rejected() -> None:
    two_nodes = doc()
    two_nodes["nodes"].append(copy.deepcopy(two_nodes["nodes"][0]))
    with pytest.raises(InvalidInput, match=r"^nodes\[1\]\.name: duplicate node 'n1'"):
        parse(two_nodes)
    two_gpus = doc()
    gpus = two_gpus["nodes"][0]["gpus"]
    gpus.append({"index": 0, "model": "NVIDIA H200"})
    with pytest.raises(InvalidInput, match=r"^nodes\[0\]\.gpus\[1\]\.index: duplicate GPU index"):
        parse(two_gpus)
    two_requests = doc()
    two_requests["requests"].append(copy.deepcopy(two_requests["requests"][0]))
    with pytest.raises(InvalidInput, match=r"^requests\[1\]\.name: duplicate request 'r'"):
        parse(two_requests)


BAD_TABLES = [
    ({**TABLE, "computeSlices": 0}, "models['Fake GPU'].computeSlices: must be at least 1"),
    ({**TABLE, "profiles": []}, "models['Fake GPU'].profiles: must not be empty"),
    (
        {**TABLE, "profiles": [{**TABLE["profiles"][0], "placements": [0, 2]}]},
        "models['Fake GPU'].profiles[0].placements[1]: start 2 + 1 slices exceeds 2",
    ),
    (
        {**TABLE, "profiles": [{**TABLE["profiles"][0], "computeSlices": 3}]},
        "models['Fake GPU'].profiles[0].computeSlices: 3 exceeds the model's 2",
    ),
    (
        {**TABLE, "profiles": [TABLE["profiles"][0], TABLE["profiles"][0]]},
        "models['Fake GPU'].profiles[1].name: duplicate profile",
    ),
    (
        {**TABLE, "profiles": [{**TABLE["profiles"][0], "maxInstances": ...}]},
        "models['Fake GPU'].profiles[0].maxInstances: Field required",
    ),
]


@pytest.mark.parametrize(("table", "message"), BAD_TABLES)
def test_invalid_tables(table: dict[str, Any], message: str) -> None:
    table = copy.deepcopy(table)
    for prof in table["profiles"]:
        for key in [k for k, v in prof.items() if v is ...]:
            del prof[key]
    with pytest.raises(InvalidInput) as info:
        parse({"models": {"Fake GPU": table}, "nodes": []})
    assert str(info.value).startswith(message), str(info.value)


def test_encode_plan_matches_contract() -> None:
    result = Plan(
        gpus=(GpuPlan("n", 0, (Instance("3g.40gb", 0), Instance("1g.10gb", 4))),),
        assignments=(Assignment("r", "n", (DeviceRef(0, "1g.10gb", 4),)),),
        unsatisfied=("q",),
        stats=PlanStats(destroyed=1, created=2, gpus_changed=1),
    )
    assert encode_plan(result, 0.41234) == {
        "gpus": [
            {
                "node": "n",
                "index": 0,
                "instances": [
                    {"profile": "3g.40gb", "start": 0},
                    {"profile": "1g.10gb", "start": 4},
                ],
            }
        ],
        "assignments": [
            {"request": "r", "node": "n", "devices": [{"gpu": 0, "profile": "1g.10gb", "start": 4}]}
        ],
        "unsatisfied": ["q"],
        "stats": {"destroyed": 1, "created": 2, "gpusChanged": 1, "planMillis": 0.412},
    }
