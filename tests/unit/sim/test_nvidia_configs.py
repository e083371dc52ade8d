"""NVIDIA's stock mig-parted configs (tests/fixtures/mig-parted/, see its README) read as
`migpart simulate --mig-config` reads them: `device-filter` honoured, profiles a model does not
offer skipped with one warning each, configs for other models left out in one line, and every
malformed input still one clear error."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from migpart.errors import InvalidInput
from migpart.mig import CATALOG, ModelTable, layout_problems
from migpart.sim.layouts import MigPartedLayouts, balanced, mig_parted_layouts, read_mig_parted
from tests.conftest import FIXTURES

STOCK = FIXTURES / "mig-parted"
EXAMPLE = STOCK / "mig-parted-example-config.yaml"  # NVIDIA/mig-parted examples/config.yaml
OPERATOR = STOCK / "gpu-operator-default-mig-parted-config.yaml"  # the GPU Operator's ConfigMap
H100 = CATALOG["NVIDIA H100 80GB HBM3"]
A100_40GB = CATALOG["NVIDIA A100-SXM4-40GB"]
A30 = CATALOG["NVIDIA A30"]


def load(path: Path, table: ModelTable, gpus: int = 8) -> MigPartedLayouts:
    return mig_parted_layouts(table, read_mig_parted(path.read_text(), path.name), gpus, path.name)


def counts(layout: tuple[object, ...]) -> Counter[str]:
    return Counter(i.profile for i in layout)


def test_mig_parteds_example_config_on_an_h100() -> None:
    """Its A100-40GB configs (1g.5gb, ...) were rejected before; now they are left out."""
    found = load(EXAMPLE, H100)
    assert set(found.layouts) == {
        "static:all-disabled",
        "static:all-enabled",
        "static:all-1g.10gb",
        "static:custom-config",
    }
    assert all(counts(gpu) == {"1g.10gb": 4} for gpu in found.layouts["static:all-1g.10gb"])
    custom = found.layouts["static:custom-config"]
    assert [counts(gpu) for gpu in custom[:4]] == [{"7g.80gb": 1}] * 4
    assert custom[4:] == ((), (), (), ())  # only A100-40GB profiles: MIG on, nothing made
    *skips, left_out = found.warnings
    assert skips == [
        f"{EXAMPLE.name}: mig-configs.custom-config: {p} is not offered by {H100.model}, skipped"
        for p in ("1g.5gb", "2g.10gb", "3g.20gb")
    ]
    assert left_out.endswith(
        "5 of 9 configs are for other models than NVIDIA H100 80GB HBM3 (device-filter, or only"
        " profiles it does not offer), left out: all-1g.5gb, all-1g.5gb.me, all-2g.10gb,"
        " all-3g.20gb, all-balanced"
    )


def test_mig_parteds_example_config_on_the_a100_it_was_written_for() -> None:
    found = load(EXAMPLE, A100_40GB)
    assert found.warnings == ()
    assert all(counts(gpu) == {"1g.5gb": 7} for gpu in found.layouts["static:all-1g.5gb"])
    assert all(counts(gpu) == balanced(A100_40GB) for gpu in found.layouts["static:all-balanced"])


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_the_gpu_operators_default_config_is_read_for_every_model(model: str) -> None:
    """One warning line at most (the configs for other models), whatever the model; the
    device-filtered `all-balanced` has an entry for every model migpart knows, and it is that
    model's balanced layout on every GPU."""
    table = CATALOG[model]
    found = load(OPERATOR, table)
    assert len(found.warnings) == 1
    assert "configs are for other models" in found.warnings[0]
    assert {"static:all-disabled", "static:all-enabled", "static:all-balanced"} <= set(
        found.layouts
    )
    for layout in found.layouts.values():
        for gpu in layout:
            assert layout_problems(table, gpu) == []
    for gpu in found.layouts["static:all-balanced"]:
        assert counts(gpu) == balanced(table)


def test_device_filter_picks_the_models_entry() -> None:
    """`all-1g.10gb` has one entry for H100 and A100-80GB (7 per GPU) and one, filtered to the
    A100-40GB device ids, with 4 per GPU."""
    h100 = load(OPERATOR, H100).layouts["static:all-1g.10gb"]
    a100 = load(OPERATOR, A100_40GB).layouts["static:all-1g.10gb"]
    assert all(counts(gpu) == {"1g.10gb": 7} for gpu in h100)
    assert all(counts(gpu) == {"1g.10gb": 4} for gpu in a100)
    assert "static:all-1g.10gb" not in load(OPERATOR, A30).layouts


def config(entry: str) -> str:
    return f"version: v1\nmig-configs:\n  c:\n    - {entry}\n"


@pytest.mark.parametrize(
    ("device_filter", "applies"),
    [
        ('"0x233010DE"', True),
        ('"0x233010de"', True),
        ('["0x20B010DE", "0x233010DE"]', True),
        ('"0x233010DE:0x16C110DE"', True),  # a board of the chip: the chip decides
        ('"0x20B710DE"', False),  # an A30
        ('"0x23301234"', False),  # another vendor
        ("[]", False),
    ],
)
def test_a_device_filter_admits_the_models_pci_ids(device_filter: str, applies: bool) -> None:
    text = config(
        f"{{device-filter: {device_filter}, devices: all, mig-enabled: true,"
        " mig-devices: {'3g.40gb': 2}}"
    )
    found = mig_parted_layouts(H100, read_mig_parted(text, "f"), 2, "f")
    assert ("static:c" in found.layouts) is applies


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{device-filter: H100, devices: all, mig-enabled: false}", "device-filter: 'H100' is not"),
        ("{device-filter: 0x2330, devices: all, mig-enabled: false}", "device-filter: expected"),
        ("{device-filter: [1], devices: all, mig-enabled: false}", "device-filter: expected"),
        ("{device-filter: '0x1:0x2:0x3', devices: all, mig-enabled: false}", "DEVICEVENDOR"),
        ("{device-filter: '0x1FFFFFFFF', devices: all, mig-enabled: false}", "is not a PCI"),
        ("{devices: all, mig-enabled: false, gpus: 2}", "c\\[0\\].gpus: unknown field"),
        ("{devices: all, mig-enabled: true, mig-devices: {'1g.5gb': -1}}", "expected a map"),
        ("{devices: all, mig-enabled: true, mig-devices: {'3g.40gb': 3}}", "do not fit"),
        ("{devices: all, mig-enabled: true, mig-devices: {'1g': 1}}", "not a MIG profile name"),
        ("{devices: all}", "mig-enabled: expected true or false"),
    ],
)
def test_malformed_input_is_still_one_clear_error(entry: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        mig_parted_layouts(H100, read_mig_parted(config(entry), "f"), 2, "f")


def test_an_entry_for_another_model_is_still_checked() -> None:
    """A filter that excludes the model does not excuse a malformed entry."""
    entry = "{device-filter: '0x20B710DE', devices: some, mig-enabled: true}"
    with pytest.raises(InvalidInput, match="devices: expected 'all'"):
        mig_parted_layouts(H100, read_mig_parted(config(entry), "f"), 2, "f")


def test_a_configmap_without_config_yaml_names_its_keys() -> None:
    text = "apiVersion: v1\nkind: ConfigMap\ndata:\n  a.yaml: x\n  b.yaml: y\n"
    with pytest.raises(InvalidInput, match=r"data: expected a key config.yaml, got \['a.yaml'"):
        read_mig_parted(text, "cm.yaml")


def test_every_catalog_model_has_its_pci_device_id() -> None:
    assert all(table.pci_device_ids for table in CATALOG.values())
    assert H100.pci_device_ids == (0x2330,)
