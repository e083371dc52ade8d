"""Backends the shared-behaviour suite runs against: the simulator always, real NVML on demand.

The real backend joins the parameter list only when MIGPART_GPU=1, so that ordinary CI runs
neither need a GPU nor report skipped tests.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from migpart.agent.checkpoint import Checkpoint
from migpart.agent.simulator import SimulatedNvml

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from migpart.agent.backend import NvmlBackend

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"

READ_ONLY_BACKENDS = ["sim"] + (
    [pytest.param("real", marks=pytest.mark.gpu)] if os.environ.get("MIGPART_GPU") == "1" else []
)


@pytest.fixture(params=READ_ONLY_BACKENDS)
async def any_backend(request: pytest.FixtureRequest) -> AsyncIterator[NvmlBackend]:
    """A backend for read-only checks (inventory, tables, listing)."""
    if request.param == "real":
        from migpart.agent.nvml import RealNvml

        real = await RealNvml.open()
        yield real
        await real.close()
    else:
        yield SimulatedNvml([(H100, 2), (H200, 1)], node="node-a")


@pytest.fixture
def sim() -> SimulatedNvml:
    return SimulatedNvml([(H100, 2)], node="node-a")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Checkpoint:
    return Checkpoint(tmp_path / "state" / "checkpoint.json")
