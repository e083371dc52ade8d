"""Every metric that the packaged alerts and the Grafana dashboard query is exported by a real
`migpart operator` and a real `migpart agent` process on the testbed, read from their
/metrics endpoints as Prometheus scrapes them.

Metrics are declared on each process's registry at start, and the series whose labels are
known up front are created at zero (docs/monitoring.md, "Series that exist before anything
happened"), so the check does not depend on which events happened to occur: each queried
name must have samples, except the few whose labels only an event gives (EVENT_LABELLED),
which must at least be declared (`# TYPE`). A policy with a spare makes the operator plan and
the agent create an instance, so that the per-profile instance series exist as well.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from migpart import __version__
from migpart.demo.cluster import LocalCluster
from migpart.testbed import Testbed
from tests.integration.conftest import H100, apply, policy_body
from tests.promql import exported_names, queried_metrics, sampled_names

NODE = "monitoring-1"
POLICY = "monitoring"
LABELS = {"migpart-test": "monitoring"}
# Metrics whose labels are known only when the event happens: declared, no sample before.
EVENT_LABELLED = {
    "migpart_agent_nvml_errors_total": "`code` is the NVML return code of an error",
}
# Queried metrics that both processes export.
BOTH = {
    "migpart_build_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def exporter(name: str) -> str:
    if name in BOTH:
        return "both"
    return "agent" if name.startswith("migpart_agent_") else "operator"


@pytest.fixture
def pages(cluster: Testbed, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The /metrics pages of a running operator and agent, once the agent has created the
    policy's spare instance."""
    local = LocalCluster(cluster, tmp_path)
    local.install()  # the election Lease's namespace too: run alone, no other test made it
    operator_port, agent_port = free_port(), free_port()
    try:
        local.add_gpu_node(
            NODE,
            f"{H100}:2",
            labels=LABELS,
            kubelet=False,
            # no DRA plugin: nothing here would dial it (and its sockets' paths under the
            # test's tmp_path could pass the 107-byte limit of Unix socket paths)
            extra_args=("--metrics-port", str(agent_port), "--no-kubelet-plugin"),
        )
        local.start_operator("--metrics-port", str(operator_port))
        apply(cluster, policy_body(POLICY, LABELS, spares=[{"profile": "1g.10gb", "count": 1}]))
        local.wait_for("the operator ready", lambda: fetch(operator_port, "/readyz")[0] == 200)
        local.wait_for("the agent ready", lambda: fetch(agent_port, "/readyz")[0] == 200)
        created = f'migpart_agent_mig_operations_total{{kind="create",node="{NODE}"}} 1.0'
        counted = f'migpart_agent_mig_instances{{node="{NODE}",profile="1g.10gb",state="Free"}} 1.0'
        local.wait_for(
            "the spare instance created, and reported in the agent's status",
            lambda: all(line in fetch(agent_port, "/metrics")[1] for line in (created, counted)),
            timeout_s=120,
        )
        local.wait_for(
            "the operator's plan counted",
            lambda: (
                f'migpart_repartitions_total{{policy="{POLICY}"}} 1.0'
                in fetch(operator_port, "/metrics")[1]
            ),
        )
        yield {
            "operator": fetch(operator_port, "/metrics")[1],
            "agent": fetch(agent_port, "/metrics")[1],
        }
    finally:
        cluster.kubectl("delete", "gpupartitionpolicy", POLICY, "--ignore-not-found")
        local.remove_gpu_node(NODE)
        local.stop()
        cluster.kubectl("delete", "mignode", NODE, "--ignore-not-found", "--wait=false")


def test_every_metric_the_alerts_and_the_dashboard_query_is_exported(
    pages: dict[str, str],
) -> None:
    queried = queried_metrics()
    assert len(queried) >= 20, sorted(queried)  # the tokeniser found the queries
    declared = {who: exported_names(page) for who, page in pages.items()}
    sampled = {who: sampled_names(page) for who, page in pages.items()}
    missing, unsampled = [], []
    for name, where in sorted(queried.items()):
        who = exporter(name)
        for component in ("operator", "agent") if who == "both" else (who,):
            if name not in declared[component]:
                missing.append(f"{name} (the {component}; queried by {sorted(where)})")
            elif name not in sampled[component] and name not in EVENT_LABELLED:
                unsampled.append(f"{name} (the {component})")
    assert not missing, "not exported: " + "; ".join(missing)
    assert not unsampled, "declared but without samples: " + "; ".join(unsampled)
    for page in pages.values():
        (build,) = [ln for ln in page.splitlines() if ln.startswith("migpart_build_info{")]
        assert f'version="{__version__}"' in build
        assert build.endswith(" 1.0")
