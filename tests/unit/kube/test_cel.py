"""DRA CEL selectors, evaluated with cel-python plus the Kubernetes quantity/semver/strings
libraries, against the virtual devices migpart would publish."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from migpart.errors import SelectorError
from migpart.kube.cel import (
    Device,
    compile_selector,
    device_from_slice,
    evaluate,
    matches,
    virtual_device,
)
from migpart.kube.cel_library import Quantity, Semver, parse_quantity
from migpart.mig import CATALOG
from migpart.slices.content import slice_device
from migpart.slices.dra import DRIVER

H100 = CATALOG["NVIDIA H100 80GB HBM3"]
H200 = CATALOG["NVIDIA H200"]
ATTR = f'device.attributes["{DRIVER}"]'
CAP = f'device.capacity["{DRIVER}"]'


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Fraction(0)),
        ("20Gi", Fraction(20 * 2**30)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("100m", Fraction(1, 10)),
        ("1k", Fraction(1000)),
        ("2M", Fraction(2_000_000)),
        ("1e3", Fraction(1000)),
        ("1E-3", Fraction(1, 1000)),
        ("-5", Fraction(-5)),
        ("+.5", Fraction(1, 2)),
        ("10468982784", Fraction(10468982784)),
        ("3Ei", Fraction(3 * 2**60)),
    ],
)
def test_parse_quantity(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1GiB", "1 Gi", "1K", "1.2.3", "abc", "1ki"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(text)


@given(n=st.integers(0, 10**6), suffix=st.sampled_from(["Ki", "Mi", "Gi", "k", "M", "G"]))
def test_quantity_compare_agrees_with_exact_values(n: int, suffix: str) -> None:
    scale = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}[suffix]
    device = Device("d", {}, {"d": {"x": Quantity(Fraction(n * scale))}})
    expr = f'device.capacity["d"].x.compareTo(quantity("{n}{suffix}")) == 0'
    assert evaluate(expr, device)
    assert evaluate(f'device.capacity["d"].x == quantity("{n}{suffix}")', device)
    assert not evaluate(f'device.capacity["d"].x.isLessThan(quantity("{n}{suffix}"))', device)


EMPTY = Device(DRIVER, {}, {})


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("1Gi") == quantity("1024Mi")',
        'quantity("1Gi").compareTo(quantity("1G")) > 0',
        'quantity("1G").isLessThan(quantity("1Gi"))',
        'quantity("2Gi").isGreaterThan(quantity("1Gi"))',
        'quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")',
        'quantity("1Gi").add(1) == quantity("1073741825")',
        'quantity("1Gi").sub(quantity("512Mi")) == quantity("0.5Gi")',
        'quantity("1Gi").asInteger() == 1073741824',
        'quantity("1.5").asApproximateFloat() == 1.5',
        'quantity("1.5").isInteger() == false',
        'quantity("-3").sign() == -1',
        'isQuantity("20Gi") && !isQuantity("20GB")',
        'semver("1.2.3").isLessThan(semver("1.10.0"))',
        'semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))',
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))',
        'semver("1.0.0-2").isLessThan(semver("1.0.0-rc"))',
        'semver("2.0.0").compareTo(semver("2.0.0+build.5")) == 0',
        'semver("3.4.5").major() == 3 && semver("3.4.5").minor() == 4'
        ' && semver("3.4.5").patch() == 5',
        'isSemver("1.2.3") && !isSemver("1.2")',
        '"H100".lowerAscii() == "h100" && "h100".upperAscii() == "H100"',
        '"a,b,c".split(",") == ["a", "b", "c"] && "a,b,c".split(",", 2) == ["a", "b,c"]',
        '"1g.10gb".substring(0, 2) == "1g" && "1g.10gb".substring(3) == "10gb"',
        '"1g.10gb".indexOf(".") == 2 && "a.b.c".lastIndexOf(".") == 3',
        '"abc".charAt(1) == "b" && "  x ".trim() == "x"',
        '"a-b-c".replace("-", "+") == "a+b+c" && "a-b-c".replace("-", "", 1) == "ab-c"',
        '["a", "b"].join("-") == "a-b" && ["x", "y"].indexOf("y") == 1',
        '"10gb".find("[0-9]+") == "10" && "1g.10gb".findAll("[0-9]+") == ["1", "10"]',
        "[1, 2, 3].isSorted() && ![2, 1].isSorted() && [1, 2, 3].sum() == 6",
        "dyn(1) == 1",
        '"1g.10gb".startsWith("1g") && "1g.10gb".endsWith("gb") && "1g.10gb".contains(".")',
        '"3g.40gb".matches("^[0-9]g")',
    ],
)
def test_kubernetes_library_functions(expression: str) -> None:
    assert evaluate(expression, EMPTY), expression


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('quantity("20GB") == quantity("1")', "invalid quantity '20GB'"),
        ('semver("v1") == semver("1.0.0")', "invalid semver 'v1'"),
        ('quantity("1.5").asInteger() == 1', "cannot be represented as an int64"),
        ('"abc".substring(2, 9) == ""', "substring out of range"),
        ('semver("1.0.0").compareTo(quantity("1")) == 0', "no such overload"),
    ],
)
def test_library_errors_are_runtime_selector_errors(expression: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message) as info:
        evaluate(expression, EMPTY)
    assert info.value.runtime
    assert info.value.expression == expression


def test_virtual_device_matches_the_published_slice_device() -> None:
    profile = H100.profile("3g.40gb")
    body = slice_device(1, profile, 4, H100.model, parent_uuid="GPU-1", uuid="MIG-9")
    assert body["name"] == "gpu-1-3g40gb-4"
    assert body["attributes"]["gpuIndex"] == {"int": 1}
    assert body["capacity"]["memory"] == {"value": str(40448 * 1024 * 1024)}
    device = virtual_device(
        H100, "3g.40gb", gpu_index=1, start=4, parent_uuid="GPU-1", uuid="MIG-9"
    )
    assert device == device_from_slice(DRIVER, body)
    attrs = device.attributes[DRIVER]
    assert attrs == {
        "profile": "3g.40gb",
        "productName": "NVIDIA H100 80GB HBM3",
        "parentUUID": "GPU-1",
        "uuid": "MIG-9",
        "gpuIndex": 1,
        "placementStart": 4,
        "created": True,
    }
    cap = device.capacity[DRIVER]
    assert cap["memory"] == Quantity(Fraction(40448 * 2**20))
    assert cap["multiprocessors"] == Quantity(Fraction(60))
    assert cap["computeSlices"] == Quantity(Fraction(3))
    assert cap["memorySlices"] == Quantity(Fraction(4))
    assert device.attribute(f"{DRIVER}/profile") == "3g.40gb"
    assert device.attribute("gpuIndex") == 1


def test_virtual_device_defaults_to_the_first_placement() -> None:
    device = virtual_device(H100, "3g.40gb")
    assert device.attributes[DRIVER]["placementStart"] == 0
    assert device.attributes[DRIVER]["gpuIndex"] == 0


def test_device_from_slice_types_and_domains() -> None:
    device = device_from_slice(
        DRIVER,
        {
            "name": "x",
            "attributes": {
                "profile": {"string": "1g.10gb"},
                "healthy": {"bool": True},
                "gpuIndex": {"int": 2},
                "driverVersion": {"version": "580.159.4"},
                "example.com/zone": {"string": "a"},
            },
            "capacity": {"memory": {"value": "10Gi"}},
            "allowMultipleAllocations": False,
        },
    )
    assert device.attributes[DRIVER]["driverVersion"] == Semver(580, 159, 4)
    assert device.attributes["example.com"] == {"zone": "a"}
    assert evaluate(
        f'{ATTR}.healthy && {ATTR}.gpuIndex == 2 && {CAP}.memory == quantity("10Gi")', device
    )
    assert evaluate(f'{ATTR}.driverVersion.isGreaterThan(semver("580.0.0"))', device)
    assert evaluate('device.attributes["example.com"].zone == "a"', device)


@pytest.mark.parametrize(
    ("expression", "profiles"),
    [
        (f'device.driver == "{DRIVER}"', list(H100.profile_names)),
        (f'{ATTR}.profile == "1g.10gb"', ["1g.10gb"]),
        (
            f'{CAP}.memory.compareTo(quantity("20Gi")) >= 0',
            ["3g.40gb", "4g.40gb", "7g.80gb"],
        ),
        (
            f'{CAP}.memory.compareTo(quantity("19Gi")) >= 0'
            f" && {CAP}.computeSlices.asInteger() <= 2",
            ["1g.20gb", "2g.20gb"],
        ),
        (f"{CAP}.multiprocessors.isGreaterThan(quantity(60))", ["4g.40gb", "7g.80gb"]),
        (f'{ATTR}.profile.endsWith("+me")', ["1g.10gb+me"]),
        (f'{ATTR}.productName.lowerAscii().contains("h100")', list(H100.profile_names)),
        (f'"ofas" in {CAP}', ["1g.10gb+me", "7g.80gb"]),
        ('device.attributes["gpu.nvidia.com"].size() == 0', list(H100.profile_names)),
        ("device.allowMultipleAllocations == false", list(H100.profile_names)),
    ],
)
def test_selectors_on_h100_profiles(expression: str, profiles: list[str]) -> None:
    selected = [p for p in H100.profile_names if matches([expression], virtual_device(H100, p))]
    assert selected == profiles


def test_same_selector_differs_by_model() -> None:
    expr = f'{CAP}.memory.compareTo(quantity("16Gi")) >= 0'
    assert not evaluate(expr, virtual_device(H100, "1g.10gb"))
    assert evaluate(expr, virtual_device(H200, "1g.18gb"))


def test_matches_ands_expressions() -> None:
    device = virtual_device(H100, "2g.20gb")
    assert matches([], device)
    assert matches([f'{ATTR}.profile == "2g.20gb"', f"{ATTR}.gpuIndex == 0"], device)
    assert not matches([f'{ATTR}.profile == "2g.20gb"', f"{ATTR}.gpuIndex == 1"], device)


@pytest.mark.parametrize(
    ("expression", "message", "runtime"),
    [
        (f'device.driver == "{DRIVER}', "syntax error at column", False),
        ("device.driver ==", "syntax error", False),
        ("frobnicate(device)", "undeclared function frobnicate", False),
        ("device.driver.frob()", "undeclared function frob", False),
        ("gpu.driver == 1", "undeclared reference gpu", False),
        (f"{ATTR}.nope == 1", "no such member", True),
        ('device.attributes["gpu.nvidia.com"].type == "mig"', "no such member", True),
        (f"{ATTR}.gpuIndex", "must evaluate to bool", True),
        (f'{ATTR}.profile + 1 == "x"', "no matching overload", True),
    ],
)
def test_malformed_or_failing_selectors(expression: str, message: str, runtime: bool) -> None:
    with pytest.raises(SelectorError, match=message) as info:
        matches([expression], virtual_device(H100, "1g.10gb"))
    assert info.value.runtime is runtime
    assert info.value.expression == expression
    assert expression in str(info.value)


def test_macro_variables_are_not_undeclared() -> None:
    expr = f'["1g.10gb", "2g.20gb"].exists(p, p == {ATTR}.profile)'
    assert evaluate(expr, virtual_device(H100, "2g.20gb"))
    assert not evaluate(expr, virtual_device(H100, "3g.40gb"))


def test_compiled_once() -> None:
    expr = f'{ATTR}.profile == "7g.80gb"'
    assert compile_selector(expr) is compile_selector(expr)
