"""`migpart demo`: the whole of migpart on one machine, in a few minutes.

Starts the testbed control plane (Kubernetes 1.37.2 unless $MIGPART_K8S_VERSION says
otherwise), `--nodes` simulated nodes with 8 H100s each (one real kubelet with a fake container
runtime and one real `migpart agent --simulate` process per node), the real `migpart operator`,
applies a policy, and replays an accelerated stretch of the Alibaba GPU trace as pods with
ResourceClaims while a live view shows pods, GPU layouts and repartitions. Ends with a summary
line, then one line with what the simulator gives for the same pods on the same cluster shape
(static `all-balanced`, `first-fit`, and its model of migpart with this policy, reactive and in
offer mode; see
docs/simulate.md, "Beside the demo"). Everything it started is stopped on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from migpart.commands.options import Parser
from migpart.demo.cluster import REPO, LocalCluster
from migpart.demo.compare import comparison_line, measured, simulated
from migpart.demo.run import DemoRun, apply_policy, replay, start_nodes
from migpart.demo.trace import accelerate, load_trace
from migpart.mig import lookup_table
from migpart.testbed import Testbed
from migpart.testbed.build import outside_checkout


def parse(argv: list[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.nodes < 1 or args.duration <= 0 or args.gpus_per_node < 1:
        p.error("--nodes, --gpus-per-node and --duration must be positive")
    return args


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migpart demo", description=__doc__)
    p.add_argument("--duration", type=float, default=120.0, help="seconds of replay")
    p.add_argument("--nodes", type=int, default=2, help="simulated GPU nodes (>= 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node")
    p.add_argument("--model", default="NVIDIA H100 80GB HBM3", help="the simulated GPU model")
    p.add_argument("--pods", type=int, default=0, help="trace pods to replay (0: 12 per node)")
    p.add_argument("--offset", type=int, default=0, help="first trace row (GPU tasks only)")
    p.add_argument(
        "--trace",
        type=Path,
        help="pod trace (Alibaba openb_pod_list CSV)",
        default=REPO / "tests" / "fixtures" / "traces" / "openb_pod_list_default.csv",
    )
    p.add_argument(
        "--sim-latency-ms",
        type=float,
        default=50.0,
        help="simulated NVML latency per create/destroy",
    )
    p.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    return p


def main(argv: list[str]) -> int:
    args = parse(argv)
    problem = outside_checkout("demo")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    work = args.dir or Path(tempfile.mkdtemp(prefix="migpart-demo-"))
    table = lookup_table(args.model, None, "--model")
    count = args.pods or 12 * args.nodes
    pods = accelerate(
        load_trace(args.trace, table, offset=args.offset, limit=count),
        span_s=args.duration * 0.6,
        min_life_s=5.0,
        max_life_s=args.duration / 3,
    )
    run = DemoRun(
        table,
        tuple(pods),
        args.duration,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        sim_latency_ms=args.sim_latency_ms,
    )
    print(f"migpart demo: work dir {work}; starting the control plane ...", flush=True)
    testbed = Testbed(work / "testbed")
    cluster = LocalCluster(testbed, work)
    try:
        testbed.start()
        cluster.install()
        start_nodes(cluster, run)
        apply_policy(cluster, run)
        cluster.start_operator()
        print(
            f"replaying {len(pods)} trace pods over {args.duration:.0f}s "
            f"(logs in {work / 'logs'}) ...",
            flush=True,
        )
        stats = replay(cluster, run)
        cluster.check_alive()
    except KeyboardInterrupt:
        print("\ninterrupted; stopping everything", file=sys.stderr)
        return 130
    finally:
        cluster.stop()
        testbed.stop()
    print(stats.summary(), flush=True)
    print(comparison_line(simulated(run), measured(stats)), flush=True)
    return 0 if stats.destroyed_in_use == 0 else 1
