"""bench/scale.py's processes: what it starts besides the testbed (`Children`), the CPU time
and memory of a process, read from /proc, and how a child ends with its parent."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import structlog

from migpart.testbed.run import terminate_all

CLK_TCK = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1

log = structlog.get_logger("bench.scale_processes")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields from the 3rd (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_mib(pid: int) -> tuple[float, float]:
    """(peak, current) resident set of a process in MiB: VmHWM and VmRSS."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) / 1024  # kB
    return values.get("VmHWM", 0.0), values.get("VmRSS", 0.0)


def die_with_parent() -> None:
    """Have the kernel send us SIGTERM when the process that started us ends (Linux), so that
    a killed benchmark leaves no agents behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        log.warning("parent_death_signal_unavailable", errno=ctypes.get_errno())


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Children:
    """The processes this benchmark starts besides the testbed; `stop()` ends all of them."""

    logs: Path
    procs: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str], cwd: Path | None = None) -> int:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.procs[name] = (proc, log)
        return proc.pid

    def pid(self, name: str) -> int:
        return self.procs[name][0].pid

    def check_alive(self) -> None:
        for name, (proc, _) in self.procs.items():
            if proc.poll() is not None:
                log = self.logs / f"{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"{name} exited with {proc.returncode}; {log}:\n{tail}")

    def stop(self, grace_s: float = 10.0) -> None:
        terminate_all(list(self.procs.values()), grace_s)
        self.procs.clear()

    def stop_one(self, name: str, grace_s: float = 10.0) -> None:
        """End one child (SIGTERM, the grace period, SIGKILL); the others run on."""
        entry = self.procs.pop(name, None)
        if entry is not None:
            terminate_all([entry], grace_s)
