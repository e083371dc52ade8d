#!/usr/bin/env python3
"""Measure what a kube-apiserver accepts in a resource.k8s.io/v1 ResourceSlice.

Offer mode (docs/offer-mode.md) publishes partitionable devices: counter sets in their own
slices, devices that consume counters, placements the agent cannot make with a taint. How many
of each fit in one slice decides how `migpart.offer.pool` splits a node's pool (its `MAX_*`),
so the limits are measured on the real API server rather than read off a version string: each
probe creates a slice with server-side dry run (nothing is stored) and bisects the largest
count the server accepts. A probe also reports whether the server kept the field: a server
whose feature gate is off drops it silently (then the "limit" is only that of the fields
left).

    PYTHONPATH=operator .venv/bin/python hack/slice_limits.py            # starts a testbed
    MIGPART_K8S_VERSION=1.34.4 PYTHONPATH=operator .venv/bin/python hack/slice_limits.py
    PYTHONPATH=operator .venv/bin/python hack/slice_limits.py --kubeconfig PATH  # a running one

Only kubeconfigs with a server and a bearer token (the testbed's) are understood.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migpart.slices.dra import DRIVER, RESOURCE_GROUP, RESOURCE_VERSION

Body = dict[str, Any]
URL = f"/apis/{RESOURCE_GROUP}/{RESOURCE_VERSION}/resourceslices?dryRun=All"


class Server:
    """POSTs slices with dry run; `accepts` says whether the server took one."""

    def __init__(self, server: str, token: str) -> None:
        self.server = server
        self.token = token
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE
        self.last_error = ""

    def create(self, body: Body) -> Body | None:
        """The stored form the server answers, or None when it rejected the slice."""
        request = urllib.request.Request(
            self.server + URL,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as response:
                answer: Body = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as e:
            if e.code != 422:
                raise
            self.last_error = json.loads(e.read()).get("message", "")[:300]
            return None


def slice_body(
    devices: list[Body] | None = None, counter_sets: list[Body] | None = None, name: str = "probe"
) -> Body:
    spec: Body = {
        "driver": DRIVER,
        "nodeName": "probe-node",
        "pool": {"name": "probe-node", "generation": 1, "resourceSliceCount": 1},
    }
    if devices is not None:
        spec["devices"] = devices
    if counter_sets is not None:
        spec["sharedCounters"] = counter_sets
    return {
        "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def counter_set(name: str, counters: int) -> Body:
    return {"name": name, "counters": {f"c{k}": {"value": "1"} for k in range(counters)}}


def device(k: int, consumes: int = 0, counters: int = 1, taints: int = 0) -> Body:
    """Device `k`; consuming `counters` counters from each of `consumes` counter sets, with
    `taints` NoSchedule taints."""
    body: Body = {"name": f"d{k}", "attributes": {"k": {"int": k}}}
    if consumes:
        body["consumesCounters"] = [
            {"counterSet": f"s{j}", "counters": {f"c{c}": {"value": "1"} for c in range(counters)}}
            for j in range(consumes)
        ]
    if taints:
        body["taints"] = [
            {"key": f"{DRIVER}/t{t}", "value": "x", "effect": "NoSchedule"} for t in range(taints)
        ]
    return body


def kept(stored: Body, field: str) -> bool:
    """Whether `field` survived in the stored slice (spec-level or on any device)."""
    spec = stored.get("spec") or {}
    if spec.get(field):
        return True
    return any(d.get(field) for d in spec.get("devices") or [])


def largest(server: Server, make: Callable[[int], Body], top: int) -> int:
    """The largest n in [0, top] such that `make(n)` is accepted (acceptance is monotone)."""
    if server.create(make(top)) is not None:
        return top
    low, high = 0, top  # make(low) accepted (or low = 0), make(high) rejected
    while high - low > 1:
        mid = (low + high) // 2
        if server.create(make(mid)) is not None:
            low = mid
        else:
            high = mid
    return low


def measure(server: Server) -> list[tuple[str, str]]:
    """Each probe's name and what the server did."""
    results: list[tuple[str, str]] = []

    def limit(what: str, make: Callable[[int], Body], top: int, field: str | None) -> None:
        n = largest(server, make, top)
        note = ""
        if n < top:
            server.create(make(n + 1))
            note = f"; {n + 1}: {server.last_error}"
        if field is not None and n > 0:
            stored = server.create(make(n))
            note += f"; {field} kept: {stored is not None and kept(stored, field)}"
        results.append((what, f"{n}{' (probe ceiling)' if n == top else ''}{note}"))

    limit("devices per slice", lambda n: slice_body([device(k) for k in range(n)]), 512, None)
    limit(
        "devices per slice, each consuming counters",
        lambda n: slice_body([device(k, consumes=1) for k in range(n)]),
        512,
        "consumesCounters",
    )
    limit(
        "devices per slice, each with a taint",
        lambda n: slice_body([device(k, taints=1) for k in range(n)]),
        512,
        "taints",
    )
    limit(
        "devices per slice, one consuming counters",
        lambda n: slice_body([device(k, consumes=1 if k == 0 else 0) for k in range(n)]),
        512,
        "consumesCounters",
    )
    limit(
        "counter sets per slice (1 counter each)",
        lambda n: slice_body(counter_sets=[counter_set(f"s{j}", 1) for j in range(n)]),
        256,
        "sharedCounters",
    )
    limit(
        "counters per counter set",
        lambda n: slice_body(counter_sets=[counter_set("s0", n)]),
        512,
        "sharedCounters",
    )
    limit(
        "counters per slice, in counter sets of 32",
        lambda n: slice_body(
            counter_sets=[counter_set(f"s{j}", min(32, n - 32 * j)) for j in range((n + 31) // 32)]
        ),
        2048,
        "sharedCounters",
    )
    limit(
        "consumesCounters entries per device",
        lambda n: slice_body([device(0, consumes=n)]),
        64,
        "consumesCounters",
    )
    limit(
        "counters per consumesCounters entry",
        lambda n: slice_body([device(0, consumes=1, counters=n)]),
        512,
        "consumesCounters",
    )
    limit(
        "consumed counters per slice (devices x 2 entries x 32)",
        lambda n: slice_body([device(k, consumes=2, counters=32) for k in range(n)]),
        512,
        "consumesCounters",
    )
    limit(
        "taints per device",
        lambda n: slice_body([device(0, taints=n)]),
        64,
        "taints",
    )
    both = server.create(slice_body([device(0, consumes=1)], [counter_set("s0", 1)]))
    results.append(
        (
            "sharedCounters and devices in one slice",
            "rejected: " + server.last_error
            if both is None
            else f"accepted; sharedCounters kept: {kept(both, 'sharedCounters')}",
        )
    )
    for name in ("gpu-0", "gpu_0", "Gpu-0", "0gpu", "gpu.0", "a" * 63, "a" * 64):
        got = server.create(slice_body(counter_sets=[counter_set(name, 1)]))
        results.append((f"counter set name {name!r}", "accepted" if got else "rejected"))
        for_counter = {"name": "s0", "counters": {name: {"value": "1"}}}
        got = server.create(slice_body(counter_sets=[for_counter]))
        results.append((f"counter name {name!r}", "accepted" if got else "rejected"))
    return results


def from_kubeconfig(path: Path) -> Server:
    """The server and token of a testbed kubeconfig (YAML read without a YAML library: the
    testbed writes `server:` and `token:` lines)."""
    server = token = ""
    for line in path.read_text().splitlines():
        key, _, value = line.strip().partition(": ")
        if key == "server":
            server = value
        elif key == "token":
            token = value
    if not server or not token:
        sys.exit(f"{path}: no server and bearer token found")
    return Server(server, token)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, help="a running testbed (default: start one)")
    args = parser.parse_args()
    if args.kubeconfig is not None:
        report(from_kubeconfig(args.kubeconfig), "the given server")
        return
    from migpart.testbed import Testbed, build
    from migpart.testbed.build import kube_version

    with tempfile.TemporaryDirectory() as d:
        bed = Testbed(Path(d), binary=build(quiet=True))
        with bed.running():
            report(from_kubeconfig(bed.kubeconfig), f"Kubernetes {kube_version()}")


def report(server: Server, what: str) -> None:
    print(f"ResourceSlice limits of {what} ({os.environ.get('MIGPART_K8S_VERSION', 'default')})")
    for probe, outcome in measure(server):
        print(f"  {probe}: {outcome}")


if __name__ == "__main__":
    main()
