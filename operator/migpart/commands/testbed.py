"""`migpart testbed build | run`: the local Kubernetes of hack/testbed."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from migpart.commands.options import DefaultsHelpFormatter, Parser
from migpart.testbed import Testbed, TestbedBuildError, TestbedError, build
from migpart.testbed.build import KUBE_VERSIONS, VERSION_ENV, kube_version, outside_checkout
from migpart.testbed.kubelet import NodeKubelet

VERSION_HELP = (
    f"Kubernetes version, one of {', '.join(KUBE_VERSIONS)} "
    f"(default: ${VERSION_ENV}, else the newest)"
)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migpart testbed")
    sub = p.add_subparsers(dest="action", required=True)
    b = sub.add_parser(
        "build",
        help="build the Go testbed binary (cached) and print its path",
        formatter_class=DefaultsHelpFormatter,
    )
    b.add_argument("--version", default=None, help=VERSION_HELP)
    run = sub.add_parser(
        "run",
        help="run the control plane in the foreground until signalled",
        formatter_class=DefaultsHelpFormatter,
    )
    run.add_argument("--dir", type=Path, required=True, help="state dir; DIR/kubeconfig")
    run.add_argument("--port", type=int, default=0, help="kube-apiserver port (default: free)")
    run.add_argument("--version", default=None, help=VERSION_HELP)
    run.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="nodes with a real kubelet each (fake container runtime), testbed-node-1..N",
    )
    return p


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if getattr(args, "nodes", 0) < 0:
        p.error("--nodes must be >= 0")
    try:
        kube_version(args.version)
    except TestbedBuildError as exc:
        p.error(f"--version: {exc}")
    problem = outside_checkout("testbed")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        if args.action == "build":
            print(build(version=args.version))
            return 0
        return _run(args.dir, args.port, args.version, args.nodes)
    except (TestbedBuildError, TestbedError) as exc:
        print(f"migpart testbed: {exc}", file=sys.stderr)
        return 1


def _run(directory: Path, port: int, version: str | None, nodes: int) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    directory = directory.resolve()
    testbed = Testbed(directory, port=port, binary=build(version=version))
    kubelets = [
        NodeKubelet(testbed, f"testbed-node-{i + 1}", directory / "nodes" / f"n{i + 1}")
        for i in range(nodes)
    ]
    with testbed.running():
        try:
            for kubelet in kubelets:
                kubelet.start()
                print(f"node {kubelet.name} Ready (kubelet in {kubelet.dir})", flush=True)
            print(f"testbed ready: {testbed.server}, kubeconfig {testbed.kubeconfig}", flush=True)
            while not stop.wait(1.0):
                testbed.check_alive()
                for kubelet in kubelets:
                    kubelet.check_alive()
        finally:
            for kubelet in kubelets:
                kubelet.stop()
    print("testbed stopped", flush=True)
    return 0
