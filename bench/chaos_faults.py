"""The chaos harness's leader-election faults, and the monitor that counts a write by an
operator that was not the leader (bench/chaos.py runs them).

- second-operator: a second `migpart operator` started next to the running one(s), stopped
  (SIGTERM) 10-40 s later; it must stay a standby and write nothing while another leads;
- operator-freeze: the leader SIGSTOPped (preferably inside the destroy protocol's window) for
  longer than its Lease, a standby taking over meanwhile (one is started for the fault if none
  runs), then SIGCONT: the woken operator must write nothing;
- agent-freeze: a node's agent SIGSTOPped past its node Lease's timeout (the node goes
  unavailable, its slice empty), then SIGCONT;
- apiserver-partition: the operators' connections to the API server dropped and refused for
  5-25 s, while the agents keep theirs. The operators talk to the API server through
  `Proxy`, a TCP forwarder in the harness (their kubeconfig names it), which can cut.

Who wrote is read from the objects: every operator sends its election identity in its user
agent, so `managedFields[].manager` says `migpart-operator-<identity>` with the time of its
latest write. `ElectionMonitor` keeps, from a watch on the Lease (every version, resumed
across API server restarts), each identity's terms, and counts every write stamped outside
them as a non-leader write: after a term's last renewal, its holder may write for the
fence's renew deadline and no longer.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import math
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.kube.election import MANAGER_PREFIX, RENEW_DEADLINE_S
from migpart.kube.election_lease import DEFAULT_NAMESPACE, LEASE_DURATION_S, LEASE_NAME

ELECTION_FAULTS = ("second-operator", "operator-freeze", "agent-freeze", "apiserver-partition")
LEASE = LEASE_NAME
LEASE_NAMESPACE = DEFAULT_NAMESPACE
MANAGER = MANAGER_PREFIX
OPERATOR_LEASE_S = LEASE_DURATION_S  # the operators' --leader-elect-lease-duration (default)
AGENT_LEASE_S = 25.0  # the operator's --lease-timeout-seconds for the agents (its default)
SLACK_S = 2.0
# a write is judged once this old: the watch may deliver the renewal it follows late
SETTLE_S = 15.0


class Proxy:
    """A TCP forwarder to the API server on a thread of its own; `cut(s)` closes every open
    connection and refuses new ones for `s` seconds."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._until = 0.0
        self._open: set[asyncio.StreamWriter] = set()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, family=socket.AF_INET)
        )
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._until:
            writer.close()  # refused: the partition lasts
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._open |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._open -= {writer, up_writer}

    def cut(self, seconds: float) -> None:
        def drop() -> None:
            self._until = time.monotonic() + seconds
            for writer in list(self._open):
                writer.transport.abort()
            self._open.clear()

        self.loop.call_soon_threadsafe(drop)

    def kubeconfig(self, original: Path, path: Path) -> Path:
        """`original` with its server pointed at this proxy (same host: the certificate holds)."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            server = cluster["cluster"]["server"]
            scheme, rest = server.split("://", 1)
            host = rest.split("/", 1)[0].rsplit(":", 1)[0]
            cluster["cluster"]["server"] = f"{scheme}://{host}:{self.port}"
        path.write_text(yaml.safe_dump(config))
        return path


async def _raw(call: Any, *args: Any) -> dict[str, Any]:
    """A GET or LIST as plain JSON (managedFields as the API server wrote them)."""
    response = await call(*args, _preload_content=False)
    try:
        body: dict[str, Any] = await response.json()
    finally:
        response.release()
    if response.status >= 300:
        raise ApiException(status=response.status, reason=str(body)[:200])
    return body


def _epoch(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def _micro_epoch(stamp: Any) -> float | None:
    """A Lease's MicroTime (`2026-11-25T20:26:51.189000Z`) in epoch seconds; None if absent."""
    if not isinstance(stamp, str) or not stamp:
        return None
    whole, _, fraction = stamp.removesuffix("Z").partition(".")
    return _epoch(whole + "Z") + (float("0." + fraction) if fraction else 0.0)


@dataclass
class ElectionMonitor:
    """The terms each operator identity held the election Lease for, from every version of the
    Lease (`ElectionFaults.follow` watches it), and the writes stamped outside them.

    A term is (holder, acquireTime). The fence's contract (kube/election.py) is that a holder
    writes only until `renew_deadline` after the start of its last successful renewal, whose
    wall time the record's `renewTime` is: a write by `identity` at `t` is the leader's when
    one of its terms has `acquireTime <= t <= renewTime + RENEW_DEADLINE_S` (with the slack
    of the managedFields' one-second resolution). No polling decides it, so a term that began
    and ended while the harness was busy elsewhere is still known. A write is judged once
    `SETTLE_S` old (the watch may deliver the renewal before it late), and all at the end."""

    # (identity, acquired epoch s) -> the latest renewTime seen of that term (epoch s)
    terms: dict[tuple[str, float], float] = field(default_factory=dict)
    last_holder: str = ""
    # (identity, object name, managedFields time) -> epoch s: every write seen
    writes: dict[tuple[str, str, str], float] = field(default_factory=dict)
    violations: set[str] = field(default_factory=set)

    def lease_seen(self, spec: dict[str, Any], now: float) -> None:
        """One version of the Lease, seen at `now` (its times where the record has them)."""
        holder = str(spec.get("holderIdentity") or "")
        self.last_holder = holder
        if not holder:
            return
        acquired = _micro_epoch(spec.get("acquireTime"))
        renewed = _micro_epoch(spec.get("renewTime"))
        key = (holder, acquired if acquired is not None else now)
        self.terms[key] = max(self.terms.get(key, 0.0), renewed if renewed is not None else now)

    def leading_at(self, identity: str, at: float) -> bool:
        return any(
            start - SLACK_S - 1 <= at <= renewed + RENEW_DEADLINE_S + SLACK_S
            for (holder, start), renewed in self.terms.items()
            if holder == identity
        )

    def writes_seen(self, bodies: list[dict[str, Any]]) -> None:
        for body in bodies:
            name = (body.get("metadata") or {}).get("name", "")
            for entry in (body.get("metadata") or {}).get("managedFields") or []:
                manager = str(entry.get("manager", ""))
                if manager.startswith(MANAGER) and entry.get("time"):
                    identity = manager.removeprefix(MANAGER)
                    self.writes[(identity, name, entry["time"])] = _epoch(entry["time"])

    def judge(self, now: float = math.inf) -> set[str]:
        """The writes older than `SETTLE_S` at `now` (all by default) not made in a term of
        their writer: added to `violations`, which is returned."""
        for (identity, name, stamp), at in list(self.writes.items()):
            if at <= now - SETTLE_S:
                del self.writes[(identity, name, stamp)]
                if not self.leading_at(identity, at):
                    self.violations.add(f"{identity} wrote {name} at {stamp}")
        return self.violations


class MainOperator:
    """The harness's own operator (`LocalCluster.start_operator`), named for the election
    monitor: a new name per start, as a new process is a new candidate. `flags` go to every
    operator the harness starts (`--offer-publishing` with `--offer`)."""

    def __init__(self, flags: tuple[str, ...] = ()) -> None:
        self.starts = 0
        self.identity = ""
        self.flags = flags

    def start(self, cluster: Any) -> None:
        self.starts += 1
        self.identity = f"operator-main-{self.starts}"
        cluster.start_operator("--leader-elect-identity", self.identity, *self.flags)


class ElectionFaults:
    """The faults above, on a `Chaos` (bench/chaos_harness.py) whose cluster runs its operators
    through `proxy`."""

    def __init__(self, chaos: Any, proxy: Proxy, main: MainOperator) -> None:
        self.chaos = chaos
        self.proxy = proxy
        self.main = main
        self.monitor = ElectionMonitor()
        self._spawned = 0

    @property
    def cluster(self) -> Any:
        return self.chaos.cluster

    async def follow(self, coordination: Any) -> None:
        """Every version of the Lease into the monitor, for as long as the harness runs: a
        watch resumed at the last version seen, read again when the API server has no
        history that old (410) or the Lease does not exist yet."""
        version = ""
        while True:
            try:
                if not version:
                    lease = await _raw(coordination.read_namespaced_lease, LEASE, LEASE_NAMESPACE)
                    self.monitor.lease_seen(lease.get("spec") or {}, time.time())
                    version = lease["metadata"]["resourceVersion"]
                async with watch.Watch() as stream:
                    async for event in stream.stream(
                        coordination.list_namespaced_lease,
                        LEASE_NAMESPACE,
                        field_selector=f"metadata.name={LEASE}",
                        resource_version=version,
                        timeout_seconds=60,
                    ):
                        raw = event.get("raw_object") or {}
                        if event.get("type") == "ERROR":
                            version = ""
                            break
                        self.monitor.lease_seen(raw.get("spec") or {}, time.time())
                        version = raw["metadata"]["resourceVersion"]
            except ApiException as err:
                if err.status == 410:
                    version = ""
                await asyncio.sleep(0.5)
            except (aiohttp.ClientError, TimeoutError, OSError):
                await asyncio.sleep(0.5)  # the API server restarts: resume at `version`

    async def look(self, resource: Any) -> None:
        """One look at the writes (the chaos monitor calls it every pass)."""
        slices = await _raw(resource.list_resource_slice)
        self.monitor.writes_seen([*self.chaos.mignodes.values(), *slices.get("items", [])])
        self.monitor.judge(time.time())

    def _spawn(self, role: str) -> str:
        self._spawned += 1
        name = f"operator-{role}-{self._spawned}"
        self.cluster.spawn_operator(name, "--leader-elect-identity", name, *self.main.flags)
        return name

    def _leader_pid(self) -> tuple[str, int] | None:
        """The process holding the Lease now, if it still runs (the main operator's process
        is "operator" in `LocalCluster.operators`)."""
        holder = self.monitor.last_holder
        procs = self.cluster.operators()
        name = "operator" if holder and holder == self.main.identity else holder
        if name in procs:
            return holder, procs[name].pid
        return None

    async def inject(self, kind: str) -> None:
        rng = self.chaos.rng
        notes = self.chaos.c.notes
        if kind == "second-operator":
            name = self._spawn("second")
            run_s = rng.uniform(10.0, 40.0)
            notes.append(f"second-operator {name} for {run_s:.0f} s")
            await asyncio.sleep(run_s)
            await asyncio.to_thread(self.cluster.end_operator, name)
        elif kind == "operator-freeze":
            standby = self._spawn("standby")
            await asyncio.sleep(5.0)  # its watches listed: a warm standby
            inside = await self.chaos._wait_for(self.chaos._in_destroy_window, 20.0)
            leader = self._leader_pid()
            if leader is None:
                notes.append("operator-freeze (no leader seen)")
                await asyncio.to_thread(self.cluster.end_operator, standby)
                return
            holder, pid = leader
            frozen_s = OPERATOR_LEASE_S + 7.0
            os.killpg(pid, signal.SIGSTOP)
            where = "in window" if inside else "outside"
            notes.append(f"operator-freeze {holder} for {frozen_s:.0f} s ({where})")
            try:
                await asyncio.sleep(frozen_s)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGCONT)
            await asyncio.sleep(10.0)  # the woken one runs on: nothing it writes may land
            await asyncio.to_thread(self.cluster.end_operator, standby)
        elif kind == "agent-freeze":
            busy = await self.chaos._wait_for(self.chaos._reconfiguring, 15.0)
            choices = self.chaos._reconfiguring() if busy else sorted(self.cluster.nodes)
            node = rng.choice(choices)
            proc = self.cluster.nodes[node].proc
            if proc is None:
                return
            frozen_s = AGENT_LEASE_S + rng.uniform(3.0, 10.0)
            os.killpg(proc.pid, signal.SIGSTOP)
            notes.append(
                f"agent-freeze {node} for {frozen_s:.0f} s ({'mid-spec' if busy else 'idle'})"
            )
            try:
                await asyncio.sleep(frozen_s)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
        elif kind == "apiserver-partition":
            cut_s = rng.uniform(5.0, 25.0)
            self.proxy.cut(cut_s)
            notes.append(f"apiserver-partition (operators cut off {cut_s:.0f} s)")
            await asyncio.sleep(cut_s)
        else:
            raise ValueError(kind)
