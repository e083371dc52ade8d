"""Static layouts: mig-parted configs, all-balanced, and the best-static shapes."""

from __future__ import annotations

from collections import Counter

import pytest

from migpart.errors import InvalidInput
from migpart.mig import CATALOG, layout_problems
from migpart.sim.layouts import balanced, mig_parted_layout, read_mig_parted, shapes

H100 = CATALOG["NVIDIA H100 80GB HBM3"]

CONFIG = """
version: v1
mig-configs:
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
  half:
    - devices: [0, 1, 2, 3]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
    - devices: [4, 5, 6, 7]
      mig-enabled: false
"""


def test_a_mig_parted_config_becomes_valid_layouts_per_gpu() -> None:
    configs = read_mig_parted(CONFIG, "cfg.yaml")
    layout = mig_parted_layout(H100, "all-balanced", configs["all-balanced"], 8, "cfg.yaml").layout
    assert len(layout) == 8
    for gpu in layout:
        assert layout_problems(H100, gpu) == []
        assert Counter(i.profile for i in gpu) == Counter(balanced(H100))
    half = mig_parted_layout(H100, "half", configs["half"], 8, "cfg.yaml").layout
    assert [len(g) for g in half] == [2, 2, 2, 2, 1, 1, 1, 1]
    assert half[7][0].profile == "7g.80gb"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\nmig-configs: {a: []}\n", "version: expected v1"),
        ("version: v1\n", "mig-configs: expected a map"),
        (
            "version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: true,"
            " mig-devices: {'3g.40gb': 3}}\n",
            "mig-configs.a\\[0\\].mig-devices: 3 x 3g.40gb do not fit",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: true,"
            " mig-devices: {'five-g': 1}}\n",
            "mig-devices.five-g: not a MIG profile name",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - {devices: some, mig-enabled: true}\n",
            "a\\[0\\].devices: expected 'all' or a list",
        ),
    ],
)
def test_bad_configs_are_named(text: str, message: str) -> None:
    def load() -> None:
        for name, entries in read_mig_parted(text, "cfg.yaml").items():
            mig_parted_layout(H100, name, entries, 8, "cfg.yaml")

    with pytest.raises(InvalidInput, match=message):
        load()


def test_shapes_fill_the_gpu_with_valid_layouts() -> None:
    found = shapes(H100)
    assert {"7", "4+3", "3+3", "3+2+1+1", "1+1+1+1+1+1+1"} <= set(found)
    for layout in found.values():
        assert layout_problems(H100, layout) == []
