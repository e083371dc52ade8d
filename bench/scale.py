"""Scale of migpart end to end: N simulated GPU nodes, then M pending pods at once.

For each size N it starts a fresh testbed (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager on loopback; the binary is cached) and:

1. creates N Node objects through the API (Ready, untainted, `nvidia.com/mig.capable`), half
   in pool a and half in pool b (`migpart.io/pool`), a quarter of each with a zone label.
   Kubelets: none. Pods are bound by kube-scheduler but never run: the one light stand-in
   the project allows, at this scale only;
2. starts the agents of every node in one process and waits until every MigNode reports its
   GPUs, so that agent start-up is not part of the burst: the fleet, bench/scale_fleet.py:
   each node's real reconcile loop (`Agent`: fencing, `reconcile_once` on the simulated NVML
   of 8 x H100 80GB, the real status with its uuids, conditions and `observedPlanId`) with
   NVML latency `--latency-ms` (0: each status follows its spec at once), but one MigNode
   watch for the whole fleet instead of one per node, the node Leases renewed in slices by
   one task, a capped connection pool, and no kubelet plugin or metrics port. It stands for
   N agents on N machines, as a light stand-in: what the operator and the control plane see
   (MigNode statuses, Lease renewals every 10 s) is what N agents would write, while this
   machine is spared N watches and N agents' event loops. That is what fits 1,000 nodes on
   2 cores (every node's `migpart.agent.app.serve`, each with its own watch and Lease task,
   as this bench ran before, could not keep 1,000 nodes' Leases beside the control plane).
   It runs at nice -5 where permitted, since it stands for N machines whose Lease renewals
   would not wait behind the control plane;
3. applies two GpuPartitionPolicies (pool a, pool b; Active; batch window 1 s; no spares;
   maxConcurrentNodes = the pool's size) and starts the real operator (`migpart operator`)
   as a user of its own, so that the API server's audit log counts its requests; waits until
   it is quiet and measures its idle CPU;
4. the burst: M = pods-per-node x N ResourceClaims and pods, created together (50 in
   flight), mixed with a fixed seed: one device of 1g.10gb..7g.80gb (CEL on the profile),
   two devices, two devices on one GPU (matchAttribute parentUUID), a tenth with a node
   selector on the zone label; every pod selects its pool. No GPU holds a MIG instance yet,
   so every claim needs the operator to repartition;
5. times each pod from just before its create call until a watch shows `spec.nodeName`
   (kube-scheduler binds only once the claim is allocated), until all are bound or
   `--timeout-s`;
6. reports, over the burst (first create until the operator is quiet after the last bind):
   the operator's CPU (utime+stime from /proc/<pid>/stat), its peak RSS (VmHWM), the API
   requests it made (the audit log's entries of its user), the other components' CPU; then
   the operator's idle CPU with nothing pending, and `destroyed-in-use`: allocated devices
   that vanished from their MigNode (followed by watch during the whole run, and checked
   once more at the end). No kubelet prepares the claims, so every protection of an
   allocated device is the operator's.
7. the baseline (unless `--no-baseline`): deletes the burst's pods and claims (their instances
   stay) and creates the same pods again under new names. Every instance they need exists and
   is published, so the operator repartitions nothing: this is the control plane alone
   (API server, scheduler, controller manager) serving the same burst on this machine. It
   prints that burst, and migpart's burst as a ratio to it. On a small machine the baseline
   alone may take longer than an absolute target; the ratio and the seconds migpart adds
   are what carry over to other machines.

With `--allocation offer` (bench/scale_offer.py) the same run is made in offer mode: the
operator with `--offer-publishing`, the policies with `allocation: Offer`, the burst started
once every node's stable pool is published (a testbed that does not serve offer mode, 1.34 and
1.35, stops the run, saying so). kube-scheduler allocates placements and binds at once; no
kubelet prepares, so nothing is made and the fleet does no work for the burst. The baseline is
the same pods again on the same pools with the operator stopped (why: bench/scale_offer.py).
It adds how many pods the pools served with no round, by request kind, and the targets: at
300 and 1,000 nodes with kube-scheduler's default API QPS, every pod bound within 1.1 x the
baseline's time and at most 0.05 slice writes per pod.

One line per size, then the growth between sizes and the targets (met or NOT met; a
benchmark prints, it does not assert). Usage: `python -m bench.scale [--sizes 100,300,1000]
[--latency-ms 0] [--pods-per-node 2] [--timeout-s 180] [--allocation reactive|offer]`;
`make bench-scale` runs 100, 300 and 1,000 nodes.
"""

from __future__ import annotations

import argparse
import signal
import sys
from signal import SIGINT, SIGTERM
from typing import Any

from bench import scale_offer, scale_pairs
from bench.scale_cluster import AGENTS_NICE, GPUS_PER_NODE, H100, SCHEDULER_QPS, SEED
from bench.scale_report import growth, report, targets
from bench.scale_run import run_size
from migpart.testbed import build

# ---------------------------------------------------------------- main

MODES = {
    "reactive": "allocation: reactive (the operator without --offer-publishing: a pod whose "
    "instance does not exist yet fails scheduling once, then a round creates it)",
    "offer": "allocation: offer (the operator with --offer-publishing, policies allocation: "
    "Offer: every node publishes one stable pool of placements, kube-scheduler allocates and "
    "binds at once, nothing is prepared here; the baseline on the same pools with the "
    "operator stopped)",
}


AGENTS = (
    "agents: the fleet (bench/scale_fleet.py: every node's reconcile loop in one process on one"
    " MigNode watch, Leases renewed in slices; a light stand-in for N agents)"
)


def sizes(text: str) -> list[int]:
    values = [int(v) for v in text.replace("_", "").split(",") if v.strip()]
    if not values or any(v < 2 for v in values):
        raise argparse.ArgumentTypeError("expected node counts >= 2, e.g. 100,300,1000")
    return values


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", type=sizes, default=[100, 300, 1000], help="node counts")
    p.add_argument("--latency-ms", type=float, default=0.0, help="simulated NVML latency")
    p.add_argument("--pods-per-node", type=int, default=2)
    p.add_argument("--timeout-s", type=float, default=180.0, help="give up binding after this")
    p.add_argument("--idle-s", type=float, default=30.0, help="idle CPU measuring interval")
    p.add_argument(
        "--scheduler-qps",
        type=int,
        default=SCHEDULER_QPS,
        help="kube-scheduler --kube-api-qps (burst twice that); 0 keeps its default of 50, "
        "under which binding 2,000 pods alone takes over a minute",
    )
    p.add_argument("--keep", action="store_true", help="keep each size's logs and audit log")
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the operator elects itself leader with a Lease, as in a cluster (default: on); "
        "--no-leader-elect measures it without, for the comparison",
    )
    p.add_argument(
        "--election-pairs",
        type=int,
        default=0,
        metavar="K",
        help="instead of the plain run: K pairs of bursts in one control plane, the operator "
        "with leader election on and off in ABBA order, compared by medians "
        "(bench/scale_pairs.py)",
    )
    p.add_argument(
        "--allocation",
        choices=("reactive", "offer"),
        default="reactive",
        help="reactive: the operator as deployed by default (a pod whose instance does not "
        "exist fails scheduling once, then a round creates it); offer: the operator with "
        "--offer-publishing and policies with allocation: Offer (needs Kubernetes 1.36+)",
    )
    p.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the baseline burst (the same pods again on what the burst left published)",
    )
    args = p.parse_args()
    if args.election_pairs > 0 and args.allocation != "reactive":
        p.error("--election-pairs measures reactive mode only")

    def interrupted(signum: int, _: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # SIGTERM ends a run like Ctrl-C does; SIGINT is set explicitly because a shell starts
    # background jobs with it ignored, and a benchmark must always be stoppable and clean up.
    signal.signal(SIGTERM, interrupted)
    signal.signal(SIGINT, signal.default_int_handler)
    binary = build()
    qps = f"--kube-api-qps {args.scheduler_qps}" if args.scheduler_qps else "default API QPS (50)"
    print(
        f"migpart scale: {GPUS_PER_NODE} x {H100} per node, {args.pods_per_node} pods per node, "
        f"NVML latency {args.latency_ms:.0f} ms, seed {SEED}; kube-scheduler {qps}; "
        f"leader election {'on' if args.leader_elect else 'off'}\n"
        "kubelets: none, pods are bound not run (light stand-in); all agents in one process"
        f" (nice {AGENTS_NICE} where permitted: they stand for machines of their own)",
        flush=True,
    )
    print(AGENTS, flush=True)
    print(MODES[args.allocation], flush=True)
    if args.election_pairs > 0:
        for nodes in args.sizes:
            scale_pairs.report(run_size(nodes, args, binary, body=scale_pairs.body))
        return 0
    results = []
    for nodes in args.sizes:
        try:
            result = run_size(nodes, args, binary)
        except scale_offer.OfferNotServed as error:
            print(f"error: {error}", file=sys.stderr, flush=True)
            return 2
        report(result)
        if args.allocation == "offer":
            scale_offer.report(result)
        results.append(result)
    growth(results)
    targets(results)
    if args.allocation == "offer":
        scale_offer.target(results, args.scheduler_qps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
