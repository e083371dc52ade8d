"""What a simulation reports: per policy, each measure's mean over seeds ± its spread (the
sample standard deviation), the table, the JSON, and the ratio line.

The ratio line compares migpart's mean wait with each other policy's, seed by seed (both ran
on the same arrivals). A ratio is called a win or a loss only when every seed agrees and the
mean is more than one spread away from 1; otherwise it is a tie, a difference within the noise
of the arrival jitter.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from migpart.sim.engine import Outcome
from migpart.sim.run import SimResult
from migpart.sim.workload import SIZE_CLASSES

_DAY_S = 86_400.0


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def measures(o: Outcome) -> dict[str, float]:
    """One run's numbers, as the table and JSON name them."""
    out = {
        "served": float(o.served),
        "pods": float(o.pods),
        "meanWaitS": _mean(o.waits_s),
        "p50WaitS": _quantile(o.waits_s, 0.5),
        "p95WaitS": _quantile(o.waits_s, 0.95),
        "utilisation": o.utilisation,
        "creates": float(o.creates),
        "destroys": float(o.destroys),
        "plannerCpuS": o.planner_cpu_s,
        "plannerCpuSPerDay": o.planner_cpu_s / max(o.span_s / _DAY_S, 1e-9),
    }
    for size in SIZE_CLASSES:
        waits = [w for w, s in zip(o.waits_s, o.sizes, strict=True) if s == size]
        out[f"meanWaitS[{size}]"] = _mean(waits)
    return out


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for a single value)."""
    mean = _mean(values)
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def summary(result: SimResult) -> dict[str, dict[str, tuple[float, float]]]:
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, runs in result.outcomes.items():
        per_run = [measures(o) for o in runs]
        out[name] = {k: spread([m[k] for m in per_run]) for k in per_run[0]}
    return out


def ratios(result: SimResult, measure: str = "meanWaitS") -> dict[str, tuple[float, float, str]]:
    """migpart's `measure` over each other policy's, per seed: (mean, spread, verdict)."""
    if "migpart" not in result.outcomes:
        return {}
    ours = [measures(o)[measure] for o in result.outcomes["migpart"]]
    out: dict[str, tuple[float, float, str]] = {}
    for name, runs in result.outcomes.items():
        if name == "migpart":
            continue
        theirs = [measures(o)[measure] for o in runs]
        per_seed = [_ratio(a, b) for a, b in zip(ours, theirs, strict=True)]
        mean, sd = spread(per_seed)
        out[name] = (mean, sd, verdict(per_seed))
    return out


def _ratio(a: float, b: float) -> float:
    if b <= 0:
        return 1.0 if a <= 0 else math.inf
    return a / b


def verdict(per_seed: Sequence[float]) -> str:
    """'win' (below 1), 'loss' or 'tie': a win or loss needs every seed on its side and the
    mean more than one spread from 1."""
    mean, sd = spread(per_seed)
    if all(r < 1 for r in per_seed) and mean + sd < 1:
        return "win"
    if all(r > 1 for r in per_seed) and mean - sd > 1:
        return "loss"
    return "tie"


def _fmt(value: tuple[float, float], digits: int = 0, seeds: int = 1) -> str:
    mean, sd = value
    if seeds <= 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f}±{sd:.{digits}f}"


def table(result: SimResult) -> str:
    """The text table, one row per policy."""
    seeds = result.config.seeds
    rows = summary(result)
    columns = [
        ("policy", None, 0),
        ("served", "served", 0),
        ("mean wait s", "meanWaitS", 0),
        ("p50", "p50WaitS", 0),
        ("p95", "p95WaitS", 0),
        *[(f"mean {s}", f"meanWaitS[{s}]", 0) for s in SIZE_CLASSES],
        ("util %", "utilisation", 1),
        ("creates", "creates", 0),
        ("destroys", "destroys", 0),
        ("planner cpu s/day", "plannerCpuSPerDay", 2),
    ]
    lines: list[list[str]] = [[c[0] for c in columns]]
    for name, values in rows.items():
        cells = [name]
        for _, key, digits in columns[1:]:
            assert key is not None
            mean, sd = values[key]
            if key == "utilisation":
                mean, sd = mean * 100, sd * 100
            cells.append(_fmt((mean, sd), digits, seeds))
        lines.append(cells)
    widths = [max(len(row[i]) for row in lines) for i in range(len(columns))]
    text = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in lines
    ]
    return "\n".join(text)


def ratio_line(result: SimResult) -> str:
    found = ratios(result)
    if not found:
        return "ratio: no migpart run to compare"
    seeds = result.config.seeds
    parts = [
        f"vs {name} {mean:.2f}x" + (f"±{sd:.2f}" if seeds > 1 else "") + f" ({word})"
        for name, (mean, sd, word) in found.items()
    ]
    return f"migpart mean wait over {seeds} seed(s): " + ", ".join(parts)


def as_json(result: SimResult) -> dict[str, Any]:
    config = result.config
    return {
        "config": {
            "model": config.table.model,
            "nodes": config.nodes,
            "gpusPerNode": config.gpus_per_node,
            "seeds": config.seeds,
            "load": config.load,
            "speedup": config.speedup,
            "batchWindowS": config.migpart.batch_window_s,
            "actuationS": config.actuation_s,
            "maxConcurrentNodes": config.migpart.max_concurrent_nodes,
        },
        "bestStaticMix": None
        if result.best_static_mix is None
        else {
            "wholeNodes": result.best_static_mix.whole_nodes,
            "perGpu": dict(result.best_static_mix.per_gpu),
        },
        "policies": {
            name: {k: {"mean": m, "spread": s} for k, (m, s) in values.items()}
            for name, values in summary(result).items()
        },
        "perSeed": {name: [measures(o) for o in runs] for name, runs in result.outcomes.items()},
        "ratios": {
            name: {"mean": m, "spread": s, "verdict": v}
            for name, (m, s, v) in ratios(result).items()
        },
    }
