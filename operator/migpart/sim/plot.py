"""`--plot DIR`: PNGs of a simulation with matplotlib (the optional `sim` extra), imported only
here and only when asked for.

Three figures, the first seed of each policy: the CDF of waits, the cluster's utilisation over
time and the pending pods over time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from migpart.errors import InvalidInput
from migpart.sim.run import SimResult

FILES = ("wait_cdf.png", "utilisation.png", "pending.png")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise InvalidInput(
            "--plot",
            "needs matplotlib, which is not installed: pip install 'migpart[sim]' "
            "(or pip install matplotlib)",
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(result: SimResult, directory: Path) -> list[Path]:
    plt = _pyplot()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInput("--plot", f"cannot create {directory}: {exc.strerror or exc}") from None
    capacity = result.config.capacity_slices
    written = []
    title = (
        f"{result.config.nodes} nodes x {result.config.gpus_per_node} {result.config.table.model}"
    )
    if result.config.load is not None:
        title += f", load {result.config.load:g}"

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, runs in result.outcomes.items():
        waits = sorted(runs[0].waits_s)
        n = len(waits)
        ax.step([max(w, 0.1) for w in waits], [(k + 1) / n for k in range(n)], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("wait (s, log; 0 drawn at 0.1)")
    ax.set_ylabel("share of pods")
    ax.set_title(f"Wait CDF: {title}")
    ax.legend()
    written.append(_save(fig, directory / FILES[0], plt))

    for index, (ylabel, column, scale) in enumerate(
        (("slice utilisation", 1, 1 / capacity), ("pending pods", 2, 1.0)), start=1
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, runs in result.outcomes.items():
            points = runs[0].timeline
            ax.plot(
                [p[0] / 3600 for p in points],
                [p[column] * scale for p in points],
                label=name,
                linewidth=0.8,
            )
        ax.set_xlabel("simulated time (h)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{ylabel.capitalize()}: {title}")
        ax.legend()
        written.append(_save(fig, directory / FILES[index], plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> Path:
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InvalidInput("--plot", f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path
