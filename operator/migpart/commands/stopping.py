"""A long-running command's bounded stop: SIGTERM or SIGINT cancels its main coroutine, and a
process still there `grace_s` later (a task that ignores cancellation, a server that does not
stop, a stuck executor thread) writes why to stderr, with every thread's stack and the asyncio
tasks still pending, and exits with `EXIT_STUCK`. So a stop is never longer than the grace,
and a stuck one says where it was stuck instead of waiting for SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

EXIT_STUCK = 70  # EX_SOFTWARE


def run_until_signalled(
    main: Callable[[], Coroutine[Any, Any, None]], what: str, grace_s: float
) -> None:
    """`asyncio.run(main())`, ended by SIGTERM or SIGINT within `grace_s` (see above)."""
    asyncio.run(_run(main, what, grace_s))


async def _run(main: Callable[[], Coroutine[Any, Any, None]], what: str, grace_s: float) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    armed: list[threading.Timer] = []

    def on_signal(sig: signal.Signals) -> None:
        if not armed:
            timer = threading.Timer(grace_s, _give_up, (what, grace_s, sig.name, loop))
            timer.daemon = True
            timer.start()
            armed.append(timer)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    with contextlib.suppress(asyncio.CancelledError):
        await main()


def _give_up(what: str, grace_s: float, signame: str, loop: asyncio.AbstractEventLoop) -> None:
    """The grace is over: say what is still running, then exit at once."""
    try:
        # Read from another thread while the loop may run: a best-effort diagnosis, at exit.
        pending = sorted(f"{t.get_name()} {t.get_coro()!r}" for t in asyncio.all_tasks(loop))
    except RuntimeError:  # the task set changed while it was read
        pending = ["(could not be listed)"]
    print(
        f"migpart {what}: did not stop within {grace_s:g} s of {signame}; exiting with"
        f" {EXIT_STUCK}. asyncio tasks still pending: {pending or 'none'}. Thread stacks:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(EXIT_STUCK)
