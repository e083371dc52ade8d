"""Trace tasks become MIG requests that fit the GPU model."""

from __future__ import annotations

import pytest

from migpart.demo.trace import accelerate, load_trace, profile_for
from migpart.mig import lookup_table
from tests.conftest import FIXTURES

H100 = lookup_table("NVIDIA H100 80GB HBM3")
H200 = lookup_table("NVIDIA H200")


@pytest.mark.parametrize(
    ("num_gpu", "milli", "expected"),
    [
        (1, 100, ("1g.10gb", 1)),  # 0.7 compute slices
        (1, 143, ("2g.20gb", 1)),  # just over one of 7 compute slices
        (1, 250, ("2g.20gb", 1)),
        (1, 460, ("4g.40gb", 1)),  # 3.2 slices
        (1, 1000, ("7g.80gb", 1)),
        (4, 1000, ("7g.80gb", 4)),
    ],
)
def test_profile_for_h100(num_gpu: int, milli: int, expected: tuple[str, int]) -> None:
    assert profile_for(H100, num_gpu, milli) == expected


def test_profile_for_other_model_uses_its_names() -> None:
    assert profile_for(H200, 1, 400) == ("3g.71gb", 1)


def test_load_and_accelerate_real_trace() -> None:
    pods = load_trace(FIXTURES / "traces" / "openb_pod_list_default.csv", H100, limit=50)
    assert len(pods) == 50
    assert pods[0].created_s == 0
    assert all(H100.has(p.profile) and p.count >= 1 for p in pods)
    fast = accelerate(pods, 30.0, min_life_s=2.0, max_life_s=10.0)
    assert max(p.created_s for p in fast) == pytest.approx(30.0)
    assert all(2.0 <= p.duration_s <= 10.0 for p in fast)
