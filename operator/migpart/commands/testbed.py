"""`migpart testbed build | run`: the local control plane of hack/testbed."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from migpart.testbed import Testbed, TestbedBuildError, TestbedError, build


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="migpart testbed")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("build", help="build the Go testbed binary (cached) and print its path")
    run = sub.add_parser("run", help="run the control plane in the foreground until signalled")
    run.add_argument("--dir", type=Path, required=True, help="state dir; DIR/kubeconfig")
    run.add_argument("--port", type=int, default=0, help="kube-apiserver port (default: free)")
    args = parser.parse_args(argv)
    try:
        if args.action == "build":
            print(build())
            return 0
        return _run(args.dir, args.port)
    except (TestbedBuildError, TestbedError) as exc:
        print(f"migpart testbed: {exc}", file=sys.stderr)
        return 1


def _run(directory: Path, port: int) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    testbed = Testbed(directory.resolve(), port=port)
    with testbed.running():
        print(f"testbed ready: {testbed.server}, kubeconfig {testbed.kubeconfig}", flush=True)
        while not stop.wait(1.0):
            testbed.check_alive()
    print("testbed stopped", flush=True)
    return 0
