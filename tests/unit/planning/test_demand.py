"""Pending ResourceClaims become planner Requests (or a reason why not), with real CEL
(`kube.selectors.CEL`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from migpart.kube.selectors import CEL
from migpart.mig import CATALOG
from migpart.planning.candidates import class_selectors, is_ours
from migpart.planning.demand import ClaimDemand, Unsatisfiable, claim_demand
from migpart.planning.model import PolicyView, Request
from migpart.planning.overtime import AGE_S, aged_requests
from migpart.slices.dra import DEVICE_CLASS, DRIVER
from migpart.testing.builders import ClaimBuilder

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
TABLES = {H100: CATALOG[H100]}
BOTH = {H100: CATALOG[H100], H200: CATALOG[H200]}
ATTR = f'device.attributes["{DRIVER}"]'
CAP = f'device.capacity["{DRIVER}"]'
ANY = PolicyView()


def _class(*expressions: str) -> dict[str, Any]:
    return {"spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}}


CLASSES = {
    DRIVER: _class(f'device.driver == "{DRIVER}"'),
    "mig-large": _class(f'device.driver == "{DRIVER}"', f"{CAP}.computeSlices.asInteger() >= 3"),
    "gpu.nvidia.com": _class('device.driver == "gpu.nvidia.com"'),
    "nvidia-mig": _class('device.attributes["gpu.nvidia.com"].type == "mig"'),
}


def _exactly(*selectors: str, cls: str = DRIVER, **extra: Any) -> dict[str, Any]:
    return {
        "deviceClassName": cls,
        "selectors": [{"cel": {"expression": s}} for s in selectors],
        **extra,
    }


def _claim(
    *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    claim = ClaimBuilder("c1", "team-a")
    for request in requests:
        claim.raw_request(request)
    for constraint in constraints or []:
        claim.constraint(constraint)
    return claim.obj()


def _req(name: str = "gpu", **exactly: Any) -> dict[str, Any]:
    selectors = exactly.pop("selectors", ())
    return {"name": name, "exactly": _exactly(*selectors, **exactly)}


def _wanted(result: ClaimDemand | Unsatisfiable | None) -> ClaimDemand:
    assert isinstance(result, ClaimDemand), result
    return result


def _refused(result: ClaimDemand | Unsatisfiable | None) -> Unsatisfiable:
    assert isinstance(result, Unsatisfiable), result
    assert result.claim == "team-a/c1"
    return result


@pytest.mark.parametrize(
    ("request_body", "profiles", "count"),
    [
        (_req(selectors=[f'{ATTR}.profile == "1g.10gb"']), ("1g.10gb",), 1),
        (
            _req(selectors=[f'{CAP}.memory.compareTo(quantity("20Gi")) >= 0']),
            ("3g.40gb", "4g.40gb", "7g.80gb"),
            1,
        ),
        (
            _req(selectors=[f'{CAP}.memory.compareTo(quantity("9Gi")) >= 0']),
            ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            1,
        ),
        (_req(selectors=[f'{ATTR}.profile == "1g.10gb"'], count=2), ("1g.10gb",), 2),
        (
            _req(cls="mig-large", allocationMode="ExactCount", count=3),
            ("3g.40gb", "4g.40gb", "7g.80gb"),
            3,
        ),
    ],
)
def test_exactly_requests(
    request_body: dict[str, Any], profiles: tuple[str, ...], count: int
) -> None:
    got = _wanted(claim_demand(_claim(request_body), CLASSES, TABLES, ANY, CEL, priority=5))
    assert got.request == Request(name="team-a/c1", profiles=profiles, count=count, priority=5)
    assert got.claim == "team-a/c1"
    assert not got.same_gpu


def test_impossible_request_says_why() -> None:
    claim = _claim(_req(selectors=[f'{CAP}.memory.compareTo(quantity("100Gi")) >= 0']))
    got = _refused(claim_demand(claim, CLASSES, TABLES, ANY, CEL, policy_name="inference-pool"))
    assert got.reason == (
        "request gpu: no MIG profile of NVIDIA H100 80GB HBM3 allowed by policy inference-pool"
        f' satisfies device.capacity["{DRIVER}"].memory.compareTo(quantity("100Gi")) >= 0'
    )
    assert got.error is None


def test_policy_filters_candidates_and_says_which_it_forbids() -> None:
    policy = PolicyView(allowed=frozenset({"1g.10gb", "2g.20gb", "3g.40gb"}))
    claim = _claim(_req(selectors=[f'{CAP}.memory.compareTo(quantity("20Gi")) >= 0']))
    assert _wanted(claim_demand(claim, CLASSES, TABLES, policy, CEL)).request.profiles == (
        "3g.40gb",
    )
    denied = PolicyView(denied=frozenset({"3g.40gb", "4g.40gb", "7g.80gb"}))
    got = _refused(claim_demand(claim, CLASSES, TABLES, denied, CEL, policy_name="p"))
    assert "3g.40gb, 4g.40gb, 7g.80gb would, but policy p does not allow it" in got.reason


@pytest.mark.parametrize("cls", ["gpu.nvidia.com", "nvidia-mig", "no-such-class"])
def test_other_drivers_classes_are_ignored(cls: str) -> None:
    assert claim_demand(_claim(_req(cls=cls)), CLASSES, TABLES, ANY, CEL) is None


def test_only_our_requests_of_a_mixed_claim_count() -> None:
    claim = _claim(
        _req("nic", cls="gpu.nvidia.com"), _req("mig", selectors=[f'{ATTR}.profile == "7g.80gb"'])
    )
    got = _wanted(claim_demand(claim, CLASSES, TABLES, ANY, CEL))
    assert got.request.profiles == ("7g.80gb",)
    assert got.request.count == 1


def test_allocated_claims_and_admin_access_need_nothing() -> None:
    allocated = _claim(_req()) | {"status": {"allocation": {"devices": {"results": []}}}}
    assert claim_demand(allocated, CLASSES, TABLES, ANY, CEL) is None
    assert claim_demand(_claim(_req(adminAccess=True)), CLASSES, TABLES, ANY, CEL) is None


def test_allocation_mode_all_is_unsatisfiable() -> None:
    got = _refused(claim_demand(_claim(_req(allocationMode="All")), CLASSES, TABLES, ANY, CEL))
    assert "allocationMode All" in got.reason


def _alt(name: str, profile: str, count: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": f'{ATTR}.profile == "{profile}"'}}],
        "count": count,
    }


def test_first_available_gives_the_preference_order() -> None:
    claim = _claim(
        {"name": "gpu", "firstAvailable": [_alt("big", "3g.40gb"), _alt("small", "1g.10gb")]}
    )
    assert _wanted(claim_demand(claim, CLASSES, TABLES, ANY, CEL)).request.profiles == (
        "3g.40gb",
        "1g.10gb",
    )


def test_first_available_skips_impossible_and_foreign_alternatives() -> None:
    foreign = {"name": "full", "deviceClassName": "gpu.nvidia.com"}
    claim = _claim(
        {
            "name": "gpu",
            "firstAvailable": [foreign, _alt("huge", "8g.96gb"), _alt("small", "1g.10gb")],
        }
    )
    assert _wanted(claim_demand(claim, CLASSES, TABLES, ANY, CEL)).request.profiles == ("1g.10gb",)
    hopeless = _claim({"name": "gpu", "firstAvailable": [_alt("huge", "8g.96gb")]})
    assert "request gpu/huge" in _refused(claim_demand(hopeless, CLASSES, TABLES, ANY, CEL)).reason


def test_first_available_with_counts_keeps_alternatives_apart() -> None:
    claim = _claim(
        {
            "name": "gpu",
            "firstAvailable": [_alt("pair", "1g.10gb", 2), _alt("one", "2g.20gb", 2)],
        }
    )
    got = _wanted(claim_demand(claim, CLASSES, TABLES, ANY, CEL))
    assert (got.request.profiles, got.request.count) == (("1g.10gb",), 2)


def test_several_requests_share_common_profiles() -> None:
    claim = _claim(
        _req("a", selectors=[f'{CAP}.memory.compareTo(quantity("20Gi")) >= 0']),
        _req("b", selectors=[f"{CAP}.computeSlices.asInteger() <= 4"], count=2),
    )
    got = _wanted(claim_demand(claim, CLASSES, TABLES, ANY, CEL))
    assert (got.request.profiles, got.request.count) == (("3g.40gb", "4g.40gb"), 3)


def test_several_requests_without_common_profile_are_refused() -> None:
    claim = _claim(
        _req("a", selectors=[f'{ATTR}.profile == "1g.10gb"']),
        _req("b", selectors=[f'{ATTR}.profile == "3g.40gb"']),
    )
    got = _refused(claim_demand(claim, CLASSES, TABLES, ANY, CEL))
    assert "requests a, b accept no common MIG profile" in got.reason


@pytest.mark.parametrize("attribute", [f"{DRIVER}/parentUUID", f"{DRIVER}/gpuIndex"])
def test_match_attribute_on_the_gpu_means_same_gpu(attribute: str) -> None:
    claim = _claim(
        _req(selectors=[f"{CAP}.memorySlices.asInteger() <= 4"], count=2),
        constraints=[{"matchAttribute": attribute}],
    )
    got = _wanted(claim_demand(claim, CLASSES, TABLES, ANY, CEL))
    assert got.same_gpu
    assert got.request.same_gpu  # the planner sees it and keeps the devices on one GPU
    # 4g.40gb cannot exist twice on one GPU; the others can.
    assert got.request.profiles == ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb")
    assert got.request.count == 2


def test_too_many_for_one_gpu() -> None:
    claim = _claim(
        _req(selectors=[f'{ATTR}.profile == "3g.40gb"'], count=3),
        constraints=[{"matchAttribute": f"{DRIVER}/parentUUID"}],
    )
    assert (
        "do not fit on one GPU" in _refused(claim_demand(claim, CLASSES, TABLES, ANY, CEL)).reason
    )


@pytest.mark.parametrize(
    ("attribute", "outcome"),
    [
        (f"{DRIVER}/profile", ("1g.10gb",)),
        (f"{DRIVER}/productName", ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb")),
        (f"{DRIVER}/uuid", "never share one"),
        (f"{DRIVER}/color", "migpart devices have no color"),
        ("gpu.nvidia.com/parentUUID", "no attributes of domain gpu.nvidia.com"),
    ],
)
def test_other_constraints(attribute: str, outcome: tuple[str, ...] | str) -> None:
    claim = _claim(
        _req(selectors=[f"{CAP}.memorySlices.asInteger() <= 2"], count=2),
        constraints=[{"matchAttribute": attribute}],
    )
    got = claim_demand(claim, CLASSES, TABLES, ANY, CEL)
    if isinstance(outcome, str):
        assert outcome in _refused(got).reason
    else:
        assert _wanted(got).request.profiles == outcome


def test_selector_errors_are_reported_with_the_error() -> None:
    broken = _claim(_req(selectors=[f"{ATTR}.nope == 1"]))
    got = _refused(claim_demand(broken, CLASSES, TABLES, ANY, CEL))
    assert got.error is not None
    assert got.error.runtime
    assert "selector failed: no such member" in got.reason
    malformed = _claim(_req(selectors=[f"{ATTR}.profile =="]))
    got = _refused(claim_demand(malformed, CLASSES, TABLES, ANY, CEL))
    assert got.error is not None
    assert not got.error.runtime
    assert "syntax error" in got.reason


def test_candidates_per_model_and_eligible_nodes() -> None:
    claim = _claim(_req(selectors=[f'{CAP}.memory.compareTo(quantity("16Gi")) >= 0']))
    got = _wanted(
        claim_demand(
            claim,
            CLASSES,
            BOTH,
            PolicyView(allowed=frozenset({"1g.18gb", "1g.10gb"})),
            CEL,
            node_models={"h100-node": [H100], "h200-node": [H200], "mixed": [H100, H200]},
        )
    )
    assert got.by_model == {H200: ("1g.18gb",)}
    assert got.request.profiles == ("1g.18gb",)
    assert got.request.nodes == frozenset({"h200-node", "mixed"})


def test_no_known_model() -> None:
    got = _refused(claim_demand(_claim(_req()), CLASSES, {}, ANY, CEL))
    assert "no MIG GPU model is known" in got.reason


def test_class_ownership() -> None:
    assert is_ours(CLASSES[DRIVER], TABLES, CEL)
    assert is_ours(CLASSES["mig-large"], TABLES, CEL)
    assert is_ours(_class(), TABLES, CEL)
    assert not is_ours(CLASSES["gpu.nvidia.com"], TABLES, CEL)
    assert not is_ours(CLASSES["nvidia-mig"], TABLES, CEL)
    assert is_ours(CLASSES[DRIVER], {}, CEL)
    assert class_selectors(CLASSES["mig-large"])[1].endswith(">= 3")


def test_a_claim_is_wanted_hopeless_or_not_ours() -> None:
    nodes = frozenset({"n1"})
    ok = _claim(_req(selectors=[f'{ATTR}.profile == "1g.10gb"']))
    wanted = _wanted(claim_demand(ok, CLASSES, TABLES, ANY, CEL, nodes=nodes))
    assert (wanted.request.name, wanted.request.nodes) == ("team-a/c1", nodes)
    bad = _claim(_req(allocationMode="All"))
    assert "allocationMode All" in _refused(claim_demand(bad, CLASSES, TABLES, ANY, CEL)).reason
    foreign = _claim(_req(cls="gpu.nvidia.com"))
    assert claim_demand(foreign, CLASSES, TABLES, ANY, CEL, nodes=nodes) is None


def test_deviceclass_manifest_is_ours() -> None:
    body = yaml.safe_load(
        (Path(__file__).parents[3] / "manifests" / "deviceclass.yaml").read_text()
    )
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["metadata"]["name"] == DEVICE_CLASS
    assert is_ours(body, TABLES, CEL)
    assert not is_ours(
        body | {"spec": {"selectors": [{"cel": {"expression": "false"}}]}}, TABLES, CEL
    )


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        pytest.param(
            _req(selectors=[f"{ATTR}.profile == "]),
            ["selector failed: syntax error at column", f"(selector: {ATTR}.profile == )"],
            id="cel-does-not-compile",
        ),
        pytest.param(
            _req(selectors=[f'{ATTR}.color == "red"']),
            ["no such member in mapping: 'color'", "have attributes created, gpuIndex, parentUUID"],
            id="unknown-attribute",
        ),
        pytest.param(
            _req(selectors=[f"{ATTR}.profile > 5"]),
            ["no matching overload for > applied to (string, int)", "compare values of one"],
            id="string-compared-to-int",
        ),
        pytest.param(
            _req(selectors=[f"{CAP}.memory >= 10"]),
            ["no matching overload for >= applied to (quantity, int)", 'quantity("10Gi")'],
            id="quantity-compared-to-int",
        ),
        pytest.param(
            _req(allocationMode="All"),
            ["allocationMode All asks for every matching device"],
            id="allocation-mode-all",
        ),
        pytest.param(
            _req(selectors=['device.driver == "gpu.nvidia.com"']),
            ["no MIG profile", 'satisfies device.driver == "gpu.nvidia.com"'],
            id="our-class-another-driver",
        ),
    ],
)
def test_a_bad_claim_says_why_migpart_cannot_serve_it(
    request_: dict[str, Any], words: list[str]
) -> None:
    got = _refused(claim_demand(_claim(request_), CLASSES, TABLES, ANY, CEL))
    for w in words:
        assert w in got.reason, got.reason


def test_a_claim_of_another_drivers_class_is_left_to_that_driver() -> None:
    """No event either: it is not migpart's claim (the other driver serves or reports it)."""
    assert claim_demand(_claim(_req(cls="gpu.nvidia.com")), CLASSES, TABLES, ANY, CEL) is None


def test_requests_age_from_their_oldest_waiting_pod() -> None:
    now = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)

    def created(seconds_ago: float) -> dict[str, Any]:
        return {"created": (now - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")}

    requests = [
        Request("ns/old", ("1g.10gb",)),
        Request("ns/young", ("1g.10gb",)),
        Request("ns/shared", ("1g.10gb",)),
        Request("ns/unknown", ("1g.10gb",)),
        Request("ns/high", ("1g.10gb",), priority=1),
    ]
    waiting = {
        "ns/old": (created(AGE_S * 3),),
        "ns/young": (created(10),),
        # a claim shared by two waiting pods is as old as the older one
        "ns/shared": (created(10), created(AGE_S)),
        # no timestamp, or an unreadable one: just created
        "ns/unknown": ({"created": ""}, {"created": "yesterday"}, {}),
        "ns/high": (created(0),),
    }
    out = {r.name: r.priority for r in aged_requests(requests, waiting, now)}
    assert out["ns/old"] > out["ns/shared"] > out["ns/young"] == out["ns/unknown"]
    # ageing never lifts a request above a higher priority
    assert out["ns/high"] > out["ns/old"]
    # only the priority changes
    assert [r.name for r in aged_requests(requests, waiting, now)] == [r.name for r in requests]
