"""Chaos harness: migpart keeps its promise while its parts crash, restart and race.

Runs the testbed control plane, simulated GPU nodes with real `migpart agent --simulate`
processes (NVML with latency and injected failures, `--sim-faults`), the real `migpart
operator`, and a trace-driven stream of pods (the Alibaba GPU trace, as in `make demo`),
prepared on their nodes by a light stand-in kubelet (bench/stand_in_kubelet.py; no real
kubelets here). On a seeded schedule it injects:

- agent-kill: SIGKILL of a node's agent while the node carries out a spec (a create or a
  destroy under way), then a restart 1-3 s later;
- operator-kill: SIGKILL of the operator inside the destroy protocol's window (a device the
  spec still lists is withdrawn from the slice), then a restart;
- apiserver-restart, etcd-restart: the component SIGKILLed, down 1-3 s, started again with
  its data;
- claim-delete: a pending pod and its claim deleted while the operator plans for them;
- node-delete: a Node deleted while its spec is carried out (the garbage collector takes its
  MigNode and slice; the agent makes the MigNode again), and made again 2-4 s later;
- second-writer: another writer rewrites a MigNode spec's planId (the layout unchanged);
- gpu-lost: a GPU falls off the bus (NVML_ERROR_GPU_IS_LOST from every call on it, through
  the simulator's lost-GPU file), preferably one a node's pending spec names, for 5-30 s, then
  comes back with the instances it had (a loss the driver recovers from without a reset);
- second-operator, operator-freeze, agent-freeze, apiserver-partition: leader election and
  the fence (bench/chaos_faults.py; the operators reach the API server through a proxy there);
- sabotage (only when asked for, a check of the monitor): an instance in use removed from
  its GPU behind the agent's back, as a buggy agent would; the monitor must count it;
- nvml: INSUFFICIENT_RESOURCES on create, IN_USE on destroy and TIMEOUT, injected by the
  simulator at `--nvml-faults` rates (counted from the agents' logs);
- prepare-crash (with `--offer` only): every agent armed to end (exit 137, as SIGKILL) right
  after the next destroy or create made inside a prepare (the simulator's crash points,
  `--sim-faults crash_after`): between the destroy that made room and the create, or between
  the create and the CDI write; the first to end is started again 1-3 s later, the others are
  disarmed.

With `--offer` the operators run with `--offer-publishing` and the policy asks for
`allocation: Offer`: every node publishes its stable pool and the agents make instances when
the stand-in kubelet prepares a claim (docs/offer-mode.md). Where the server does not serve
offer mode (before Kubernetes 1.36) the harness says so and exits with 2 before any fault.

An invariant monitor reads the API server, the agents' checkpoints and the simulated GPUs'
state every second and counts:

- destroyed-in-use: an instance gone from its GPU while a claim's allocation or a checkpoint
  held it, and still holds it;
- leaked: an instance on a GPU in neither the spec nor the status for more than 60 s (a lost
  GPU's instances are not counted while it is lost: no agent can see them);
- stuck: a pod pending for more than 120 s (the pod stream keeps the load below capacity, so
  a plan for it exists);
- double-allocated: two claims allocated the same device, or two placements of one GPU that
  share a memory slice (offer mode lists every placement; its counters must prevent it);
- non-leader-writes: a MigNode or slice write stamped by an operator while it did not hold the
  election Lease (bench/chaos_faults.py).

It ends with one line:

    faults F, pods served S/T, destroyed-in-use 0, leaked 0, stuck 0, double-allocated 0,
    non-leader-writes 0

and exits 0 only when every counter is 0 and every pod was served. Pods whose claim the
harness deleted are not counted in T.

    make chaos ARGS="--duration 300 --seed 7"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config

from bench.chaos_counters import (
    FAULTS,
    LABELS,
    MODEL,
    OFFER_FAULTS,
    POLICY_NAME,
    SELF_CHECKS,
    policy,
)
from bench.chaos_faults import (
    MainOperator,
    Proxy,
)
from bench.chaos_harness import Chaos
from migpart.agent.simulator import CRASHED_FILE
from migpart.demo.cluster import REPO, LocalCluster
from migpart.demo.replay import NAMESPACE, claim_template
from migpart.demo.run import agents_ready
from migpart.demo.trace import TracePod, accelerate, load_trace
from migpart.mig import lookup_table
from migpart.testbed import Testbed


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300.0, help="seconds of pod stream")
    p.add_argument("--drain", type=float, default=150.0, help="seconds to let pods finish")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--pods", type=int, default=0, help="trace pods (0: 3 per GPU)")
    p.add_argument("--fault-every", type=float, default=3.0, help="mean seconds between faults")
    p.add_argument(
        "--faults",
        default=None,
        help=f"kinds to inject (default: all; {', '.join(OFFER_FAULTS)} with --offer only)",
    )
    p.add_argument(
        "--offer",
        action="store_true",
        help="offer mode: the operators with --offer-publishing, the policy asks for Offer",
    )
    p.add_argument(
        "--nvml-faults",
        default="create_insufficient=0.05,destroy_in_use=0.05,timeout=0.01",
        help="the agents' --sim-faults rates (the seed is added)",
    )
    p.add_argument("--sim-latency-ms", type=float, default=100.0)
    p.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    args = p.parse_args(argv)
    every = FAULTS + OFFER_FAULTS if args.offer else FAULTS
    kinds = [k for k in (args.faults or ",".join(every)).split(",") if k]
    unknown = sorted(set(kinds) - set(FAULTS) - set(OFFER_FAULTS) - set(SELF_CHECKS))
    if unknown:
        known = ", ".join(FAULTS + OFFER_FAULTS + SELF_CHECKS)
        p.error(f"--faults: unknown {', '.join(unknown)} (known: {known})")
    if set(kinds) & set(OFFER_FAULTS) and not args.offer:
        p.error(f"--faults: {', '.join(OFFER_FAULTS)} needs --offer")
    if args.nodes < 1 or args.duration <= 0 or args.fault_every <= 0:
        p.error("--nodes, --duration and --fault-every must be positive")
    args.kinds = kinds
    return args


def allocation(testbed: Testbed) -> dict[str, Any]:
    """The policy's allocation mode in effect and why (empty until the operator says)."""
    body = json.loads(testbed.kubectl("get", "gpupartitionpolicy", POLICY_NAME, "-o", "json"))
    return dict((body.get("status") or {}).get("allocation") or {})


def nvml_faults(cluster: LocalCluster) -> Counter[str]:
    """The failures the simulated NVML injected, from the agents' (JSON) logs."""
    out: Counter[str] = Counter()
    for log in (cluster.dir / "logs").glob("agent-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "nvml_fault_injected" not in line:
                continue
            with contextlib.suppress(json.JSONDecodeError):
                entry = json.loads(line)
                error = str(entry.get("error", "")).removeprefix("NVML_ERROR_")
                out[f"nvml-{entry.get('op')}-{error}"] += 1
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="migpart-chaos-"))
    table = lookup_table(MODEL, None, "--model")
    count = args.pods or 3 * args.nodes * args.gpus_per_node
    trace = REPO / "tests" / "fixtures" / "traces" / "openb_pod_list_default.csv"
    # A pod needing more GPUs than a node has could never be served (not a fault's doing).
    rows = load_trace(trace, table, offset=args.seed * 7, limit=count)
    pods = accelerate(
        [p for p in rows if p.count <= args.gpus_per_node],
        span_s=args.duration * 0.8,
        min_life_s=5.0,
        max_life_s=max(10.0, args.duration / 6),
    )
    print(
        f"chaos: seed {args.seed}, work dir {work}, {len(pods)} pods, faults {args.kinds}"
        f"{', offer mode asked for' if args.offer else ''}; "
        "kubelets: a light stand-in (bench/stand_in_kubelet.py), no real kubelets"
    )
    testbed = Testbed(work / "testbed")
    cluster = LocalCluster(testbed, work)
    chaos: Chaos | None = None
    proxy: Proxy | None = None
    try:
        testbed.start()
        server = yaml.safe_load(testbed.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        host, port = server.split("://", 1)[1].rsplit(":", 1)
        proxy = Proxy(host, int(port))
        cluster.operator_kubeconfig = proxy.kubeconfig(
            testbed.kubeconfig, work / "operator.kubeconfig"
        )
        cluster.install()
        for i in range(args.nodes):
            sim_faults = f"{args.nvml_faults},seed={args.seed * 1000 + i}".lstrip(",")
            if "prepare-crash" in args.kinds:
                # armed by prepare-crash, which deletes the marker; disarmed until then
                sim_faults += ",crash_after=prepare_destroy+prepare_create"
                marker = work / "nodes" / f"chaos-node-{i + 1}" / "state" / CRASHED_FILE
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text('{"point": "disarmed by the harness"}\n')
            cluster.add_gpu_node(
                f"chaos-node-{i + 1}",
                f"{MODEL}:{args.gpus_per_node}",
                LABELS,
                args.sim_latency_ms,
                ("--sim-faults", sim_faults, "--resync-seconds", "5"),
                kubelet=False,
            )
        cluster.wait_for("every agent to report its GPUs", lambda: agents_ready(cluster))
        testbed.kubectl("apply", "-f", "-", input=policy(args.offer))
        main_operator = MainOperator(("--offer-publishing",) if args.offer else ())
        main_operator.start(cluster)
        cluster.wait_for("the policy's allocation mode", lambda: bool(allocation(testbed)))
        mode = allocation(testbed)
        print(f"allocation in effect: {mode.get('mode')} ({mode.get('reason')})", flush=True)
        if args.offer and mode.get("mode") != "Offer":
            print(
                "chaos: --offer, but offer mode is not in effect on this server (it needs"
                " partitionable devices, Kubernetes 1.36+): no faults injected",
                flush=True,
            )
            return 2
        chaos = asyncio.run(_run(args, cluster, pods, table, proxy, main_operator))
    finally:
        cluster.stop()
        testbed.stop()
    chaos.c.faults.update(nvml_faults(cluster))
    print("faults by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(chaos.c.faults.items())))
    # where the timed faults landed: "agent-kill (mid-spec)", "operator-kill (in window)", ...
    timed = (
        "agent-kill",
        "operator-kill",
        "node-delete",
        "gpu-lost",
        "operator-freeze",
        "agent-freeze",
        "apiserver-restart",
        "etcd-restart",
        "prepare-crash",
    )
    where = Counter(
        f"{n.split()[0]} ({n.rsplit(' (', 1)[-1]}" for n in chaos.c.notes if n.startswith(timed)
    )
    print("timing: " + (", ".join(f"{k} {n}" for k, n in sorted(where.items())) or "none"))
    for kind in ("destroyed_in_use", "leaked", "stuck", "double_allocated", "non_leader_writes"):
        if getattr(chaos.c, kind):
            print(f"{kind}: {sorted(getattr(chaos.c, kind))}")
    if chaos.c.total - chaos.c.served:
        print(f"not served: {sorted(chaos.c.total - chaos.c.served)}")
    print(chaos.c.line(), flush=True)
    return 0 if chaos.c.ok() else 1


async def _run(
    args: argparse.Namespace,
    cluster: LocalCluster,
    pods: list[TracePod],
    table: Any,
    proxy: Proxy,
    main: MainOperator,
) -> Chaos:
    api = await config.new_client_from_config(config_file=str(cluster.testbed.kubeconfig))
    try:
        namespace: Any = {"metadata": {"name": NAMESPACE}}
        await client.CoreV1Api(api).create_namespace(namespace)
        resource = client.ResourceV1Api(api)
        for profile, n in sorted({(p.profile, p.count) for p in pods}):
            body: Any = claim_template(profile, n)
            await resource.create_namespaced_resource_claim_template(NAMESPACE, body)
        chaos = Chaos(args, cluster, api, proxy, main)
        await chaos.run(pods)
        return chaos
    finally:
        await api.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
