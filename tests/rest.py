"""Reads from a testbed's API server without a kubectl process.

The suites poll: `eventually` and `wait_for` look every 0.2 s, the e2e invariant monitor lists
MigNodes and claims every 0.2 s through each test. A kubectl process costs about 0.3 s of CPU
(a 280 MB binary started, a TLS handshake), a GET on a kept-alive connection a few ms; with
two versions' suites side by side on two cores, those processes were most of the CPU.

`kubectl_get(bed, *args)` answers a plain `kubectl get KIND [NAME] [-n NS | -A] -o json`
as kubectl would (managedFields left out, list items with their kind) and hands any other
form to kubectl.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from typing import Any

from migpart.api.models import GROUP, MIGNODE_PLURAL, POLICY_PLURAL, VERSION
from migpart.testbed import Testbed, TestbedError

_MIGPART = f"/apis/{GROUP}/{VERSION}"

# kubectl's names for a resource -> (API path prefix, plural, namespaced, kind)
_RESOURCES: dict[str, tuple[str, str, bool, str]] = {}
for _names, _prefix, _plural, _namespaced, _kind in (
    (("mignode", "mignodes", "mn"), _MIGPART, MIGNODE_PLURAL, False, "MigNode"),
    (
        ("gpupartitionpolicy", "gpupartitionpolicies", "gpp"),
        _MIGPART,
        POLICY_PLURAL,
        False,
        "GpuPartitionPolicy",
    ),
    (("pod", "pods", "po"), "/api/v1", "pods", True, "Pod"),
    (("node", "nodes", "no"), "/api/v1", "nodes", False, "Node"),
    (("event", "events", "ev"), "/api/v1", "events", True, "Event"),
    (
        ("resourceclaim", "resourceclaims"),
        "/apis/resource.k8s.io/v1",
        "resourceclaims",
        True,
        "ResourceClaim",
    ),
    (
        ("resourceslice", "resourceslices"),
        "/apis/resource.k8s.io/v1",
        "resourceslices",
        False,
        "ResourceSlice",
    ),
    (("lease", "leases"), "/apis/coordination.k8s.io/v1", "leases", True, "Lease"),
):
    for _name in _names:
        _RESOURCES[_name] = (_prefix, _plural, _namespaced, _kind)


class NotFound(TestbedError):
    """The API server answered 404."""


class ApiReader:
    """GETs on one testbed's API server, over a kept-alive connection per thread."""

    # the testbed's own kubeconfig skips verification too (a self-signed loopback server)
    _TLS = ssl._create_unverified_context()

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self._local = threading.local()
        # every thread's connection, closed by `close` (a socket left to the garbage
        # collector is a ResourceWarning, an error in this suite)
        self._open: set[http.client.HTTPSConnection] = set()
        self._lock = threading.Lock()

    def get(self, path: str) -> Any:
        """The JSON body at `path`; NotFound on 404, TestbedError on any other status but
        200, after kubectl's retries: a 429 (or a 5xx with Retry-After) is tried again after the
        time the server asks for, a dropped connection (the API server restarted by a test) is
        opened again once."""
        headers = {"Authorization": f"Bearer {self.testbed.token}", "Accept": "application/json"}
        dropped = 0
        for _ in range(12):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.testbed.port, context=self._TLS, timeout=60
                )
                self._local.conn = conn
                with self._lock:
                    self._open.add(conn)
            try:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as err:
                self._drop(conn)
                dropped += 1
                if dropped == 2:
                    raise TestbedError(f"GET {path}: {err!r}") from err
                continue
            retry_after = response.getheader("Retry-After")
            if response.status == 429 or (response.status >= 500 and retry_after):
                # as kubectl (client-go) does: "storage is (re)initializing" after a start
                time.sleep(float(retry_after or 1))
                continue
            if response.status == 404:
                raise NotFound(f"GET {path}: not found")
            if response.status != 200:
                raise TestbedError(f"GET {path}: {response.status} {body[:300]!r}")
            return json.loads(body)
        raise TestbedError(f"GET {path}: still {response.status} after 12 tries")

    def _drop(self, conn: http.client.HTTPSConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open.discard(conn)

    def close_thread(self) -> None:
        """Close this thread's connection (a thread that ends calls it)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._drop(conn)

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()

    def mignodes(self) -> list[Any]:
        return list(self.get(f"{_MIGPART}/{MIGNODE_PLURAL}")["items"])

    def claims(self) -> list[Any]:
        """Every namespace's ResourceClaims."""
        return list(self.get("/apis/resource.k8s.io/v1/resourceclaims")["items"])


_readers: dict[int, ApiReader] = {}
_readers_lock = threading.Lock()


def reader(bed: Testbed) -> ApiReader:
    """The reader of `bed` (one per testbed object, made on first use)."""
    with _readers_lock:
        found = _readers.get(id(bed))
        if found is not None and found.testbed is not bed:  # an id of a testbed gone
            found.close()
            found = None
        if found is None:
            found = _readers[id(bed)] = ApiReader(bed)
        return found


def close_readers() -> None:
    """Close every reader's connections (at the end of the session)."""
    with _readers_lock:
        readers = list(_readers.values())
        _readers.clear()
    for found in readers:
        found.close()


def _path(args: tuple[str, ...]) -> tuple[str, str, bool] | None:
    """(path, kind, is a list) of a plain `get` (kind, name, namespace flags), else None."""
    words: list[str] = []
    namespace: str | None = None
    everywhere = False
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-n", "--namespace") and rest:
            namespace = rest.pop(0)
        elif arg.startswith("--namespace="):
            namespace = arg.split("=", 1)[1]
        elif arg in ("-A", "--all-namespaces"):
            everywhere = True
        elif arg.startswith("-") or "/" in arg or "," in arg:
            return None  # selectors, output flags, kind/name: kubectl's
        else:
            words.append(arg)
    if not 1 <= len(words) <= 2 or words[0] not in _RESOURCES:
        return None
    prefix, plural, namespaced, kind = _RESOURCES[words[0]]
    name = words[1] if len(words) == 2 else ""
    if everywhere and (name or not namespaced):
        return None
    if namespaced and not everywhere:  # kubectl ignores a namespace for a cluster-scoped kind
        prefix += f"/namespaces/{namespace or 'default'}"
    path = f"{prefix}/{plural}" + (f"/{name}" if name else "")
    return path, kind, not name


def _as_kubectl(body: dict[str, Any], kind: str, is_list: bool) -> dict[str, Any]:
    """kubectl's view of a body: no managedFields; a list's items with kind and apiVersion."""
    if not is_list:
        (body.get("metadata") or {}).pop("managedFields", None)
        return body
    api_version = body.get("apiVersion", "v1")
    items = []
    for item in body.get("items") or []:
        (item.get("metadata") or {}).pop("managedFields", None)
        items.append({"apiVersion": api_version, "kind": kind, **item})
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def kubectl_get(bed: Testbed, *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json`, parsed; TestbedError where kubectl would fail."""
    plain = _path(args)
    if plain is None:
        out: dict[str, Any] = json.loads(bed.kubectl("get", *args, "-o", "json"))
        return out
    path, kind, is_list = plain
    return _as_kubectl(reader(bed).get(path), kind, is_list)


def kubectl_get_or_none(bed: Testbed, *args: str) -> dict[str, Any] | None:
    """`kubectl get ARGS -o json --ignore-not-found`, parsed; None where it prints nothing
    (not found, or the API server did not answer)."""
    plain = _path(args)
    if plain is None:
        out = bed.kubectl("get", *args, "-o", "json", "--ignore-not-found", check=False)
        return json.loads(out) if out.strip() else None
    path, kind, is_list = plain
    try:
        return _as_kubectl(reader(bed).get(path), kind, is_list)
    except TestbedError:
        return None
