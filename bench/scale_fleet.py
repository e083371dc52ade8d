"""The fleet of bench/scale.py: every simulated node's agent in one process, on one MigNode watch.

A node's agent is the real reconcile loop (`migpart.agent.runner.Agent`: fencing by
`spec.leaderTerm`, `reconcile_once` on the simulated NVML of 8 x H100 80GB, the status it
writes, `observedPlanId` once the GPUs equal the spec) with what costs a process per node
taken out:

- one cluster-wide list+watch of MigNodes (`migpart.kube.watch.follow`: plain JSON, re-listed
  when the API server says the version is gone) instead of one watch per node. A node's loop
  is told when its spec changes (a new generation or a new object), not on each status write:
  the real agent reads the same spec again then and writes nothing;
- the node Leases renewed from one timer, a slice of the fleet every `TICK_S` so that each
  Lease is renewed every `LEASE_RENEW_S` as the agent does (`migpart.agent.lease.NodeLease.renew`:
  one PUT at the last resourceVersion), each renewal on its own (one answered late delays
  its node only), a failed one tried again at the next tick;
- one ApiClient whose connections are capped (`CONNECTIONS`): writes queue for a connection
  instead of opening a thousand;
- no kubelet plugin (no kubelet runs here, nothing is prepared: every checkpoint stays empty),
  no metrics port, no look for NVIDIA's publishers (there are none: the status says so, as the
  agent's does), and no resync timer (nothing but the spec changes a simulated GPU here).

The statuses are the real agent's: same GPU and MIG uuids (`SimulatedNvml`'s, seeded by the
node name), same conditions, same summary. NVML latency is `--latency-ms` (default 0: the
status follows the spec at once). The fleet stands for N machines, so bench/scale.py runs it
at nice -5 where it may.

It creates the MigNode of a node that has none (owned by its Node, as the agent makes it) and
makes it again when it is deleted. It exits on SIGTERM/SIGINT, and when its parent dies.

Usage (bench/scale.py starts it): `python -m bench.scale_fleet --kubeconfig K --nodes-file F
--state-dir D [--latency-ms 0]`, with one node name per line in F.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from bench.scale_cluster import GPUS_PER_NODE, H100
from bench.scale_processes import die_with_parent
from migpart import logs
from migpart.agent.checkpoint import Checkpoint
from migpart.agent.kube import (
    MERGE_PATCH,
    MIGNODE_RESOURCE,
    leader_term_of,
    spec_of,
    status_patch,
    warning_event,
)
from migpart.agent.lease import NodeLease
from migpart.agent.metrics import AgentMetrics
from migpart.agent.publishers import Overlap
from migpart.agent.runner import Agent
from migpart.agent.simulator import SimulatedNvml
from migpart.api.leases import LEASE_RENEW_S
from migpart.api.models import (
    API_VERSION,
    GROUP,
    MIGNODE_KIND,
    MIGNODE_PLURAL,
    VERSION,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.errors import ResourceNotServed
from migpart.kube.client import api_client
from migpart.kube.watch import follow
from migpart.slices.dra import now_iso
from migpart.types import Body

# One for the watch, the rest for status writes, Lease renewals and MigNode creates. A renewal
# is stamped when it is made: one that waits for a connection arrives late. At 1,000 nodes
# (100 renewals a second) with the API server answering in a second or two on a loaded
# machine, 32 connections held renewals back until Leases lapsed (N agents have N
# connections); 256 keep up with answers of up to 2.5 s.
CONNECTIONS = 256
# How often a slice of the fleet's Leases is renewed.
TICK_S = 0.5
# A fleet node's GPUs change only when its spec does: no pass on a timer.
RESYNC_S = 24 * 3600.0

log = structlog.get_logger("bench.scale_fleet")

Json = dict[str, Any]


async def read(call: Awaitable[Any]) -> Json:
    """The JSON body of a call made with `_preload_content=False`; an error status raises
    the client's `ApiException`, as a call that parses its reply would (the agent's loop
    retries on those)."""
    response = await call
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        raise ApiException(status=response.status, reason=data.decode(errors="replace")[:500])
    body: Json = json.loads(data) if data else {}
    return body


class NoOtherPublisher:
    """`PublisherProbe` of a simulated node: NVIDIA's device plugin and DRA driver never run
    here, so there is nothing to ask the API server."""

    async def overlap(self) -> Overlap | None:
        return None


class FleetMigNode:
    """`MigNodeStore` of one node, fed by the fleet's watch instead of a watch of its own."""

    def __init__(self, fleet: Fleet, node: str) -> None:
        self.fleet = fleet
        self.node = node
        self.created = 0
        self.leader_term: int | None = None
        self._uid = ""
        self._generation: object = None
        self._spec: MigNodeSpec | None = None
        self._changed = asyncio.Event()

    def seen(self, obj: Body | None) -> None:
        """The MigNode as the watch shows it (None: deleted). The loop is told when the spec
        can have changed: a new object, or a new generation of it."""
        if obj is None:
            if self._uid:
                self._uid, self._generation, self._spec = "", None, None
                self._changed.set()
                self.fleet.spawn(self.recreate(), f"recreate-{self.node}")
            return
        meta = obj.get("metadata") or {}
        key = (meta.get("uid"), meta.get("generation"))
        if key == (self._uid, self._generation):
            return  # a status write: the spec is the same
        self._uid, self._generation = str(meta.get("uid") or ""), key[1]
        self._spec = spec_of(dict(obj))
        self._changed.set()

    async def ensure(self) -> MigNodeSpec | None:
        obj: Body | None = await self.fleet.mignode(self.node)
        if obj is None:
            obj = await self.fleet.create_mignode(self.node)
            self.created += 1
        self.leader_term = leader_term_of(dict(obj))
        self.seen(obj)
        self._changed.clear()  # the loop starts with this spec
        return self._spec

    async def specs(self) -> AsyncIterator[MigNodeSpec | None]:
        while True:
            await self._changed.wait()
            self._changed.clear()
            yield self._spec

    async def recreate(self) -> None:
        """The MigNode was deleted: make it again, as the agent does, and have the loop write
        its status there (`created` changed)."""
        while True:
            try:
                await self.ensure()
            except (TimeoutError, ApiException, aiohttp.ClientError, ResourceNotServed) as err:
                log.warning("mignode_create_failed", node=self.node, error=str(err)[:200])
                await asyncio.sleep(2.0)
                continue
            self._changed.set()
            return

    async def write_status(self, status: MigNodeStatus) -> None:
        try:
            await read(
                self.fleet.custom.patch_cluster_custom_object_status(
                    GROUP,
                    VERSION,
                    MIGNODE_PLURAL,
                    self.node,
                    status_patch(status),
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                )
            )
        except ApiException as err:
            if err.status != 404:
                raise
            # deleted under us: made again, and `created` has the loop write once more
            await self.ensure()
            self._changed.set()

    async def warn(self, reason: str, message: str) -> None:
        body = warning_event(self.node, self._uid, reason, message, now_iso())
        await self.fleet.core.create_namespaced_event("default", body)


class Fleet:
    """The agents of `nodes`, on one ApiClient and one MigNode watch."""

    def __init__(
        self,
        api: ApiClient,
        nodes: Sequence[str],
        state_dir: Path,
        *,
        latency_ms: float = 0.0,
        renew_s: float = LEASE_RENEW_S,
    ) -> None:
        # Any: the generated client takes `_content_type` and `_preload_content` via **kwargs.
        self.custom: Any = CustomObjectsApi(api)
        self.core: Any = CoreV1Api(api)
        self.renew_s = renew_s
        self.stores = {node: FleetMigNode(self, node) for node in nodes}
        self.agents = [
            Agent(
                node,
                SimulatedNvml([(H100, GPUS_PER_NODE)], node=node, latency_s=latency_ms / 1000),
                Checkpoint(state_dir / node / "checkpoint.json"),
                store,
                AgentMetrics(node),
                resync_s=RESYNC_S,
                publishers=NoOtherPublisher(),
            )
            for node, store in self.stores.items()
        ]
        self.leases = [NodeLease(api, node, renew_s=renew_s) for node in nodes]
        # each Lease is in one of: due (oldest renewal first), being renewed, to retry
        self._due = collections.deque(self.leases)
        self._retry: list[NodeLease] = []
        self._failures: list[tuple[str, BaseException]] = []
        self._listed: dict[str, Body] | None = None  # the first list, until every node read it
        self._synced = asyncio.Event()
        self._node_uids: dict[str, str] | None = None
        self._nodes_lock = asyncio.Lock()
        self._spawned: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ the watch (kube.watch.Sink)

    def listed(self, objects: Sequence[Body]) -> None:
        by_name = {str(o["metadata"]["name"]): o for o in objects}
        for node, store in self.stores.items():
            store.seen(by_name.get(node))
        if not self._synced.is_set():
            self._listed = by_name
            self._synced.set()

    def changed(self, kind: str, obj: Body) -> None:
        store = self.stores.get(str(obj["metadata"]["name"]))
        if store is not None:
            store.seen(None if kind == "DELETED" else obj)

    def broken(self) -> None:
        """Changes are not seen until the next list, which tells every node what it missed."""

    async def mignode(self, node: str) -> Body | None:
        """The node's MigNode as the first list had it (None: it had none)."""
        await self._synced.wait()
        assert self._listed is not None
        return self._listed.pop(node, None)

    # ------------------------------------------------------------ MigNodes

    async def _owner(self, node: str) -> list[Json]:
        """An ownerReference to the Node, from one list of all Nodes (not a GET per node)."""
        async with self._nodes_lock:
            if self._node_uids is None:
                listed = await read(self.core.list_node(_preload_content=False))
                self._node_uids = {
                    n["metadata"]["name"]: n["metadata"]["uid"] for n in listed["items"]
                }
        uid = self._node_uids.get(node)
        if uid is None:
            log.warning("node_not_found", node=node)
            return []
        return [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]

    async def create_mignode(self, node: str) -> Json:
        """Create the node's MigNode, owned by its Node as the agent makes it (one created
        meanwhile by someone else is read instead)."""
        body = {
            "apiVersion": API_VERSION,
            "kind": MIGNODE_KIND,
            "metadata": {"name": node, "ownerReferences": await self._owner(node)},
        }
        try:
            return await read(
                self.custom.create_cluster_custom_object(
                    GROUP, VERSION, MIGNODE_PLURAL, body, _preload_content=False
                )
            )
        except ApiException as err:
            if err.status == 404:  # the collection itself: the CRD is not served
                raise ResourceNotServed(MIGNODE_RESOURCE) from err
            if err.status != 409:
                raise
        return await read(
            self.custom.get_cluster_custom_object(
                GROUP, VERSION, MIGNODE_PLURAL, node, _preload_content=False
            )
        )

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` on its own, holding on to its task until it ends."""
        task = asyncio.create_task(work, name=name)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    # ------------------------------------------------------------ Leases

    async def renew_leases(self) -> None:
        """Renew every node's Lease once per `renew_s`: each `TICK_S` start the share of the
        fleet due by then (oldest renewal first) and the renewals that failed since the last
        tick. Each renewal runs on its own, so that one the API server answers late delays
        that node's Lease only, as it would delay one agent's; a Lease is renewed by one
        request at a time. Failures are logged once per tick."""
        per_tick = len(self.leases) * TICK_S / self.renew_s
        owed = 0.0  # renewals due and not started yet (a fraction, with few nodes)
        while True:
            owed += per_tick
            take = min(int(owed), len(self._due))
            owed -= take
            batch = self._retry + [self._due.popleft() for _ in range(take)]
            self._retry = []
            for lease in batch:
                self.spawn(self._renew(lease), f"lease-{lease.node}")
            if self._failures:
                node, error = self._failures[0]
                log.warning(
                    "node_lease_renewals_failed",
                    renewals=len(self._failures),
                    first=node,
                    error=(str(error).splitlines() or [type(error).__name__])[0][:200],
                    retry="at the next tick",
                )
                self._failures = []
            await asyncio.sleep(TICK_S)

    async def _renew(self, lease: NodeLease) -> None:
        try:
            await lease.renew()
        except (TimeoutError, ApiException, aiohttp.ClientError) as err:
            self._failures.append((lease.node, err))
            self._retry.append(lease)
            return
        self._due.append(lease)

    # ------------------------------------------------------------ all of it

    async def run(self) -> None:
        """Run every node's agent, the watch and the renewals until cancelled."""
        mignodes = functools.partial(
            self.custom.list_cluster_custom_object, GROUP, VERSION, MIGNODE_PLURAL
        )
        async with asyncio.TaskGroup() as group:
            group.create_task(follow(mignodes, self, "mignodes"), name="mignode-watch")
            group.create_task(self.renew_leases(), name="leases")
            for agent in self.agents:
                group.create_task(agent.run(), name=f"agent-{agent.node}")


async def host(nodes: list[str], kubeconfig: Path, state_dir: Path, latency_ms: float) -> None:
    cfg = Configuration()
    await kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = CONNECTIONS
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if main is not None:
            loop.add_signal_handler(sig, main.cancel)
    async with api_client(cfg) as api:
        await Fleet(api, nodes, state_dir, latency_ms=latency_ms).run()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--nodes-file", type=Path, required=True, help="one node name per line")
    p.add_argument("--state-dir", type=Path, required=True, help="the nodes' checkpoints")
    p.add_argument("--latency-ms", type=float, default=0.0, help="simulated NVML latency")
    # WARNING: a thousand nodes' info lines would cost this machine what N machines'
    # logs would not
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args()
    logs.configure(args.log_level, json=True)
    nodes = args.nodes_file.read_text().split()
    die_with_parent()
    with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
        asyncio.run(host(nodes, args.kubeconfig, args.state_dir, args.latency_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
