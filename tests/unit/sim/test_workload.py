"""The simulator's workload: trace formats, GPU fractions, offered load, jitter."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from migpart.errors import InvalidInput
from migpart.mig import CATALOG
from migpart.sim.workload import (
    at_load,
    covering,
    jittered,
    load_workload,
    offered_load,
    sped_up,
)

H100 = CATALOG["NVIDIA H100 80GB HBM3"]
TRACE = Path(__file__).parents[2] / "fixtures" / "traces" / "openb_pod_list_default.csv"


@pytest.mark.parametrize(
    ("fraction", "first", "count"),
    [(0.1, "1g.10gb", 1), (0.2, "2g.20gb", 1), (0.4, "3g.40gb", 1), (0.5, "4g.40gb", 1),
     (0.6, "7g.80gb", 1), (1.0, "7g.80gb", 1), (4.0, "7g.80gb", 4)],
)  # fmt: skip
def test_a_fraction_asks_the_smallest_profile_that_covers_it(
    fraction: float, first: str, count: int
) -> None:
    assert covering(H100, fraction) == ((first,), count)


def test_the_alibaba_trace_loads_every_gpu_pod_in_arrival_order() -> None:
    pods = load_workload(TRACE, H100)
    assert len(pods) == 7064  # rows with num_gpu > 0
    assert pods[0].arrival_s == 0
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(pods))
    eight = [p for p in pods if p.count == 8]
    assert eight
    assert eight[0].profiles == ("7g.80gb",)
    assert eight[0].size == ">1 GPU"


def test_the_simple_csv_and_json_formats(tmp_path: Path) -> None:
    csv_path = tmp_path / "pods.csv"
    csv_path.write_text(
        "name,arrival_s,duration_s,profile,profiles,gpu_fraction,count,nodes\n"
        "a,0,60,3g.40gb,,,1,\n"
        "b,5,60,,1g.10gb|2g.20gb,,2,node-1|node-2\n"
        "c,9,60,,,0.3,,\n"
    )
    pods = load_workload(csv_path, H100)
    assert [p.name for p in pods] == ["a", "b", "c"]
    assert pods[1].profiles == ("1g.10gb", "2g.20gb")
    assert pods[1].count == 2
    assert pods[1].nodes == frozenset({"node-1", "node-2"})
    assert pods[2].profiles[0] == "3g.40gb"
    json_path = tmp_path / "pods.json"
    json_path.write_text(json.dumps([{"arrivalS": 1, "durationS": 2, "gpuFraction": 2}]))
    (pod,) = load_workload(json_path, H100)
    assert pod.count == 2
    assert pod.profiles == ("7g.80gb",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrival_s,duration_s,profile\n0,10,5g.50gb\n", "row 2.profile: '5g.50gb' is not offered"),
        ("arrival_s,duration_s,profile\nsoon,10,1g.10gb\n", "row 2.v: expected a number"),
        ("arrival_s,duration_s\n0,10\n", "row 2: needs exactly one of profile"),
        ("arrival_s,duration_s,profile,count\n0,10,1g.10gb,0\n", "row 2.count: must be at least 1"),
        ("arrival_s,duration_s,profile,color\n0,10,1g.10gb,red\n", "row 2.color: unknown field"),
        ("arrival_s,duration_s,profile\n", "holds no GPU pod"),
        (
            "name,arrival_s,duration_s,profile\na,0,1,1g.10gb\na,1,1,1g.10gb\n",
            "two pods are named 'a'",
        ),
    ],
)
def test_bad_trace_rows_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(")):
        load_workload(path, H100)


def test_load_scaling_hits_the_offered_load_and_keeps_durations() -> None:
    pods = load_workload(TRACE, H100)[1000:1400]
    capacity = 5 * 8 * 7
    for load in (0.8, 1.05):
        scaled = at_load(pods, capacity, load)
        assert offered_load(scaled, capacity) == pytest.approx(load, rel=1e-3)
        assert [p.duration_s for p in scaled] == [p.duration_s for p in pods]


def test_jitter_is_a_replication_per_seed_and_speedup_divides_time() -> None:
    pods = load_workload(TRACE, H100)[:200]
    assert jittered(pods, 1) == jittered(pods, 1)
    assert jittered(pods, 1) != jittered(pods, 2)
    assert sorted(p.name for p in jittered(pods, 3)) == sorted(p.name for p in pods)
    fast = sped_up(pods, 10)
    assert fast[5].arrival_s == pods[5].arrival_s / 10
    assert fast[5].duration_s == pods[5].duration_s / 10
