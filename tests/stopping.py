"""Bounded stops for what tests start: one that does not end is killed (a process) or left
(a task) and the test fails saying so, instead of hanging until pytest-timeout and leaving its
servers, sockets and threads to the tests after it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess

import pytest

# Generous: these bound a wait for something that must happen, they time nothing.
TASK_GRACE_S = 60.0
PROCESS_GRACE_S = 30.0


async def stop_task(task: asyncio.Task[None], what: str, grace_s: float = TASK_GRACE_S) -> None:
    """Cancel `task` and wait up to `grace_s` for it to end; fail with its stack if it does
    not. An error it ended with is raised here, as awaiting it would."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    if task not in done:
        stack = io.StringIO()
        task.print_stack(file=stack)
        pytest.fail(f"{what} did not stop within {grace_s:g} s of its cancel:\n{stack.getvalue()}")
    if not task.cancelled():
        task.result()


def stop_process(proc: subprocess.Popen[bytes], what: str, grace_s: float = PROCESS_GRACE_S) -> int:
    """SIGTERM `proc`, wait up to `grace_s`, then SIGKILL it and fail saying so. Returns its
    exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(
                f"{what} (pid {proc.pid}) did not stop within {grace_s:g} s of SIGTERM; killed"
            )
    return proc.returncode


async def stop_async_process(
    proc: asyncio.subprocess.Process, what: str, grace_s: float = PROCESS_GRACE_S
) -> tuple[bytes, bytes]:
    """`stop_process` for an asyncio subprocess: its stdout and stderr (where piped)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    try:
        async with asyncio.timeout(grace_s):
            return await proc.communicate()
    except TimeoutError:
        proc.kill()
        _, err = await proc.communicate()
        tail = (err or b"").decode(errors="replace")[-3000:]
        pytest.fail(
            f"{what} (pid {proc.pid}) did not stop within {grace_s:g} s of SIGTERM; killed."
            f" stderr:\n{tail}"
        )
