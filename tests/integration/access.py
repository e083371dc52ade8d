"""Requests made as a service account on the testbed: real TokenRequests (bound to a pod, as
kubelet mounts them), one raw API call with a token, and the agent's pod and MigNode writes
that the admission policy judges."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from migpart.api.models import GROUP, MIGNODE_PLURAL, VERSION
from migpart.testbed import Testbed
from migpart.testing.builders import MigNodeBuilder, PodBuilder

NAMESPACE = "migpart-system"

AGENT = "migpart-agent"

MIGNODES = f"/apis/{GROUP}/{VERSION}/{MIGNODE_PLURAL}"


def agent_pod(bed: Testbed, name: str, node: str, namespace: str = NAMESPACE) -> None:
    """A pod of the agent's service account bound to `node` (it never runs: no kubelet)."""
    pod = PodBuilder(name, namespace).container("agent", "migpart:0.1.0")
    body = pod.spec(nodeName=node, serviceAccountName=AGENT).obj()
    bed.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(body))


def account_token(
    bed: Testbed, account: str, pod: str | None = None, namespace: str = NAMESPACE
) -> str:
    """A TokenRequest of `account`, bound to `pod` (as kubelet mounts it) when one is given."""
    bound = ["--bound-object-kind", "Pod", "--bound-object-name", pod] if pod else []
    return bed.kubectl("create", "token", account, "-n", namespace, *bound).strip()


def call(bed: Testbed, token: str, method: str, path: str, body: Any) -> tuple[int, str]:
    """One API request with `token`; (HTTP status, response body)."""
    request = urllib.request.Request(
        f"{bed.server}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            ),
        },
    )
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def create_mignode(bed: Testbed, token: str, node: str) -> tuple[int, str]:
    body = MigNodeBuilder(node).obj()
    return call(bed, token, "POST", MIGNODES, body)


def forbidden(result: tuple[int, str]) -> str:
    code, body = result
    assert code == 403, (code, body)
    message: str = json.loads(body)["message"]
    return message
