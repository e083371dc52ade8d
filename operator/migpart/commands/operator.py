"""`migpart operator`: run the operator (kopf) with metrics and health endpoints.

Leader election is on by default (`--leader-elect`): any number of operators may run, one
holds the `migpart-operator` Lease in `--leader-elect-namespace` and writes, the others keep
their watches warm and write nothing until it goes (docs/operations.md, "Two replicas").
`--no-leader-elect` runs without it: then run exactly one. kopf always runs standalone: its
peering pauses a replica that sees another one, which is not leader election and fences
nothing, and needs CRDs and RBAC the manifests do not have.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path

import kopf
import structlog

from migpart import logs
from migpart.api.leases import LEASE_DURATION_S, LEASE_NAMESPACE
from migpart.api.selectors import DEFAULT_NODE_SELECTOR, LabelSelector, parse_node_selector
from migpart.clock import RealClock
from migpart.commands.options import Parser, log_level, port
from migpart.controller.core.health import REGISTRATION_GRACE_S, await_crds, serve
from migpart.controller.core.metrics import Metrics
from migpart.controller.runtime.handlers import Election, OperatorConfig, operate
from migpart.kube.client import KubeconfigError, api_client, load_configuration
from migpart.kube.election import RENEW_DEADLINE_S, RETRY_PERIOD_S, new_identity
from migpart.kube.election_lease import DEFAULT_NAMESPACE, LEASE_NAME
from migpart.kube.election_lease import LEASE_DURATION_S as ELECTION_LEASE_S

log = structlog.get_logger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace(env: dict[str, str] | None = None, path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The operator's namespace: $POD_NAMESPACE (the Downward API), else the service account's
    namespace file, else migpart-system."""
    value = (env if env is not None else dict(os.environ)).get("POD_NAMESPACE", "").strip()
    if value:
        return value
    with contextlib.suppress(OSError):
        value = path.read_text().strip()
    return value or DEFAULT_NAMESPACE


def _seconds(text: str) -> float:
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a number of seconds >= 0")
    return value


def _node_selector(text: str) -> LabelSelector:
    try:
        return parse_node_selector(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="migpart operator", description=__doc__)
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file (default: in-cluster, else $KUBECONFIG)",
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        default=8080,
        help="port for /metrics, /healthz, /readyz (0 disables)",
    )
    p.add_argument("--log-level", type=log_level, default="INFO", help="DEBUG, INFO, WARNING, ...")
    p.add_argument(
        "--log-json",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="JSON log lines (default: JSON unless stderr is a terminal)",
    )
    p.add_argument(
        "--tick-seconds",
        type=_number,
        default=1.0,
        help="how often policies are re-evaluated without any change",
    )
    p.add_argument(
        "--withdraw-grace-seconds",
        type=_seconds,
        default=1.0,
        help="destroy protocol: wait this long after withdrawing devices from a slice before "
        "confirming that no claim holds them (covers kube-scheduler cycles still in flight)",
    )
    p.add_argument(
        "--lease-namespace",
        default=LEASE_NAMESPACE,
        help="namespace of the agents' heartbeat Leases (migpart-<node>)",
    )
    p.add_argument(
        "--lease-timeout-seconds",
        type=_positive_seconds,
        default=float(LEASE_DURATION_S),
        help="a node whose agent Lease was not renewed for this long is unavailable: nothing is "
        "planned there, its maxConcurrentNodes slot is free and its slice lists no device",
    )
    p.add_argument(
        "--registration-grace-seconds",
        type=_seconds,
        default=REGISTRATION_GRACE_S,
        help="a node whose agent reported kubelet's plugin registration and then reports it "
        "not registered (a restarted agent, until kubelet registers it again) keeps its devices "
        "published this long, while its Lease is fresh (0: none)",
    )
    p.add_argument(
        "--offer-publishing",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("MIGPART_OFFER_PUBLISHING"),
        help="offer mode (docs/offer-mode.md): nodes of a policy whose allocation in effect is "
        "Offer (Kubernetes 1.36+) publish one stable pool of every placement, and the agent "
        "makes the allocated placement's instance when kubelet prepares the claim (default: "
        "off, or $MIGPART_OFFER_PUBLISHING=true; every policy then runs Reactive)",
    )
    p.add_argument(
        "--node-selector",
        type=_node_selector,
        default=DEFAULT_NODE_SELECTOR,
        metavar="KEY=VALUE[,KEY[=VALUE]...]",
        help="the Nodes migpart manages: those whose labels match (equality, or a bare key for "
        "'the label exists'); no device is published and nothing planned on any other, so that "
        "a node opts in when it is labelled (default: "
        f"{DEFAULT_NODE_SELECTOR}, the label the agent's DaemonSet selects; '' for every node "
        "with an agent)",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect a leader with a Lease, so that several operators can run and only one writes "
        "(default: on; --no-leader-elect: run exactly one operator)",
    )
    p.add_argument(
        "--leader-elect-namespace",
        default=None,
        help="namespace of the election Lease (default: $POD_NAMESPACE, else the service "
        f"account's namespace, else {DEFAULT_NAMESPACE})",
    )
    p.add_argument("--leader-elect-lease-name", default=LEASE_NAME, help=argparse.SUPPRESS)
    # tests and the chaos harness name their operators; by default hostname + random
    p.add_argument("--leader-elect-identity", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--leader-elect-lease-duration",
        type=_positive_seconds,
        default=ELECTION_LEASE_S,
        help="a standby takes the Lease when it has not seen it renewed for this long",
    )
    p.add_argument(
        "--leader-elect-renew-deadline",
        type=_positive_seconds,
        default=RENEW_DEADLINE_S,
        help="the leader stops writing when it could not renew the Lease for this long",
    )
    p.add_argument(
        "--leader-elect-retry-period",
        type=_positive_seconds,
        default=RETRY_PERIOD_S,
        help="how often the Lease is renewed, or tried by a standby",
    )
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.leader_elect and not (
        args.leader_elect_retry_period
        < args.leader_elect_renew_deadline
        < args.leader_elect_lease_duration
    ):
        p.error(
            "--leader-elect-retry-period < --leader-elect-renew-deadline < "
            "--leader-elect-lease-duration is required: the leader must stop writing before a "
            "standby may take over"
        )
    return args


def election(args: argparse.Namespace) -> Election | None:
    if not args.leader_elect:
        return None
    return Election(
        namespace=args.leader_elect_namespace or own_namespace(),
        name=args.leader_elect_lease_name,
        identity=args.leader_elect_identity or new_identity(),
        lease_duration_s=args.leader_elect_lease_duration,
        renew_deadline_s=args.leader_elect_renew_deadline,
        retry_s=args.leader_elect_retry_period,
    )


def _env_flag(name: str, env: dict[str, str] | None = None) -> bool:
    """A boolean environment variable: true, 1 or yes (any case) is on, anything else off."""
    value = (env if env is not None else dict(os.environ)).get(name, "")
    return value.strip().lower() in {"true", "1", "yes"}


def _positive_seconds(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a number of seconds > 0")
    return value


class _Memo(kopf.Memo):
    """The memo that startup fills in (see migpart.controller.core.state)."""


async def run(args: argparse.Namespace) -> None:
    # A missing or broken kubeconfig fails here, before anything listens or starts.
    client_config = await load_configuration(args.kubeconfig)
    metrics = Metrics()
    ready = asyncio.Event()
    served = asyncio.Event()  # migpart's CRDs are served
    runner = None
    if args.metrics_port:
        runner = await serve(args.metrics_port, metrics.registry, ready, served=served)
    memo = _Memo()
    config = OperatorConfig(
        kubeconfig=args.kubeconfig,
        metrics=metrics,
        clock=RealClock(),
        tick_s=args.tick_seconds,
        withdraw_grace_s=args.withdraw_grace_seconds,
        lease_namespace=args.lease_namespace,
        lease_timeout_s=args.lease_timeout_seconds,
        registration_grace_s=args.registration_grace_seconds,
        served=served,
        election=election(args),
        offer_publishing=args.offer_publishing,
        node_selector=args.node_selector,
    )
    try:
        # kopf resolves the resources of its handlers when it starts; a CRD that is
        # Established only later is not always picked up (its watch then never starts), so
        # kopf starts once the CRDs are served. Until then /readyz says what it waits for.
        async with api_client(client_config) as api:
            await await_crds(api, served, config.clock)
        await operate(config, memo, ready)
    finally:
        if runner is not None:
            await runner.cleanup()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level, json=args.log_json)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run(args))
    except KubeconfigError as err:
        print(f"migpart operator: {err}", file=sys.stderr)
        return 2
    return 0
