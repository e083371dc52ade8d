"""Runs: every policy on the same arrivals, seed by seed, and the best fixed mix of layouts.

`simulate(config, pods)` builds each policy fresh per seed (the same jittered arrivals for all
policies of a seed) and returns their `Outcome`s. `best-static` is a hindsight search over
static layouts: some nodes whole GPUs (for multi-GPU pods), the others one mix of per-GPU shapes
(`layouts.shapes`), started from the mix that matches the workload's demand by size and
improved one node or one GPU at a time on the first seed, then run on every seed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from migpart.errors import InvalidInput
from migpart.mig import ModelTable
from migpart.planning.listing import name_order
from migpart.planning.model import PolicyView
from migpart.planning.overtime import AGE_S
from migpart.sim.cluster import SimCluster
from migpart.sim.engine import Engine, Outcome, Policy
from migpart.sim.layouts import StaticLayout, balanced, shapes, uniform, whole
from migpart.sim.migpart import Migpart, MigpartSettings
from migpart.sim.offer import Offer
from migpart.sim.policies import FirstFit, Static, whole_gpu_pods
from migpart.sim.workload import SimPod, at_load, jittered, sped_up

BUILTIN = ("mig-off", "all-7g", "all-balanced", "best-static", "first-fit", "migpart", "offer")
# Policies run only when named (not by `--policies all`): `offer` in NVIDIA's listing order,
# to compare the orders (docs/offer-simulation.md).
VARIANTS = ("offer-name-order",)
# Every policy name `--policies` takes, besides the static ones.
NAMED = (*BUILTIN, *VARIANTS)
# Candidate mixes the best-static search may try, the first included.
_SEARCH_EVALUATIONS = 24
_SEARCH_SHAPES = ("7", "4+3", "3+3", "3+2+1+1", "4+2+1", "2+2+2+1", "1+1+1+1+1+1+1")
# migpart as `migpart simulate` runs it unless told otherwise: ageing on, holds at half used.
DEFAULT_MIGPART = MigpartSettings(age_s=AGE_S, hold_used=0.5)


@dataclass
class SimConfig:
    table: ModelTable
    nodes: int
    gpus_per_node: int = 8
    policies: tuple[str, ...] = BUILTIN
    static: dict[str, StaticLayout] = field(default_factory=dict)
    seeds: int = 1
    load: float | None = None
    speedup: float = 1.0
    actuation_s: float = 5.0
    planner_policy: PolicyView = field(default_factory=PolicyView)
    migpart: MigpartSettings = DEFAULT_MIGPART

    @property
    def capacity_slices(self) -> int:
        return self.nodes * self.gpus_per_node * self.table.compute_slices


@dataclass(frozen=True)
class StaticMix:
    """`whole_nodes` nodes of whole GPUs; every other node has `per_gpu[shape]` GPUs of each
    shape."""

    whole_nodes: int
    per_gpu: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        mix = ", ".join(f"{n} x {s}" for s, n in self.per_gpu)
        return f"{self.whole_nodes} node(s) all 7, the others {mix}"


@dataclass
class SimResult:
    config: SimConfig
    outcomes: dict[str, list[Outcome]]
    best_static_mix: StaticMix | None = None


Progress = Callable[[str, float], None]


def prepared(config: SimConfig, pods: Sequence[SimPod]) -> list[SimPod]:
    """The trace's pods at the configured load and speedup (before jitter)."""
    out = list(pods)
    if config.load is not None:
        out = at_load(out, config.capacity_slices, config.load)
    if config.speedup != 1.0:
        out = sped_up(out, config.speedup)
    return out


def simulate(
    config: SimConfig, pods: Sequence[SimPod], progress: Progress | None = None
) -> SimResult:
    if config.nodes < 1 or config.gpus_per_node < 1:
        raise InvalidInput("--nodes", "needs at least one node with at least one GPU")
    if config.seeds < 1:
        raise InvalidInput("--seeds", f"must be at least 1, got {config.seeds}")
    base = prepared(config, pods)
    outcomes: dict[str, list[Outcome]] = {name: [] for name in config.policies}
    best_mix: StaticMix | None = None
    for seed in range(1, config.seeds + 1):
        arrivals = jittered(base, seed)
        for name in config.policies:
            if name == "best-static" and best_mix is None:
                best_mix = search_static(config, arrivals, progress)
            policy, workload = make_policy(config, name, arrivals, best_mix)
            step = None
            if progress is not None:

                def step(fraction: float, label: str = f"{name} seed {seed}") -> None:
                    progress(label, fraction)

            outcomes[name].append(Engine(empty_cluster(config), workload, policy, step).run())
    return SimResult(config, outcomes, best_mix)


def empty_cluster(config: SimConfig) -> SimCluster:
    """The configured cluster with no instance on any GPU."""
    return SimCluster(config.table, config.nodes, config.gpus_per_node)


def make_policy(
    config: SimConfig, name: str, pods: Sequence[SimPod], best_mix: StaticMix | None = None
) -> tuple[Policy, Sequence[SimPod]]:
    """A fresh policy by name, and the pods as it sees them (MIG off: whole GPUs)."""
    table, gpus = config.table, config.gpus_per_node
    if name == "mig-off":
        return Static(name, uniform(table, whole(table), gpus)), whole_gpu_pods(table, pods)
    if name == "all-7g":
        return Static(name, uniform(table, whole(table), gpus)), pods
    if name == "all-balanced":
        return Static(name, uniform(table, balanced(table), gpus)), pods
    if name == "best-static":
        assert best_mix is not None
        return _mixed(config, name, best_mix), pods
    if name == "first-fit":
        return FirstFit(config.actuation_s), pods
    if name == "migpart":
        return Migpart(config.planner_policy, config.actuation_s, config.migpart), pods
    if name == "offer":
        return Offer(config.actuation_s, config.planner_policy), pods
    if name == "offer-name-order":
        return Offer(config.actuation_s, config.planner_policy, name_order, name), pods
    if name in config.static:
        return Static(name, config.static[name]), pods
    known = ", ".join([*NAMED, *config.static])
    raise InvalidInput("--policies", f"unknown policy {name!r} (known: {known})")


def mix_layout(table: ModelTable, mix: dict[str, int]) -> StaticLayout:
    """A node's layout from shapes and how many GPUs have each, the largest pieces first."""
    known = shapes(table)
    order = sorted(mix, key=lambda s: [-int(x) for x in s.split("+")])
    return tuple(known[s] for s in order for _ in range(mix[s]))


def _mixed(config: SimConfig, name: str, mix: StaticMix) -> Static:
    table = config.table
    return Static(
        name,
        mix_layout(table, dict(mix.per_gpu)),
        mix.whole_nodes,
        uniform(table, whole(table), config.gpus_per_node),
    )


def _mean_wait(outcome: Outcome) -> float:
    return sum(outcome.waits_s) / max(1, len(outcome.waits_s))


def search_static(
    config: SimConfig, pods: Sequence[SimPod], progress: Progress | None = None
) -> StaticMix:
    """The static mix with the least mean wait on `pods` (hill climbing from the
    demand-matched mix, one node or one GPU changed at a time, `_SEARCH_EVALUATIONS` runs at
    most)."""
    table, gpus = config.table, config.gpus_per_node
    known = shapes(table)
    candidates = [s for s in _SEARCH_SHAPES if s in known] or list(known)[:1]
    cache: dict[StaticMix, float] = {}

    def key(whole_nodes: int, mix: Counter[str]) -> StaticMix:
        return StaticMix(whole_nodes, tuple(sorted((s, n) for s, n in mix.items() if n > 0)))

    def score(m: StaticMix) -> float:
        if m not in cache:
            run = Engine(empty_cluster(config), pods, _mixed(config, "best-static", m)).run()
            cache[m] = _mean_wait(run)
            if progress is not None:
                progress("best-static search", len(cache) / _SEARCH_EVALUATIONS)
        return cache[m]

    multi = any(p.count > 1 for p in pods)
    whole_nodes = min(1 if multi else 0, config.nodes)
    mix = _demand_mix(table, pods, gpus, candidates)
    best = key(whole_nodes, mix)
    best_score = score(best)
    improved = True
    while improved and len(cache) < _SEARCH_EVALUATIONS:
        improved = False
        neighbours = [
            key(n, Counter(dict(best.per_gpu)))
            for n in (best.whole_nodes + 1, best.whole_nodes - 1)
            if 0 <= n <= config.nodes
        ]
        for give, _ in best.per_gpu:
            for take in candidates:
                if take != give:
                    changed = Counter(dict(best.per_gpu))
                    changed[give] -= 1
                    changed[take] += 1
                    neighbours.append(key(best.whole_nodes, changed))
        for candidate in neighbours:
            if len(cache) >= _SEARCH_EVALUATIONS:
                break
            s = score(candidate)
            if s < best_score:
                best, best_score, improved = candidate, s, True
                break
    return best


def _demand_mix(
    table: ModelTable, pods: Sequence[SimPod], gpus: int, candidates: Sequence[str]
) -> Counter[str]:
    """GPUs per shape in proportion to the slice-seconds asked of each size: whole-GPU demand
    gets `7` GPUs, the rest is covered by the candidate shape made of the sizes asked most."""
    by_size: dict[int, float] = {}
    for p in pods:
        size = table.profile(p.profiles[0]).compute_slices
        by_size[size] = by_size.get(size, 0.0) + size * p.count * p.duration_s
    total = sum(by_size.values()) or 1.0
    whole_share = by_size.get(table.compute_slices, 0.0) / total
    full = candidates[0]
    n_whole = min(gpus, max(0, round(whole_share * gpus)))
    mix: Counter[str] = Counter({full: n_whole})
    if n_whole < gpus:
        parts = [s for s in candidates[1:]]

        def fit(shape: str) -> float:
            sizes = Counter(int(x) for x in shape.split("+"))
            return sum(by_size.get(s, 0.0) * sizes[s] for s in sizes)

        mix[max(parts, key=fit)] += gpus - n_whole
    return mix
