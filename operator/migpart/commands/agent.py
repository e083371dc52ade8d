"""`migpart agent`: the node agent (DaemonSet), on real NVML or on the simulator."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from migpart import logs
from migpart.agent.app import AgentConfig, serve
from migpart.agent.simulator import SimFaults, parse_simulate
from migpart.api.leases import LEASE_DURATION_S, LEASE_NAMESPACE, LEASE_RENEW_S
from migpart.commands.options import Parser, log_level, port
from migpart.commands.stopping import run_until_signalled
from migpart.kube.client import KubeconfigError, api_client, load_configuration
from migpart.slices.dra import KUBELET_PLUGIN_DIR, KUBELET_REGISTRY_DIR

# How long SIGTERM may take to stop the agent (Kubernetes' default grace period is 30 s).
STOP_GRACE_S = 25.0


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migpart agent", description=__doc__)
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node's name (default: $NODE_NAME)",
    )
    p.add_argument(
        "--simulate",
        action="append",
        metavar="MODEL:COUNT[,MODEL:COUNT]",
        help='simulate GPUs instead of NVML, e.g. "NVIDIA H100 80GB HBM3:8" (repeatable)',
    )
    p.add_argument(
        "--sim-latency-ms",
        type=float,
        default=0.0,
        help="simulated latency of every NVML operation",
    )
    p.add_argument(
        "--sim-faults",
        type=_sim_faults,
        default=None,
        metavar="KEY=VALUE[,...]",
        help="inject simulated NVML failures: create_insufficient=RATE, destroy_in_use=RATE,"
        " timeout=RATE (per call, 0..1), lost=GPU[+GPU], seed=N; crash_after=POINT[:N][+...]"
        " exits with 137 right after the Nth destroy (prepare_destroy) or create"
        " (prepare_create) made inside a prepare, once: not while the crash marker"
        " simulated-nvml-crashed.json is in --state-dir",
    )
    p.add_argument(
        "--state-dir", type=Path, default=Path("/var/lib/migpart"), help="checkpoint directory"
    )
    p.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path("/var/run/cdi"),
        help="where CDI spec files are written",
    )
    p.add_argument(
        "--plugin-dir",
        type=Path,
        default=KUBELET_PLUGIN_DIR,
        help="directory of the DRA gRPC socket",
    )
    p.add_argument(
        "--registration-dir",
        type=Path,
        default=KUBELET_REGISTRY_DIR,
        help="kubelet's plugin registration directory",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig (default: in-cluster, else $KUBECONFIG or ~/.kube/config)",
    )
    p.add_argument(
        "--no-kubelet-plugin",
        action="store_true",
        help="do not serve the DRA kubelet plugin (no kubelet on this node)",
    )
    p.add_argument(
        "--report-registration",
        action="store_true",
        help="report in the MigNode status whether kubelet registered the DRA plugin; the "
        "operator then publishes this node's devices only while it is registered (set it where "
        "a kubelet runs: the DaemonSet does)",
    )
    p.add_argument(
        "--lease-namespace",
        default=LEASE_NAMESPACE,
        help="namespace of the node's heartbeat Lease migpart-<node>",
    )
    p.add_argument(
        "--lease-duration-seconds",
        type=int,
        default=LEASE_DURATION_S,
        help="the Lease's leaseDurationSeconds",
    )
    p.add_argument(
        "--lease-renew-seconds",
        type=float,
        default=LEASE_RENEW_S,
        help="how often the Lease is renewed",
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        default=8081,
        help="port of /metrics, /healthz, /readyz (0 disables)",
    )
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=30.0,
        help="reconcile at least this often even without changes",
    )
    p.add_argument(
        "--stop-grace-seconds",
        type=float,
        default=STOP_GRACE_S,
        help="on SIGTERM/SIGINT, exit with 70 and the stacks of what is still running when the"
        " agent has not stopped after this long (keep it under the pod's"
        " terminationGracePeriodSeconds)",
    )
    p.add_argument(
        "--allow-publisher-overlap",
        action="store_true",
        help="manage the node even where NVIDIA's device plugin (allocatable nvidia.com/gpu or "
        "nvidia.com/mig-*) or DRA driver (ResourceSlices of gpu.nvidia.com) offers its GPUs "
        "too; without it the agent manages nothing there and the operator publishes no device "
        "of the node, so that no MIG device is offered twice (docs/gpu-operator.md)",
    )
    p.add_argument("--log-level", type=log_level, default="INFO", help="DEBUG, INFO, WARNING, ...")
    return p


def _sim_faults(text: str) -> SimFaults:
    try:
        return SimFaults.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def config_from(args: argparse.Namespace) -> AgentConfig:
    if not args.node_name:
        raise ValueError("--node-name (or $NODE_NAME) is required")
    if args.lease_duration_seconds < 1 or not args.lease_renew_seconds > 0:
        raise ValueError("--lease-duration-seconds must be >= 1 and --lease-renew-seconds > 0")
    simulate = None
    if args.simulate:
        simulate = [m for text in args.simulate for m in parse_simulate(text)]
    return AgentConfig(
        node=args.node_name,
        simulate=simulate,
        sim_latency_s=args.sim_latency_ms / 1000.0,
        sim_faults=args.sim_faults,
        state_dir=args.state_dir,
        cdi_dir=args.cdi_dir,
        plugin_dir=args.plugin_dir,
        registration_dir=args.registration_dir,
        kubelet_plugin=not args.no_kubelet_plugin,
        report_registration=args.report_registration,
        lease_namespace=args.lease_namespace,
        lease_duration_s=args.lease_duration_seconds,
        lease_renew_s=args.lease_renew_seconds,
        metrics_port=args.metrics_port,
        resync_s=args.resync_seconds,
        allow_publisher_overlap=args.allow_publisher_overlap,
    )


async def _main(config: AgentConfig, kubeconfig: Path | None) -> None:
    cfg = await load_configuration(kubeconfig)
    async with api_client(cfg) as api:
        await serve(config, api)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if not args.stop_grace_seconds > 0:
        print(
            f"migpart agent: --stop-grace-seconds must be above 0, not {args.stop_grace_seconds:g}",
            file=sys.stderr,
        )
        return 2
    logs.configure(args.log_level)
    try:
        config = config_from(args)
    except ValueError as err:
        print(f"migpart agent: {err}", file=sys.stderr)
        return 2
    try:
        run_until_signalled(
            lambda: _main(config, args.kubeconfig), "agent", args.stop_grace_seconds
        )
    except KubeconfigError as err:
        print(f"migpart agent: {err}", file=sys.stderr)
        return 2
    return 0
