"""Planner inputs for the planning tests: GPUs, snapshots and requests in one line each, and
the snapshot document `migpart plan` reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from migpart.planning.model import GpuState, InstanceState, NodeState, Request, Snapshot

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
A30 = "NVIDIA A30"
A100 = "NVIDIA A100-SXM4-80GB"


def gpu(node: str, index: int, *instances: tuple[str, int, bool], model: str = H100) -> GpuState:
    return GpuState(node, index, model, tuple(InstanceState(p, s, u) for p, s, u in instances))


def snap(*gpus: GpuState) -> Snapshot:
    nodes: dict[str, list[GpuState]] = {}
    for g in gpus:
        nodes.setdefault(g.node, []).append(g)
    return Snapshot(tuple(NodeState(n, tuple(gs)) for n, gs in nodes.items()))


def req(
    name: str,
    *profiles: str,
    count: int = 1,
    priority: int = 0,
    nodes: frozenset[str] | None = None,
    same_gpu: bool = False,
) -> Request:
    return Request(name, profiles, count, priority, nodes, same_gpu)


EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "snapshot.json"

BASE: dict[str, Any] = {
    "nodes": [
        {
            "name": "n1",
            "gpus": [
                {
                    "index": 0,
                    "model": "NVIDIA H100 80GB HBM3",
                    "instances": [
                        {"profile": "3g.40gb", "start": 0, "used": True},
                        {"profile": "1g.10gb", "start": 4, "used": False},
                    ],
                }
            ],
        }
    ],
    "requests": [{"name": "r", "profiles": ["1g.10gb"], "count": 2, "priority": 1}],
}
