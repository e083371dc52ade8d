"""MigNodes, followed by the operator's own watch (`kube.watch`), not kopf's.

Every agent status write, every spec the operator writes and every `Stale` condition comes
back as a MigNode event: thousands in a burst at 1,000 nodes. `MigNodeWatch` keeps the
`mignodes_index` the planning rounds read (a `kube.watch.Index`) and, per event:

- parses the MigNode once per resourceVersion (`ScopeCache.node`, shared with the rounds);
- tells node health what the agent says about kubelet's plugin registration and about other
  publishers of the node's GPUs (`PublisherOverlap`), and whether the MigNode carries `Stale`;
- writes, while leading, a spec the agent refused (an older leadership's, `decisions.
  refused_spec_repair`) over with what the agent has;
- publishes the node's ResourceSlice (`SlicePublisher`), in a task of its own: once the
  slice watch has listed (so that the publisher knows every slice and never creates one that
  exists), while `OperatorState.publishing`, at most PUBLISH_CONCURRENCY at once. A failed
  write is logged; the periodic resync writes it. The slice watch hands a deleted slice to
  `publish` too, so every slice write of a node goes through its one task.

A MigNode deleted, or gone from a new list, is forgotten by the publisher and node health.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.models import (
    GROUP,
    MIGNODE_PLURAL,
    PUBLISHER_OVERLAP,
    VERSION,
    MigNode,
    MigNodeSpec,
    condition_of,
    condition_status,
)
from migpart.controller.core.bodies import name_of
from migpart.controller.core.decisions import refused_spec_repair
from migpart.controller.core.state import OperatorState
from migpart.controller.watching.indexes import object_entry
from migpart.errors import MigpartError
from migpart.kube.leases import STALE
from migpart.kube.watch import Index, follow
from migpart.types import Body

log = structlog.get_logger(__name__)

PUBLISH_CONCURRENCY = 32


class MigNodeWatch(Index):
    """The `mignodes_index`, and what each MigNode event does besides (module docstring)."""

    def __init__(self, state: OperatorState, slices_listed: asyncio.Event) -> None:
        super().__init__(object_entry, state.wake_all)
        self.state = state
        self._slices_listed = slices_listed
        self._publishing = asyncio.Semaphore(PUBLISH_CONCURRENCY)
        self._writes: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._repairing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def listed(self, objects: Sequence[Body]) -> None:
        gone = set(self) - {name_of(o) for o in objects}
        super().listed(objects)
        for name in gone:
            self._deleted(name)
        for body in objects:
            self._seen(body)

    def changed(self, kind: str, obj: Body) -> None:
        super().changed(kind, obj)
        if kind == "DELETED":
            self._deleted(name_of(obj))
        else:
            self._seen(obj)

    def _deleted(self, name: str) -> None:
        state = self.state
        state.publisher.forget(name)
        state.health.forget(name)
        state.stale.forget(name)

    def _seen(self, body: Body) -> None:
        state, name = self.state, name_of(body)
        view = state.scopes.node(name, body)
        if view is None:
            return  # logged by the cache
        state.publisher.observe(view.node)
        status = view.node.status
        state.stale.seen(
            name, status is not None and condition_status(status.conditions, STALE) == "True"
        )
        overlap = condition_of(status.conditions, PUBLISHER_OVERLAP) if status else None
        held = overlap is not None and overlap.status == "True"
        state.health.mignode(
            name,
            status.kubelet_plugin if status else None,
            (overlap.message or overlap.reason) if held and overlap else None,
        )
        self.repair(name, view.node)
        self.publish(name)

    def repair(self, name: str, node: MigNode) -> None:
        """Replace a spec the agent refused (see `refused_spec_repair`), once per spec."""
        term = self.state.effects.term
        spec = refused_spec_repair(node, term.token if term is not None else None)
        if spec is None or not self.state.leading() or name in self._repairing:
            return
        self._repairing.add(name)
        task = asyncio.create_task(self._repair(name, spec), name=f"repair-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _repair(self, name: str, spec: MigNodeSpec) -> None:
        try:
            written = await self.state.effects.write_spec(name, spec)
            self.state.watches.written[name] = written
            log.warning("refused_spec_replaced", node=name, plan_id=spec.plan_id)
        except (ApiException, MigpartError, TimeoutError) as error:
            log.warning("refused_spec_not_replaced", node=name, error=str(error)[:300])
        finally:
            self._repairing.discard(name)

    def publish(self, name: str) -> None:
        """Publish the node's slice from the newest MigNode seen: one write task per node at a
        time; an event during a write asks for one more write after it."""
        if name in self._writes:
            self._again.add(name)
            return
        task = asyncio.create_task(self._write(name), name=f"publish-{name}")
        self._writes[name] = task

    async def _write(self, name: str) -> None:
        try:
            await self._slices_listed.wait()
            while name in self:  # not deleted meanwhile
                self._again.discard(name)
                if not self.state.publishing():
                    # a standby writes nothing, nor a new leader before it knows which nodes
                    # offer (OperatorState.publishing); taking over publishes every node
                    return
                async with self._publishing:
                    try:
                        await self.state.effects.publish(name)
                    except (ApiException, MigpartError, TimeoutError) as error:
                        log.warning(
                            "resource_slice_write_failed", node=name, error=str(error)[:300]
                        )
                if name not in self._again:
                    return
        finally:
            del self._writes[name]


async def watch_mignodes(api: ApiClient, sink: MigNodeWatch) -> None:
    """Follow every MigNode into `sink` until cancelled."""
    custom: Any = CustomObjectsApi(api)
    await follow(
        functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, MIGNODE_PLURAL),
        sink,
        MIGNODE_PLURAL,
    )
