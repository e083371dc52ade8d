"""The simulator's crash points (`--sim-faults crash_after=...`): the agent process ends right
after the Nth destroy or create made inside a prepare, and only there; once, while the crash
marker says so. The e2e crash tests (tests/e2e/test_offer_crashes.py) and the chaos harness
stand on these."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

import pytest

from migpart.agent.cdi import CdiWriter
from migpart.agent.checkpoint import Checkpoint
from migpart.agent.plugin import ClaimRef, DraDriver
from migpart.agent.reconciler import reconcile_once
from migpart.agent.simulator import (
    CRASH_STATUS,
    CRASHED_FILE,
    PREPARE_FRAME,
    SimFaults,
    SimulatedNvml,
)
from migpart.api.models import GpuSpec, MigInstanceSpec, MigNodeSpec
from migpart.slices.dra import DRIVER, AllocatedDevice
from migpart.testing.claims import InMemoryClaims
from tests.unit.agent.conftest import H100
from tests.unit.agent.helpers import layout

NODE = "node-a"


class Exited(BaseException):
    """The process ended (what `os._exit` does in the agent); nothing catches it."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def exit_process(status: int) -> NoReturn:
    raise Exited(status)


def simulator(state: Path, crash_after: str) -> SimulatedNvml:
    """A new agent process's simulator: NVML's state as the last one left it."""
    faults = SimFaults.parse(f"crash_after={crash_after}")
    return SimulatedNvml(
        [(H100, 1)], node=NODE, state_path=state, faults=faults, exit_process=exit_process
    )


def driver(root: Path, sim: SimulatedNvml, claims: InMemoryClaims) -> DraDriver:
    checkpoint = Checkpoint(root / "state" / "checkpoint.json")
    cdi = CdiWriter(root / "cdi", caps_root=None)
    return DraDriver(NODE, sim, claims, checkpoint, cdi, offering=lambda: True)


def claim(claims: InMemoryClaims, name: str, device: str) -> ClaimRef:
    claims.put("team", name, f"uid-{name}", [AllocatedDevice("gpu", DRIVER, NODE, device)])
    return ClaimRef("team", f"uid-{name}", name)


@pytest.mark.parametrize(
    ("text", "points"),
    [
        ("crash_after=prepare_destroy", (("prepare_destroy", 1),)),
        (
            "crash_after=prepare_create:2+prepare_destroy",
            (("prepare_create", 2), ("prepare_destroy", 1)),
        ),
        ("seed=3,crash_after=prepare_create:1", (("prepare_create", 1),)),
    ],
)
def test_crash_points_are_parsed(text: str, points: tuple[tuple[str, int], ...]) -> None:
    assert SimFaults.parse(text).crash_after == points


@pytest.mark.parametrize(
    "text",
    [
        "crash_after=explode",
        "crash_after=prepare_create:0",
        "crash_after=prepare_create:x",
        "crash_after=",
        "crash_after",
    ],
)
def test_bad_crash_points_are_refused_clearly(text: str) -> None:
    with pytest.raises(ValueError, match=r"--sim-faults: bad entry.*crash_after=POINT"):
        SimFaults.parse(text)


def test_the_prepare_frame_names_the_plugins_prepare() -> None:
    """A rename of the plugin's prepare must fail here, not leave the crash points silent."""
    assert (DraDriver.prepare.__module__, DraDriver.prepare.__qualname__) == PREPARE_FRAME


async def test_changes_outside_a_prepare_never_crash(tmp_path: Path) -> None:
    sim = simulator(tmp_path / "nvml.json", "prepare_destroy+prepare_create")
    await sim.create(0, "1g.10gb", 0)
    await sim.destroy(0, "1g.10gb", 0)
    listed = [MigInstanceSpec(profile="3g.40gb", start=0)]
    spec = MigNodeSpec(plan_id="p1", gpus=[GpuSpec(index=0, instances=listed)])
    checkpoint = Checkpoint(tmp_path / "state" / "checkpoint.json")
    await reconcile_once(spec, sim, checkpoint)  # the reconciler's create
    await reconcile_once(spec.model_copy(update={"gpus": [GpuSpec(index=0)]}), sim, checkpoint)
    assert await layout(sim) == []
    assert not (tmp_path / CRASHED_FILE).exists()


async def test_a_crash_after_the_destroy_of_a_prepare_leaves_room_made_and_nothing_created(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml.json"
    sim = simulator(state, "prepare_destroy+prepare_create")
    await sim.create(0, "1g.10gb", 0)  # free, in the way of 4g.40gb@0
    claims = InMemoryClaims()
    ref = claim(claims, "a", "gpu-0-4g40gb-0")
    with pytest.raises(Exited) as exited:
        await driver(tmp_path, sim, claims).prepare(ref)
    assert exited.value.status == CRASH_STATUS == 137
    assert sim.calls[-2:] == ["destroy_ci 0 1g.10gb@0", "destroy_gi 0 1g.10gb@0"]
    marker = json.loads((tmp_path / CRASHED_FILE).read_text())
    assert marker == {
        "point": "prepare_destroy",
        "count": 1,
        "gpu": 0,
        "profile": "1g.10gb",
        "start": 0,
    }
    # started again with the same flags: the marker keeps the create of the retry from
    # crashing, and the claim is prepared
    again = simulator(state, "prepare_destroy+prepare_create")
    assert await layout(again) == []
    [device] = await driver(tmp_path, again, claims).prepare(ref)
    assert (device.profile, device.start) == ("4g.40gb", 0)
    assert again.calls == ["create_gi 0 4g.40gb@0", "create_ci 0 4g.40gb@0"]


async def test_a_crash_after_the_create_of_a_prepare_comes_before_the_cdi_write(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml.json"
    sim = simulator(state, "prepare_create")
    claims = InMemoryClaims()
    ref = claim(claims, "a", "gpu-0-3g40gb-4")
    plugin = driver(tmp_path, sim, claims)
    with pytest.raises(Exited):
        await plugin.prepare(ref)
    assert await layout(sim) == [("3g.40gb", 4)]
    assert not list((tmp_path / "cdi").glob("*"))  # no CDI spec written
    assert plugin.checkpoint.claims() == []  # nor the claim recorded
    again = simulator(state, "prepare_create")
    [made] = await again.instances(0)
    [device] = await driver(tmp_path, again, claims).prepare(ref)
    assert again.calls == []  # the instance made before the crash, reused
    assert device.uuid == made.uuid
    assert list((tmp_path / "cdi").glob("*"))


async def test_the_nth_change_crashes_and_a_deleted_marker_arms_the_point_again(
    tmp_path: Path,
) -> None:
    state = tmp_path / "nvml.json"
    sim = simulator(state, "prepare_create:2")
    claims = InMemoryClaims()
    plugin = driver(tmp_path, sim, claims)
    await plugin.prepare(claim(claims, "a", "gpu-0-1g10gb-0"))  # the first: no crash
    with pytest.raises(Exited):
        await plugin.prepare(claim(claims, "b", "gpu-0-1g10gb-1"))
    marker = tmp_path / CRASHED_FILE
    assert json.loads(marker.read_text())["count"] == 2
    again = simulator(state, "prepare_create:1")
    plugin = driver(tmp_path, again, claims)
    await plugin.prepare(claim(claims, "c", "gpu-0-1g10gb-2"))  # the marker: no crash
    marker.unlink()  # armed again, in the running process
    with pytest.raises(Exited):
        await plugin.prepare(claim(claims, "d", "gpu-0-1g10gb-3"))
    assert json.loads(marker.read_text())["start"] == 3
