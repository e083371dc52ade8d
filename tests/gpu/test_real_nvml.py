"""What the real backend reads from NVML equals the catalog and what the simulator reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from migpart.agent.reconciler import observe
from migpart.agent.simulator import SimulatedNvml
from migpart.mig import CATALOG, Instance, layout_problems

if TYPE_CHECKING:
    from pathlib import Path

    from migpart.agent.nvml import RealNvml

pytestmark = pytest.mark.gpu


async def test_inventory(real: RealNvml) -> None:
    gpus = await real.gpus()
    assert gpus, "MIGPART_GPU=1 but NVML reports no GPU"
    for g in gpus:
        assert g.uuid.startswith("GPU-")
        assert g.model
        assert g.minor >= 0


async def test_profile_tables_equal_catalog_and_simulator(real: RealNvml) -> None:
    for g in await real.gpus():
        table = await real.profile_table(g.index)
        assert table.profiles, f"GPU {g.index} ({g.model}) reports no MIG profiles"
        if g.model not in CATALOG:
            continue  # nothing to compare with; consistency is checked below
        sim_table = await SimulatedNvml([(g.model, 1)]).profile_table(0)
        assert table == sim_table  # same profiles, same NVML order, field for field
        assert {p.name: p for p in table.profiles} == {p.name: p for p in CATALOG[g.model].profiles}


async def test_instance_listing_is_a_valid_layout(real: RealNvml) -> None:
    for g in await real.gpus():
        table = await real.profile_table(g.index)
        found = await real.instances(g.index)
        if not g.mig_enabled:
            assert found == []
        assert not layout_problems(table, [Instance(i.profile, i.start) for i in found])
        for inst in found:
            if inst.ci_id is not None:
                assert inst.uuid.startswith("MIG-")
                assert await real.processes(g.index, inst.profile, inst.start) is not None


async def test_status_report_from_real_gpu(real: RealNvml, tmp_path: Path) -> None:
    from migpart.agent.checkpoint import Checkpoint

    status, converged = await observe(real, Checkpoint(tmp_path / "c.json"), {})
    assert converged  # nothing desired: nothing to do, nothing changed
    assert [g.index for g in status.gpus] == [g.index for g in await real.gpus()]
    for g in status.gpus:
        assert g.profiles
        assert g.table().profile_names == tuple(p.name for p in g.profiles)
