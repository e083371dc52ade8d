"""What the agent tests share: a GPU's layout as (profile, start) pairs, a spec of one GPU from
such pairs, a claim prepared on an instance as the kubelet plugin records it, and an agent
running for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from migpart.agent.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from migpart.api.models import GpuSpec, MigInstanceSpec, MigNodeSpec
from migpart.mig import device_name
from migpart.slices.dra import DRIVER

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from migpart.agent.backend import MigInstance, NvmlBackend
    from migpart.agent.runner import Agent


async def layout(sim: NvmlBackend, gpu: int = 0) -> list[tuple[str, int]]:
    return [(i.profile, i.start) for i in await sim.instances(gpu)]


def one_gpu(plan: str, *instances: tuple[str, int]) -> MigNodeSpec:
    """Spec `plan`: GPU 0 holds `instances`, (profile, start) pairs."""
    return MigNodeSpec(
        plan_id=plan,
        gpus=[
            GpuSpec(index=0, instances=[MigInstanceSpec(profile=p, start=s) for p, s in instances])
        ],
    )


def prepare(checkpoint: Checkpoint, uid: str, inst: MigInstance) -> None:
    name = device_name(inst.gpu, inst.profile, inst.start)
    checkpoint.put(
        PreparedClaim(
            uid,
            "default",
            f"claim-{uid}",
            (
                PreparedDevice(
                    name,
                    inst.gpu,
                    inst.profile,
                    inst.start,
                    inst.uuid,
                    f"{DRIVER}/mig={uid}-{name}",
                ),
            ),
        )
    )


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    """The agent's loop runs as a task for the block; cancelled and awaited after it (an
    error it ended with is raised here)."""
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
