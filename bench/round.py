"""The operator's round, in process: scoping (which nodes and claims each policy sees, the
demand of every pending claim) and planning, at cluster sizes the testbed cannot host quickly.

No API server: the cluster is built as the operator's indexes hold it (plain bodies), with N
nodes x 8 empty H100s split between two policies (pool a and pool b), 2 x N pending claims
(profiles 1g.10gb..7g.80gb, some multi-device, some same-GPU, some pods with a node selector
on a zone label), and one DeviceClass. For each size it times, per policy:

- the first round (cold caches: every MigNode and claim is new to the operator),
- a repeated round with nothing changed (what an idle or batching operator pays per wake-up),
- a round after 1 % of the claims changed,
- the planner on the round's scope.

Run: `.venv/bin/python -m bench.round [--sizes 100,300,1000]`. The end-to-end figures, with
the real API server, scheduler and agents, are bench/scale.py's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from migpart.api.models import MigNodeStatus
from migpart.controller.rounds.scope import ScopeCache
from migpart.controller.watching.indexes import Cluster
from migpart.kube.placement import NodeFacts
from migpart.kube.snapshot import SnapshotCache
from migpart.planning.planner import plan
from migpart.slices.dra import DEVICE_CLASS, DRIVER
from migpart.testing.builders import (
    ClaimBuilder,
    MigNodeBuilder,
    PolicyBuilder,
    gpu_status,
    profile_is,
)

H100 = "NVIDIA H100 80GB HBM3"
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
CLASS = {
    "metadata": {"name": DEVICE_CLASS},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
}


def mignode(name: str, labels: dict[str, str], revision: int) -> dict[str, Any]:
    gpus = [gpu_status(i, model=H100, uuid=f"GPU-{name}-{i}") for i in range(8)]
    node = MigNodeBuilder(name).labels(labels).revision(revision)
    return node.status(MigNodeStatus(gpus=gpus)).obj()


def policy(name: str, pool: str) -> dict[str, Any]:
    policy = PolicyBuilder(name).revision(1).generation(1).uid(name).pool({"pool": pool})
    return policy.spec(reconfiguration={"batchWindowSeconds": 1, "maxConcurrentNodes": 1000}).obj()


def claim(i: int, rng: random.Random, revision: int) -> dict[str, Any]:
    profile = rng.choice(PROFILES)
    body = ClaimBuilder(f"c{i}", "scale").uid(f"uid-{i}").revision(revision)
    kind = rng.random()
    if kind < 0.1:
        body.request(profile_is(profile), count=2)
    elif kind < 0.2:
        body.request(profile_is("1g.10gb"), count=2).same_gpu()
    else:
        body.request(profile_is(profile))
    return body.obj()


def cluster(nodes: int, rng: random.Random) -> Cluster:
    mignodes: dict[str, Any] = {}
    facts: dict[str, NodeFacts] = {}
    for n in range(nodes):
        name = f"node-{n:04d}"
        labels = {"pool": "a" if n % 2 == 0 else "b", "zone": f"z{n % 4}"}
        mignodes[name] = mignode(name, labels, n + 1)
        facts[name] = NodeFacts(labels, ())
    claims: dict[str, Any] = {}
    waiting: dict[str, tuple[dict[str, Any], ...]] = {}
    for i in range(2 * nodes):
        body = claim(i, rng, 10_000 + i)
        key = f"scale/c{i}"
        claims[key] = body
        selector: dict[str, str] = {"pool": "a" if i % 2 == 0 else "b"}
        if i % 5 == 0:
            selector["zone"] = f"z{(i // 5) % 4}"
        placement = {"nodeName": "", "nodeSelector": selector, "terms": [], "tolerations": []}
        waiting[key] = (placement,)
    return Cluster(
        mignodes=mignodes,
        node_labels={k: dict(v.labels) for k, v in facts.items()},
        policies={"pool-a": policy("pool-a", "a"), "pool-b": policy("pool-b", "b")},
        claims=claims,
        waiting=waiting,
        device_classes={DEVICE_CLASS: CLASS},
        node_facts=facts,
    )


def touched(base: Cluster, share: float, rng: random.Random) -> Cluster:
    """The cluster with `share` of its claims at a new revision."""
    claims = dict(base.claims)
    for key in rng.sample(sorted(claims), max(1, int(len(claims) * share))):
        body = dict(claims[key])
        meta = dict(body["metadata"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 100_000)
        body["metadata"] = meta
        claims[key] = body
    return Cluster(
        mignodes=base.mignodes,
        node_labels=base.node_labels,
        policies=base.policies,
        claims=claims,
        waiting=base.waiting,
        device_classes=base.device_classes,
        node_facts=base.node_facts,
    )


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def one_size(nodes: int, repeats: int) -> None:
    rng = random.Random(nodes)
    base = cluster(nodes, rng)
    cache = ScopeCache()
    policies = ("pool-a", "pool-b")
    cold = sum(timed(lambda p=p: cache.scope(p, base))[0] for p in policies)
    warm = statistics.median(
        sum(timed(lambda p=p: cache.scope(p, base))[0] for p in policies) for _ in range(repeats)
    )
    changed = touched(base, 0.01, rng)
    delta = sum(timed(lambda p=p: cache.scope(p, changed))[0] for p in policies)
    planning = 0.0
    requests = 0
    for p in policies:
        scope = cache.scope(p, changed)
        assert scope is not None
        requests += len(scope.demand.requests)
        snapshot = SnapshotCache().build(scope.nodes, frozenset())
        planning += timed(lambda s=snapshot, r=scope.demand.requests: plan(s, r))[0]
    print(
        f"nodes {nodes} gpus {nodes * 8} claims {2 * nodes} (requests {requests}): "
        f"scope cold {cold:.3f} s, unchanged {warm * 1000:.1f} ms, 1 % changed "
        f"{delta * 1000:.1f} ms, plan {planning:.3f} s (both policies)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,300,1000")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        one_size(size, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
