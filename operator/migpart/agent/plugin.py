"""The DRA kubelet plugin: kubelet asks it to prepare claims before a pod's containers start.

Two gRPC servers on unix sockets, as kubelet expects them:
- registration (pluginregistration v1) in kubelet's plugins_registry directory: kubelet finds
  the socket, calls GetInfo and learns the driver name and the DRA endpoint;
- the DRA node service (`v1.DRAPlugin` and `v1beta1.DRAPlugin`, kubelet 1.34 speaks both) on
  the endpoint: NodePrepareResources / NodeUnprepareResources.

Preparing a claim = reading its allocation from the API server, mapping each allocated device
(`gpu-<i>-<profile>-<start>`) to the MIG instance NVML shows, writing a CDI spec, recording the
claim in the checkpoint (from then on the instance is never destroyed) and returning the CDI ids.
Both calls are idempotent: kubelet retries them and calls them again after restarts.

Offer mode: a claim may be allocated a placement whose instance does not exist yet. Where the
API server serves binding conditions, the pod is bound only once the instance exists; where it
does not, kubelet may ask to prepare such a claim first, and the placement is created then,
under the same guard as the reconciler's (`reconciler.create_locked`: never over an instance
that exists, nothing destroyed to make room). On an offering node (a stable pool with counters)
the free instances in its way are destroyed first, and a placement whose prepares keep failing
is reported for the operator to taint (`migpart.agent.failures`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from migpart.agent.cdi import CdiDevice, CdiWriter, cdi_id, cdi_name
from migpart.agent.checkpoint import (
    Checkpoint,
    PreparedClaim,
    PreparedDevice,
    owner_only_dir,
)
from migpart.agent.claims import ClaimNotFound, ClaimSource
from migpart.agent.failures import PlacementFailures
from migpart.agent.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from migpart.agent.reconciler import (
    OpKind,
    create_locked,
    is_lost,
    make_placement_locked,
    overlapping,
)
from migpart.api.models import KubeletPluginStatus
from migpart.errors import MigpartError, NvmlFailure
from migpart.mig import Instance, device_name
from migpart.slices.dra import DRIVER, DeviceId, ours

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from migpart.agent.backend import MigInstance, NvmlBackend
    from migpart.agent.reconciler import Failure
    from migpart.mig import ModelTable

log = structlog.get_logger("migpart.agent.plugin")

SUPPORTED_VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


class PrepareError(Exception):
    """A claim cannot be prepared (yet); the message goes back to kubelet, which retries."""


class AwaitingUnprepare(PrepareError):
    """An instance prepared for another claim is in the placement's way: kubelet will
    unprepare that claim (the scheduler freed its counters once its pod was gone)."""


# How long a prepare waits for kubelet to unprepare the claim whose instance is in its way,
# before it fails and kubelet retries: kubelet's retries back off (tens of seconds after a
# few), while the unprepare of a stopping pod's claim usually comes within a second or two.
UNPREPARE_WAIT_S = 20.0


class DraDriver:
    """Prepare/unprepare logic, independent of the gRPC API version."""

    def __init__(
        self,
        node: str,
        backend: NvmlBackend,
        claims: ClaimSource,
        checkpoint: Checkpoint,
        cdi: CdiWriter,
        on_change: Callable[[], None] | None = None,
        offering: Callable[[], bool] = lambda: False,
        counted: Callable[[OpKind], None] = lambda kind: None,
        failures: PlacementFailures | None = None,
        unprepare_wait_s: float = 0.0,
    ) -> None:
        self.on_change = on_change  # tells the agent loop to report the new instance states
        # whether the node's MigNode spec says Offer (`MigNodeSpec.allocation`): its pool
        # lists every placement with counters, so prepare may destroy free instances in the way
        self.offering = offering
        self.counted = counted  # an instance created or destroyed here (the agent's metric)
        # how long a prepare waits for another claim's unprepare (`AwaitingUnprepare`)
        self.unprepare_wait_s = unprepare_wait_s
        self._unprepares = 0
        self._unprepared = asyncio.Event()
        self.node = node
        self.backend = backend
        self.claims = claims
        self.checkpoint = checkpoint
        self.cdi = cdi
        # an offering node's failed prepares per placement (shared with the agent loop, which
        # reports and retries the placements that keep failing)
        self.failures = failures if failures is not None else PlacementFailures(node, checkpoint)

    async def _instances(self) -> dict[DeviceId, tuple[MigInstance, int]]:
        """Device -> (complete MIG instance, GPU minor) for every instance on the node."""
        out = {}
        for gpu in await self.backend.gpus():
            if not gpu.mig_enabled or gpu.lost:  # a lost GPU's devices cannot be prepared
                continue
            for inst in await self.backend.instances(gpu.index):
                if inst.ci_id is not None and inst.uuid:
                    device = DeviceId.of(self.node, gpu.index, inst.profile, inst.start)
                    out[device] = (inst, gpu.minor)
        return out

    async def _create_placement(self, device: str) -> None:
        """Create the MIG instance that `device` names if it is a placement on one of the
        node's GPUs (caller holds the checkpoint lock); raise PrepareError when it is none or
        cannot be created. On an offering node, free instances in the way are destroyed first
        (`make_room_locked`); elsewhere nothing is destroyed to make room."""
        for gpu in await self.backend.gpus():
            if not gpu.mig_enabled or gpu.lost:
                continue
            table = await self.backend.profile_table(gpu.index)
            for profile in table.profiles:
                for start in profile.placements:
                    if device_name(gpu.index, profile.name, start) != device:
                        continue
                    inst = Instance(profile.name, start)
                    if self.offering():
                        failure = await self._make_placement(table, gpu.index, inst)
                        if failure is not None and failure.reason == "Overlap":
                            # in use in the way: its claim may be unprepared in a moment
                            why = f"device {device} not created yet: {failure.message}"
                            if self._unprepare_pending(table, gpu.index, inst):
                                raise AwaitingUnprepare(why)
                            raise PrepareError(why)
                    else:
                        failure = await create_locked(self.backend, table, gpu.index, inst)
                    if failure is not None:
                        raise PrepareError(f"device {device} not created: {failure.message}")
                    self.counted("create")
                    log.info("placement_created_at_prepare", node=self.node, device=device)
                    return
        raise PrepareError(f"device {device} does not exist on node {self.node}")

    async def _make_placement(self, table: ModelTable, gpu: int, inst: Instance) -> Failure | None:
        """An offering node's placement made (`make_placement_locked`); a failure, NVML's
        errors included (a lost GPU's aside), is counted against the placement, and a report
        it makes or changes is told to the agent loop."""
        placement = (gpu, inst.profile, inst.start)
        try:
            failure = await make_placement_locked(
                self.backend,
                self.checkpoint,
                table,
                gpu,
                inst,
                destroyed=lambda: self.counted("destroy"),
            )
        except NvmlFailure as err:
            if not is_lost(err) and self.failures.failed(placement, "NvmlError", str(err)):
                self._changed()
            raise
        if failure is None:
            self.failures.worked(placement)
        elif self._unprepare_pending(table, gpu, inst):
            # another claim's instance, prepared, is in the way: kubelet unprepares that claim
            # (its pod is going: the scheduler freed its counters) and retries this one, so
            # the placement is not failing; counted, three tries could evict a pod for nothing
            pass
        elif self.failures.failed(placement, failure.status.reason, failure.message):
            self._changed()
        return failure

    def _unprepare_pending(self, table: ModelTable, gpu: int, inst: Instance) -> bool:
        """Whether an instance in `inst`'s way on `gpu` is prepared for a claim."""
        prepared = [Instance(p, s) for g, p, s in self.checkpoint.prepared() if g == gpu]
        return overlapping(table, prepared, inst) is not None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        """Prepare the claim (`_prepare_once`); where another claim's prepared instance is in
        the way, wait up to `unprepare_wait_s` for kubelet to unprepare it (without the lock:
        the unprepare takes it) and try again, rather than fail into kubelet's back-off."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.unprepare_wait_s
        while True:
            seen = self._unprepares
            try:
                return await self._prepare_once(claim)
            except AwaitingUnprepare:
                left_s = deadline - loop.time()
                if left_s <= 0:
                    raise
                if self._unprepares != seen:
                    continue  # an unprepare came meanwhile: try again at once
                log.info("prepare_awaits_unprepare", claim=f"{claim.namespace}/{claim.name}")
                self._unprepared.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._unprepared.wait(), left_s)

    async def _prepare_once(self, claim: ClaimRef) -> list[PreparedDevice]:
        done = self.checkpoint.get(claim.uid)
        if done is not None:
            return list(done.devices)
        try:
            allocated = ours(
                await self.claims.allocation(claim.namespace, claim.name, claim.uid), pool=self.node
            )
        except ClaimNotFound as err:
            raise PrepareError(str(err)) from err
        async with self.checkpoint.lock:  # no destroy can run between the check and the record
            done = self.checkpoint.get(claim.uid)
            if done is not None:
                return list(done.devices)
            present = await self._instances()
            missing = [a for a in allocated if a.id not in present]
            for a in missing:
                await self._create_placement(a.device)
            if missing:
                present = await self._instances()
            devices: list[PreparedDevice] = []
            cdi_devices: list[CdiDevice] = []
            for a in allocated:
                found = present.get(a.id)
                if found is None:
                    raise PrepareError(f"device {a.device} does not exist on node {self.node}")
                inst, minor = found
                name = cdi_name(claim.uid, a.device)
                assert inst.ci_id is not None
                cdi_devices.append(CdiDevice(name, minor, inst.gi_id, inst.ci_id, inst.uuid))
                devices.append(
                    PreparedDevice(
                        a.device,
                        inst.gpu,
                        inst.profile,
                        inst.start,
                        inst.uuid,
                        cdi_id(name),
                        (a.request,),
                        a.pool,
                    )
                )
            self.cdi.write(claim.uid, cdi_devices)
            self.checkpoint.put(
                PreparedClaim(claim.uid, claim.namespace, claim.name, tuple(devices))
            )
            for d in devices:  # a warm instance too: the placement works
                self.failures.worked((d.gpu, d.profile, d.start))
        self._changed()
        log.info(
            "claim_prepared",
            claim=f"{claim.namespace}/{claim.name}",
            uid=claim.uid,
            devices=[d.device for d in devices],
        )
        return devices

    async def unprepare(self, claim: ClaimRef) -> None:
        async with self.checkpoint.lock:
            self.cdi.remove(claim.uid)
            self.checkpoint.remove(claim.uid)
        self._unprepares += 1
        self._unprepared.set()
        self._changed()
        log.info("claim_unprepared", claim=f"{claim.namespace}/{claim.name}", uid=claim.uid)


def _make_servicer(pb2: Any, base: type) -> type:
    """A DRAPlugin servicer for one API version (v1 and v1beta1 share messages)."""

    class Servicer(base):  # type: ignore[misc]
        def __init__(self, driver: DraDriver) -> None:
            self.driver = driver

        async def NodePrepareResources(self, request: Any, context: Any) -> Any:
            response = pb2.NodePrepareResourcesResponse()
            for c in request.claims:
                out = response.claims[c.uid]
                try:
                    devices = await self.driver.prepare(ClaimRef(c.namespace, c.uid, c.name))
                except (PrepareError, MigpartError) as err:
                    out.error = str(err)
                    log.warning(
                        "claim_prepare_failed", claim=f"{c.namespace}/{c.name}", error=str(err)
                    )
                    continue
                for d in devices:
                    out.devices.append(
                        pb2.Device(
                            request_names=list(d.requests),
                            pool_name=d.pool,
                            device_name=d.device,
                            cdi_device_ids=[d.cdi_id],
                        )
                    )
            return response

        async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            response = pb2.NodeUnprepareResourcesResponse()
            for c in request.claims:
                out = response.claims[c.uid]
                try:
                    await self.driver.unprepare(ClaimRef(c.namespace, c.uid, c.name))
                except OSError as err:
                    out.error = str(err)
            return response

    return Servicer


V1Servicer = _make_servicer(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer)
V1beta1Servicer = _make_servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer)


class RegistrationServicer(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    """Tells kubelet who we are and where the DRA service listens, and keeps what kubelet
    answered (`NotifyRegistrationStatus`): the agent reports it in its MigNode status, and the
    operator publishes the node's devices only while the plugin is registered."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered: bool | None = None
        self.error = ""
        self.on_change: Callable[[], None] | None = None  # the agent reports the new status

    def status(self) -> KubeletPluginStatus:
        """What the MigNode status says: not registered until kubelet says it is."""
        if self.registered is None:
            return KubeletPluginStatus(
                registered=False, message="waiting for kubelet to register the plugin"
            )
        return KubeletPluginStatus(registered=self.registered, message=self.error[:1024])

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=self.endpoint,
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.registered = bool(request.plugin_registered)
        self.error = str(request.error)
        log.info("plugin_registration_notified", registered=self.registered, error=self.error)
        if self.on_change is not None:
            self.on_change()
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


class KubeletPlugin:
    """Both gRPC servers; `start()` binds the sockets, `stop()` removes them."""

    def __init__(self, driver: DraDriver, plugin_dir: Path, registration_dir: Path) -> None:
        self.driver = driver
        self.plugin_socket = plugin_dir / "dra.sock"
        self.registration_socket = registration_dir / f"{DRIVER}-reg.sock"
        self.registration = RegistrationServicer(str(self.plugin_socket))
        self._servers: list[grpc.aio.Server] = []

    async def start(self) -> None:
        dra = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(V1Servicer(self.driver), dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(V1beta1Servicer(self.driver), dra)
        reg = grpc.aio.server()
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        # The registration socket goes last: once kubelet sees it, the endpoint must answer.
        # Both sockets are owner-only (0600): whoever can connect can prepare claims. The
        # plugin directory is the driver's own (0700); the registration directory is shared
        # with other plugins, so its mode is left alone and the umask covers the instant
        # between bind and chmod.
        owner_only_dir(self.plugin_socket.parent)
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        for server, socket in ((dra, self.plugin_socket), (reg, self.registration_socket)):
            socket.unlink(missing_ok=True)  # a stale socket from a previous run
            umask = os.umask(0o077)
            try:
                server.add_insecure_port(f"unix://{socket}")
            finally:
                os.umask(umask)
            os.chmod(socket, 0o600)
            await server.start()
            self._servers.append(server)
        log.info(
            "kubelet_plugin_started",
            endpoint=str(self.plugin_socket),
            registration=str(self.registration_socket),
        )

    async def stop(self) -> None:
        for server in reversed(self._servers):
            await server.stop(grace=1.0)
        self._servers.clear()
        for socket in (self.registration_socket, self.plugin_socket):
            with contextlib.suppress(FileNotFoundError):
                socket.unlink()
