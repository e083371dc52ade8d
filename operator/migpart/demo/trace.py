"""Pods of the Alibaba GPU trace as MIG requests.

Source: Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 (`openb_pod_list_default.csv`),
described in Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC '23. Each task asks `num_gpu` GPUs; a task with one
GPU may ask a fraction of it (`gpu_milli`). A fraction becomes the smallest MIG profile with at
least that share of the GPU's compute slices; several whole GPUs become that many full-GPU
instances on one node.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from migpart.mig import ModelTable


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    profile: str
    count: int
    created_s: float
    duration_s: float


def profile_for(table: ModelTable, num_gpu: int, gpu_milli: int) -> tuple[str, int]:
    """(profile, count) for one trace task on a GPU model."""
    # Never the media-extension variants: they exist once per GPU.
    plain = [p for p in table.profiles if "+" not in p.name]
    whole = max(plain, key=lambda p: (p.compute_slices, p.memory_mib))
    if num_gpu > 1 or gpu_milli >= 1000:
        return whole.name, max(num_gpu, 1)
    share = gpu_milli / 1000 * table.compute_slices
    fitting = [p for p in plain if p.compute_slices >= share - 1e-9]
    best = min(fitting, key=lambda p: (p.compute_slices, p.memory_mib, p.name))
    return best.name, 1


def load_trace(
    path: Path, table: ModelTable, *, offset: int = 0, limit: int | None = None
) -> list[TracePod]:
    """GPU tasks of the trace from row `offset` on, in creation order, times relative to the
    first one."""
    pods: list[TracePod] = []
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["num_gpu"]) > 0]
    rows.sort(key=lambda r: int(r["creation_time"]))
    rows = rows[offset : None if limit is None else offset + limit]
    if not rows:
        return pods
    t0 = int(rows[0]["creation_time"])
    for row in rows:
        profile, count = profile_for(table, int(row["num_gpu"]), int(row["gpu_milli"]))
        created = int(row["creation_time"]) - t0
        duration = max(1, int(row["deletion_time"]) - int(row["creation_time"]))
        pods.append(TracePod(row["name"], profile, count, float(created), float(duration)))
    return pods


def accelerate(
    pods: list[TracePod], span_s: float, *, min_life_s: float, max_life_s: float
) -> list[TracePod]:
    """Compress arrivals into `span_s` seconds; lifetimes scaled alike and clamped."""
    if not pods:
        return []
    last = max(p.created_s for p in pods) or 1.0
    factor = span_s / last
    return [
        TracePod(
            p.name,
            p.profile,
            p.count,
            p.created_s * factor,
            min(max_life_s, max(min_life_s, p.duration_s * factor)),
        )
        for p in pods
    ]
