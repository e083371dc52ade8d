"""The pods a simulation replays: read from a trace, scaled to an offered load, jittered.

Two inputs:

- the Alibaba Cluster Trace Program's `openb_pod_list_*.csv` (cluster-trace-gpu-v2023, the trace
  of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
  Gradient Descent", USENIX ATC '23), recognised by its `gpu_milli` column: a pod with one GPU
  asks `gpu_milli` thousandths of it, several GPUs are that many whole GPUs on one node; pods
  without a GPU are skipped;
- a simple CSV (a header row) or JSON (a list of objects) with, per pod: `arrival_s`
  (`arrivalS`), `duration_s` (`durationS`), one of `profile`, `profiles` (separated by `|`, in
  order of preference) or `gpu_fraction` (`gpuFraction`), and optionally `count` (default 1),
  `nodes` (node names separated by `|`) and `name`.

A GPU fraction becomes the smallest profile with at least that share of the GPU's compute
slices (what a DRA claim for a MIG device names); 1 or more asks for that many whole GPUs. A
list of profiles accepts any of them, in order of preference. The request's size is the
compute slices its smallest profile takes, times its count.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from migpart.errors import InvalidInput
from migpart.mig import ModelTable

SIZE_CLASSES = ("<1 GPU", "1 GPU", ">1 GPU")


@dataclass(frozen=True, slots=True)
class SimPod:
    """One pod: `count` devices on one node, each of any of `profiles` (preference order)."""

    name: str
    arrival_s: float
    duration_s: float
    profiles: tuple[str, ...]
    count: int
    slices: int
    size: str
    nodes: frozenset[str] | None = None


def plain_profiles(table: ModelTable) -> list[str]:
    """The profiles a request may name by size, smallest first: never the media-extension
    variants (one per GPU)."""
    plain = [p for p in table.profiles if "+" not in p.name]
    plain.sort(key=lambda p: (p.compute_slices, p.memory_slices, p.name))
    return [p.name for p in plain]


def covering(table: ModelTable, fraction: float) -> tuple[tuple[str, ...], int]:
    """(profiles, count) for a GPU fraction: below 1, the smallest profile with at least that
    share of compute; 1 or more, that many whole GPUs (rounded up)."""
    names = plain_profiles(table)
    if fraction >= 1 - 1e-9:
        return (names[-1],), math.ceil(fraction - 1e-9)
    share = fraction * table.compute_slices
    fits = [n for n in names if table.profile(n).compute_slices >= share - 1e-9]
    return (fits[0],), 1


def make_pod(
    table: ModelTable,
    name: str,
    arrival_s: float,
    duration_s: float,
    profiles: tuple[str, ...],
    count: int,
    nodes: frozenset[str] | None = None,
) -> SimPod:
    smallest = min(table.profile(p).compute_slices for p in profiles)
    slices = smallest * count
    whole = table.compute_slices
    size = SIZE_CLASSES[0] if slices < whole else SIZE_CLASSES[1 if slices == whole else 2]
    return SimPod(name, arrival_s, duration_s, profiles, count, slices, size, nodes)


def load_workload(path: Path, table: ModelTable) -> list[SimPod]:
    """The pods of a trace file, by arrival; InvalidInput names the row and field at fault."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput("--trace", f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput("--trace", f"{path} is not UTF-8 text: {exc.reason}") from None
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                "--trace", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        if not isinstance(rows, list):
            raise InvalidInput("--trace", "expected a JSON list of pods")
        pods = [_simple(table, row, f"pods[{i}]") for i, row in enumerate(rows)]
    else:
        reader = csv.DictReader(text.splitlines())
        fields = set(reader.fieldnames or ())
        if "gpu_milli" in fields:
            pods = _alibaba(table, reader)
        else:
            pods = [_simple(table, row, f"row {i + 2}") for i, row in enumerate(reader)]
    if not pods:
        raise InvalidInput("--trace", f"{path} holds no GPU pod")
    seen: set[str] = set()
    for pod in pods:
        if pod.name in seen:
            raise InvalidInput("--trace", f"two pods are named {pod.name!r}")
        seen.add(pod.name)
    pods.sort(key=lambda p: (p.arrival_s, p.name))
    return pods


def _alibaba(table: ModelTable, rows: Iterable[Mapping[str, str]]) -> list[SimPod]:
    pods: list[SimPod] = []
    for i, row in enumerate(rows):
        where = f"row {i + 2}"
        num_gpu = int(_number(row, "num_gpu", where))
        if num_gpu <= 0:
            continue
        milli = _number(row, "gpu_milli", where)
        created = _number(row, "creation_time", where)
        deleted = _number(row, "deletion_time", where)
        fraction = float(num_gpu) if num_gpu > 1 else max(milli, 1.0) / 1000
        profiles, count = covering(table, fraction)
        name = row.get("name") or f"pod-{i}"
        pods.append(make_pod(table, name, created, max(1.0, deleted - created), profiles, count))
    if pods:
        first = min(p.arrival_s for p in pods)
        pods = [replace(p, arrival_s=p.arrival_s - first) for p in pods]
    return pods


def _number(row: Mapping[str, Any], key: str, where: str) -> float:
    raw = row.get(key)
    if raw is None or raw == "":
        raise InvalidInput(f"{where}.{key}", "missing")
    if isinstance(raw, bool):
        raise InvalidInput(f"{where}.{key}", "expected a number, got a boolean")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}.{key}", f"expected a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{where}.{key}", f"must be a finite number >= 0, got {raw!r}")
    return value


def _names(raw: object, where: str) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else str(raw).split("|")
    names = tuple(str(n).strip() for n in items if str(n).strip())
    if not names:
        raise InvalidInput(where, "must name at least one")
    return names


def _pick(row: Mapping[str, Any], *keys: str) -> object:
    for key in keys:
        if key in row and row[key] not in (None, ""):
            return row[key]
    return None


def _simple(table: ModelTable, row: object, where: str) -> SimPod:
    if not isinstance(row, Mapping):
        raise InvalidInput(where, "expected an object")
    known = {"name", "arrival_s", "arrivalS", "duration_s", "durationS", "profile", "profiles"}
    known |= {"gpu_fraction", "gpuFraction", "count", "nodes"}
    for key in row:
        if key not in known:
            raise InvalidInput(f"{where}.{key}", "unknown field")
    arrival = _number({"v": _pick(row, "arrival_s", "arrivalS")}, "v", where)
    duration = _number({"v": _pick(row, "duration_s", "durationS")}, "v", where)
    given = [k for k in ("profile", "profiles", "gpu_fraction", "gpuFraction") if _pick(row, k)]
    if len(given) != 1:
        raise InvalidInput(where, "needs exactly one of profile, profiles or gpu_fraction")
    count = 1
    if _pick(row, "count") is not None:
        count = int(_number(row, "count", where))
        if count < 1:
            raise InvalidInput(f"{where}.count", "must be at least 1")
    if given[0] in ("gpu_fraction", "gpuFraction"):
        fraction = _number(row, given[0], where)
        if fraction <= 0:
            raise InvalidInput(f"{where}.{given[0]}", "must be above 0")
        profiles, whole = covering(table, fraction)
        count *= whole
    else:
        profiles = _names(row[given[0]], f"{where}.{given[0]}")
        for p in profiles:
            if not table.has(p):
                offered = ", ".join(table.profile_names)
                raise InvalidInput(
                    f"{where}.{given[0]}", f"{p!r} is not offered by {table.model} ({offered})"
                )
    nodes_raw = _pick(row, "nodes")
    nodes = None if nodes_raw is None else frozenset(_names(nodes_raw, f"{where}.nodes"))
    name = str(_pick(row, "name") or f"pod-{where.split()[-1].strip('pods[]')}")
    return make_pod(table, name, arrival, max(duration, 1e-3), profiles, count, nodes)


def offered_load(pods: Sequence[SimPod], capacity_slices: int) -> float:
    """The share of the cluster's compute slices the pods would keep busy if each started on
    arrival, averaged over the arrival window (`arrival_window`)."""
    lo, hi = arrival_window(pods)
    if hi <= lo or capacity_slices <= 0:
        return math.inf
    busy = 0.0
    for p in pods:
        end = min(hi, p.arrival_s + p.duration_s)
        if end > p.arrival_s and p.arrival_s < hi:
            busy += p.slices * (end - max(lo, p.arrival_s))
    return busy / (capacity_slices * (hi - lo))


def arrival_window(pods: Sequence[SimPod]) -> tuple[float, float]:
    """From the 1st- to the 99th-percentile arrival: the Alibaba trace's first 33 pods are
    spread over 115 days before the rest arrive in 34, and an average over those days would
    measure a cluster with nobody in it."""
    arrivals = sorted(p.arrival_s for p in pods)
    last = len(arrivals) - 1
    return arrivals[int(0.01 * last)], arrivals[int(0.99 * last)]


def at_load(pods: Sequence[SimPod], capacity_slices: int, load: float) -> list[SimPod]:
    """The pods with their arrival times scaled (durations kept) so that `offered_load` is
    `load`: a higher load packs the same pods into less time."""
    if load <= 0:
        raise InvalidInput("--load", f"must be above 0, got {load}")
    lo_f, hi_f = 1e-6, 1e6
    for _ in range(80):
        mid = math.sqrt(lo_f * hi_f)
        if offered_load(_scaled(pods, mid), capacity_slices) > load:
            lo_f = mid
        else:
            hi_f = mid
    return _scaled(pods, math.sqrt(lo_f * hi_f))


def _scaled(pods: Sequence[SimPod], factor: float) -> list[SimPod]:
    return [replace(p, arrival_s=p.arrival_s * factor) for p in pods]


def sped_up(pods: Sequence[SimPod], speedup: float) -> list[SimPod]:
    """Arrivals and durations divided by `speedup`: the same load in less time, so the fixed
    latencies (batch window, actuation) weigh more."""
    if speedup <= 0:
        raise InvalidInput("--speedup", f"must be above 0, got {speedup}")
    return [
        replace(p, arrival_s=p.arrival_s / speedup, duration_s=p.duration_s / speedup) for p in pods
    ]


def jittered(pods: Sequence[SimPod], seed: int) -> list[SimPod]:
    """The pods with each arrival moved by up to one median inter-arrival gap either way
    (uniformly, from `seed`): a replication of the same workload."""
    if len(pods) < 2:
        return list(pods)
    rng = random.Random(seed)
    arrivals = sorted(p.arrival_s for p in pods)
    gap = statistics.median(b - a for a, b in itertools.pairwise(arrivals))
    moved = [replace(p, arrival_s=max(0.0, p.arrival_s + rng.uniform(-gap, gap))) for p in pods]
    moved.sort(key=lambda p: (p.arrival_s, p.name))
    return moved
