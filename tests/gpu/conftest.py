"""Read-only NVML tests on a real NVIDIA GPU; collected only with MIGPART_GPU=1.

Without the variable the directory is not collected at all (instead of reporting skipped
tests in every CI run). These tests never change MIG mode and never create or destroy
instances: they read inventory, MIG mode, profile tables, placements and instance listings.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from migpart.agent.nvml import RealNvml

collect_ignore_glob = [] if os.environ.get("MIGPART_GPU") == "1" else ["test_*.py"]


@pytest.fixture
async def real() -> AsyncIterator[RealNvml]:
    from migpart.agent.nvml import RealNvml

    backend = await RealNvml.open()
    yield backend
    await backend.close()
