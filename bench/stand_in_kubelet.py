"""A light stand-in kubelet for kubelet-less testbed nodes, for bench/chaos.py only.

The demo, the e2e tests and bench/e2e_latency.py run a real kubelet per node
(migpart.testbed.kubelet). The chaos harness keeps this stand-in: it kills and restarts
agents, the operator and the API server hundreds of times, and drives pods itself.

For a pod the scheduler bound to a simulated node it does what kubelet's DRA manager does:
read the pod's allocated ResourceClaims, call `NodePrepareResources` on that node's agent over
its real gRPC unix socket, and (standing in for the container runtime) mark the pod Running.
When a pod finishes it calls `NodeUnprepareResources` first and then deletes the pod, so the
agent's checkpoint stays the truth about which MIG instances are in use. A pod deleted before
it ran (the harness's claim-delete) has the claims it tried to prepare unprepared, as kubelet
does: a prepare the agent finished while its answer was lost would otherwise hold the instance
for ever (in offer mode, while kube-scheduler hands its freed counters to another claim).
With `--offer` each prepare may make the instance (docs/offer-mode.md): nothing changes here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from kubernetes_asyncio import client

from migpart.agent.proto import dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from migpart.slices.dra import now_iso


class PrepareFailed(RuntimeError):
    pass


class SimKubelet:
    def __init__(self, api: client.ApiClient, sockets: dict[str, Path]) -> None:
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.sockets = sockets  # node name -> the agent's DRA plugin socket
        self.prepared: dict[str, list[dict[str, str]]] = {}  # pod key -> claims
        # pod key -> (node, claims) of every prepare tried and not yet unprepared
        self.tried: dict[str, tuple[str, list[dict[str, str]]]] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, node: str) -> Any:
        if node not in self._channels:
            self._channels[node] = grpc.aio.insecure_channel(f"unix://{self.sockets[node]}")
        return dra_v1beta1_pb2_grpc.DRAPluginStub(self._channels[node])

    async def _claims_of(self, pod: Any) -> list[dict[str, str]]:
        claims = []
        for status in pod.status.resource_claim_statuses or []:
            if not status.resource_claim_name:
                continue
            claim = await self.resource.read_namespaced_resource_claim(
                status.resource_claim_name, pod.metadata.namespace
            )
            claims.append(
                {
                    "namespace": claim.metadata.namespace,
                    "name": claim.metadata.name,
                    "uid": claim.metadata.uid,
                }
            )
        return claims

    async def start_pod(self, pod: Any) -> list[str]:
        """Prepare the pod's claims on its node and mark it Running; returns CDI device ids."""
        node = pod.spec.node_name
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        claims = await self._claims_of(pod)
        request = dra_v1beta1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1beta1_pb2.Claim(**c) for c in claims]
        )
        self.tried[key] = (node, claims)
        response = await self._stub(node).NodePrepareResources(request, timeout=30)
        cdi_ids: list[str] = []
        for claim in claims:
            result = response.claims[claim["uid"]]
            if result.error:
                raise PrepareFailed(f"{key}: prepare of claim {claim['name']}: {result.error}")
            cdi_ids += [i for d in result.devices for i in d.cdi_device_ids]
        self.prepared[key] = claims
        now = now_iso()
        await self.core.patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "phase": "Running",
                    "startTime": now,
                    "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    ],
                }
            },
        )
        return cdi_ids

    async def finish_pod(self, namespace: str, name: str, node: str | None) -> None:
        """Unprepare (if prepared) and delete the pod at once, as kubelet would after exit."""
        key = f"{namespace}/{name}"
        claims = self.prepared.pop(key, [])
        if claims and node:
            await self._unprepare(key, node, claims)
        self.tried.pop(key, None)
        try:
            await self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:
                raise

    async def forget_pod(self, namespace: str, name: str) -> None:
        """The pod was deleted before it ran: unprepare the claims a prepare was tried for
        (raises while its agent does not answer: call again)."""
        key = f"{namespace}/{name}"
        tried = self.tried.get(key)
        if tried is not None:
            await self._unprepare(key, *tried)
            del self.tried[key]

    async def _unprepare(self, key: str, node: str, claims: list[dict[str, str]]) -> None:
        request = dra_v1beta1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1beta1_pb2.Claim(**c) for c in claims]
        )
        response = await self._stub(node).NodeUnprepareResources(request, timeout=30)
        errors = [r.error for r in response.claims.values() if r.error]
        if errors:
            raise PrepareFailed(f"{key}: unprepare failed: {errors}")

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
