"""What the operator will not plan, and why, in words that name the culprit.

A MigNode's status comes from its agent, which may be buggy or compromised. It may report
instances that overlap, profiles its GPU does not offer, GPU indexes that no spec can name,
more GPUs or instances than a node has, or a profile table that contradicts itself. The planner
trusts the status it is given, so a node whose status is impossible is left out of every policy
(`node_problem`): nothing is planned on it and no spec is written to it, while every other node
is served as before. The reason is shown in the status of each policy whose selector matches
the node (condition `NodesExcluded`) and as a Warning event `NodeExcluded` on the MigNode. A
node with more than MAX_GPUS MIG GPUs is left out the same way: its spec could not list them.

A claim whose count is more than any node of its policy can hold would sit in every plan's
unsatisfied list without a word (a pod's devices all come from its one node); `oversized`
reports it as Unsatisfiable instead, with the largest node's bound.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from migpart.api.models import (
    MAX_GPU_INDEX,
    MAX_GPUS,
    MAX_INSTANCES_PER_GPU,
    MAX_START,
    GpuStatus,
    MigNode,
)
from migpart.mig import Instance, ModelTable, layout_problems

if TYPE_CHECKING:
    from migpart.api.models import GpuPartitionPolicy
    from migpart.controller.rounds.scope import Scope
    from migpart.controller.watching.indexes import Cluster
    from migpart.planning.model import Request

# A status with more of these than a node can have is not read further (a huge status).
MAX_REPORTED_GPUS = MAX_GPU_INDEX + 1
MAX_REPORTED_PROFILES = 64
MAX_SLICES = MAX_START + 1


def node_problem(node: MigNode, tables: dict[str, ModelTable] | None = None) -> str | None:
    """Why the planner must not use this node's status, or None when it is sound. `tables`,
    when given, gets each MIG model's profile table (read once per distinct report: the GPUs
    of a model report the same table, and each MigNode event carries all of them)."""
    status = node.status
    if status is None:
        return None
    if len(status.gpus) > MAX_REPORTED_GPUS:
        return f"status reports {len(status.gpus)} GPUs; a node has at most {MAX_REPORTED_GPUS}"
    mig = [g for g in status.gpus if g.mig_enabled]
    if len(mig) > MAX_GPUS:
        return (
            f"{len(mig)} MIG GPUs; a MigNode spec lists at most {MAX_GPUS}, so migpart cannot"
            " repartition this node"
        )
    seen: dict[str, tuple[GpuStatus, ModelTable]] = {}
    for gpu in mig:
        known = seen.get(gpu.model)
        if known is not None and _same_report(gpu, known[0]):
            table: ModelTable | None = known[1]
        else:
            table = gpu.table() if len(gpu.profiles) <= MAX_REPORTED_PROFILES else None
        problem = gpu_problem(gpu, table)
        if problem is not None:
            return f"GPU {gpu.index}: {problem}"
        assert table is not None  # a table over the limit is a problem
        first, first_table = seen.setdefault(gpu.model, (gpu, table))
        if tables is not None:
            tables.setdefault(gpu.model, first_table)
        if first_table is not table and first_table != table:
            return (
                f"GPUs {first.index} and {gpu.index} are both {gpu.model} but report different"
                " profile tables"
            )
    return None


def _same_report(gpu: GpuStatus, other: GpuStatus) -> bool:
    """Whether `gpu.table()` would equal `other.table()` (a fifth of the cost of making it)."""
    return (
        gpu.model == other.model
        and gpu.compute_slices == other.compute_slices
        and gpu.memory_slices == other.memory_slices
        and gpu.profiles == other.profiles
    )


def gpu_problem(gpu: GpuStatus, table: ModelTable | None) -> str | None:
    """Why one MIG GPU's reported table (`gpu.table()`, None when it lists too many profiles
    to read) or instances are impossible, or None."""
    if gpu.index > MAX_GPU_INDEX:
        return f"index out of range (a MigNode spec names GPUs 0 to {MAX_GPU_INDEX})"
    if table is None:
        return f"{len(gpu.profiles)} profiles reported; at most {MAX_REPORTED_PROFILES} are read"
    problem = _table_problem(table)
    if problem is not None:
        return problem
    if len(gpu.instances) > MAX_INSTANCES_PER_GPU:
        return (
            f"{len(gpu.instances)} instances reported; a GPU holds at most {MAX_INSTANCES_PER_GPU}"
        )
    problems = layout_problems(table, [Instance(i.profile, i.start) for i in gpu.instances])
    return problems[0] if problems else None


@functools.lru_cache(maxsize=64)
def _table_problem(table: ModelTable) -> str | None:
    """Why a reported profile table is impossible, or None. Every GPU of a model reports the
    same table, and every MigNode event carries them all: checked once per distinct table."""
    if not 1 <= table.compute_slices <= MAX_SLICES or not 1 <= table.memory_slices <= MAX_SLICES:
        return (
            f"{table.compute_slices} compute and {table.memory_slices} memory slices are out of"
            f" range (1 to {MAX_SLICES})"
        )
    if not table.profiles:
        return "MIG is enabled but no profile table is reported"
    names: set[str] = set()
    for p in table.profiles:
        if p.name in names:
            return f"profile {p.name} is reported twice"
        names.add(p.name)
        if not (
            1 <= p.compute_slices <= table.compute_slices
            and 1 <= p.memory_slices <= table.memory_slices
            and all(s + p.memory_slices <= table.memory_slices for s in p.placements)
        ):
            return (
                f"profile {p.name} does not fit the GPU's {table.compute_slices} compute and"
                f" {table.memory_slices} memory slices"
            )
    return None


def excluded_for(
    policy: GpuPartitionPolicy, excluded: Mapping[str, str], cluster: Cluster
) -> dict[str, str]:
    """The left-out nodes (name -> why) whose labels `policy`'s node selector matches."""
    out: dict[str, str] = {}
    for name, why in excluded.items():
        body = cluster.mignodes.get(name)
        if body is None:
            continue
        labels = cluster.node_labels.get(name)
        if labels is None:
            labels = (body.get("metadata") or {}).get("labels") or {}
        if policy.spec.node_selector.matches(dict(labels)):
            out[name] = why
    return out


def _gpu_bound(table: ModelTable, profiles: Iterable[str]) -> int:
    """An upper bound on how many instances of `profiles` (mixed) fit on one GPU."""
    offered = [table.profile(p) for p in profiles if table.has(p)]
    if not offered:
        return 0
    return min(
        table.compute_slices // min(p.compute_slices for p in offered),
        table.memory_slices // min(p.memory_slices for p in offered),
        sum(p.max_instances for p in offered),
    )


def oversized(scope: Scope, claims: Mapping[str, Any]) -> Scope:
    """`scope` with the requests that no node of it can hold moved to its unsatisfiable
    claims (bodies from `claims`, by request name).

    The bound is generous (it never refuses a request some layout could serve): per GPU, the
    most instances any mix of the request's profiles could take, summed over the node's GPUs.
    Only requests larger than one GPU's bound pay for the per-node sum.
    """
    tables = scope.tables
    capacity: dict[tuple[str, tuple[str, ...]], int] = {}

    def node_bound(node: MigNode, profiles: tuple[str, ...]) -> int:
        key = (str(node.metadata.get("name", "")), profiles)
        if key not in capacity:
            gpus = node.status.gpus if node.status is not None else []
            capacity[key] = sum(
                _gpu_bound(tables[g.model], profiles)
                for g in gpus
                if g.mig_enabled and g.model in tables
            )
        return capacity[key]

    kept: list[Request] = []
    refused: list[tuple[Any, str]] = []
    for request in scope.demand.requests:
        one_gpu = max((_gpu_bound(t, request.profiles) for t in tables.values()), default=0)
        body = claims.get(request.name)
        if request.count <= one_gpu or request.same_gpu or body is None:
            kept.append(request)
            continue

        def nodes(request: Request = request) -> Iterator[MigNode]:
            allowed = request.nodes
            for n in scope.nodes:
                if allowed is None or str(n.metadata.get("name", "")) in allowed:
                    yield n

        # stop at the first node that can hold it (the usual case): the full sum over every
        # node is only paid for the message of a request that is refused
        if any(request.count <= node_bound(n, request.profiles) for n in nodes()):
            kept.append(request)
            continue
        largest = max((node_bound(n, request.profiles) for n in nodes()), default=0)
        refused.append(
            (
                body,
                f"count {request.count} is more than any node can hold: a pod's devices come"
                f" from one node, and the largest node this claim may use holds at most"
                f" {largest} of {', '.join(request.profiles)}",
            )
        )
    if not refused:
        return scope
    demand = replace(
        scope.demand,
        requests=tuple(kept),
        unsatisfiable=(*scope.demand.unsatisfiable, *refused),
    )
    return replace(scope, demand=demand)
