"""Which nodes a policy plans and which pending claims fall under it: pure, and incremental.

Which policy a node follows: the highest `priority` among the policies whose selector matches
the Node's labels (ties: the policy name that sorts first). Which policy a pending claim falls
under: the first policy in that same order, having nodes the claim's pods may run on, under
which some profile satisfies every request of the claim. A claim no policy can satisfy is
reported by the policy first in line (see `PolicyDemand.unsatisfiable`).

A round runs after every change the operator watches, so at 1,000 nodes and thousands of
claims it must not redo per round what did not change. `ScopeCache`, kept across rounds (and
shared by every policy's loop), holds:

- each MigNode and policy parsed once per `resourceVersion`, with what scoping derives from a
  MigNode (its GPU models, its profile tables, the claims its agent reports prepared); profile
  tables are interned, one object per distinct table, so that the selector-verdict cache in
  `kube.selectors` and the planner's classes see the same key for every GPU of a model;
- the *world*: every policy's node set and the GPU models on it, the nodes' labels and taints,
  the DeviceClasses. Status updates of the agents (instances created, destroyed, prepared)
  leave it unchanged; a label, a policy or a new node changes it, and then every claim's
  outcome is computed again;
- per claim (by uid), its outcome in the current world: which policy it falls under and the
  planner request, or why none can serve it. It is computed again only when the claim
  (`resourceVersion`), the pods waiting for it, or the world changed.

A round then costs a dict lookup per pending claim and a comparison per node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import structlog
from pydantic import ValidationError

from migpart.api.models import GpuPartitionPolicy, MigNode
from migpart.controller.core.bodies import name_of, parse_policy, revision_of, strip, uid_of
from migpart.controller.rounds import screening
from migpart.controller.watching.indexes import Cluster
from migpart.kube.claims import body_key, pending_claims, prepared_claims
from migpart.kube.placement import NodeFacts, NodeFilter, PodPlacement
from migpart.kube.selectors import CEL
from migpart.kube.snapshot import node_name
from migpart.mig import ModelTable
from migpart.planning import demand
from migpart.planning.model import Request
from migpart.types import Body

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PolicyDemand:
    """The pending claims of one policy, turned into planner requests."""

    requests: tuple[Request, ...]
    unsatisfiable: tuple[tuple[Body, str], ...]
    pending: int


@dataclass(frozen=True)
class Scope:
    """The nodes of one policy and the demand that falls under it."""

    nodes: tuple[MigNode, ...]
    demand: PolicyDemand
    # the profile table of every GPU model on the policy's nodes
    tables: Mapping[str, ModelTable] = field(default_factory=dict)
    gpus: int = 0
    # (name, reason) of the policy's nodes left out of `nodes` as unavailable, by name
    unavailable: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeView:
    """A MigNode parsed once, with what scoping derives from it."""

    node: MigNode
    # GPU models of the MIG-enabled GPUs (sorted, each once)
    models: tuple[str, ...]
    # model -> profile table the agent reported (interned: one object per distinct table)
    tables: Mapping[str, ModelTable]
    gpus: int
    # claims ("namespace/name") the agent reports prepared on an instance
    prepared: frozenset[str]


@dataclass(frozen=True, slots=True)
class _PolicyNodes:
    """One policy's nodes in the current world."""

    views: tuple[NodeView, ...]
    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Cut:
    """The nodes of one policy that a set of placements allows, with their tables."""

    names: frozenset[str]
    tables: Mapping[str, ModelTable]
    # distinct model sets on those nodes -> the nodes having exactly that set
    groups: Mapping[tuple[str, ...], frozenset[str]]


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What one pending claim is, in one world: planned by `owner` with `request`, or (owner
    None) unsatisfiable for `reason`, or of no concern to migpart (both None)."""

    owner: str | None
    request: Request | None = None
    reason: str | None = None


@dataclass(slots=True)
class _ClaimEntry:
    revision: str
    placements: tuple[PodPlacement, ...]
    world: int
    outcome: _Outcome


# per node: the policy it follows, its models with their tables, its labels and taints
_WorldNode = tuple[str, tuple[tuple[str, ModelTable], ...], tuple[str, ...], NodeFacts | None]


@dataclass
class _World:
    """The inputs every claim's outcome depends on besides the claim and its pods."""

    version: int = 0
    policies: tuple[tuple[str, str, str], ...] = ()
    nodes: dict[str, _WorldNode] = field(default_factory=dict)
    classes: tuple[tuple[str, str], ...] = ()


class ScopeCache:
    """Parsed objects and per-claim outcomes, reused across rounds (see the module docstring).

    Shared by every policy's planning loop; all of it can be dropped at any time (a new cache
    computes the same scopes).
    """

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[str, NodeView | None]] = {}
        self._policies: dict[str, tuple[str, GpuPartitionPolicy | None]] = {}
        self._tables: dict[ModelTable, ModelTable] = {}
        # node -> (its labels, the policy it follows), while the policies are `_owners_key`
        self._owners: dict[str, tuple[Mapping[str, str], str | None]] = {}
        self._owners_key: tuple[tuple[str, str, str], ...] = ()
        self._world = _World()
        # the valid policies and the DeviceClasses of the world, as `refresh` last saw them
        self._world_policies: Mapping[str, GpuPartitionPolicy] = {}
        self._classes: Mapping[str, Body] = {}
        self._policy_nodes: dict[str, _PolicyNodes] = {}
        # policy -> its unavailable nodes with their reasons (Cluster.unavailable)
        self._unavailable: dict[str, list[tuple[str, str]]] = {}
        self._order: list[str] = []
        self._prepared: frozenset[str] = frozenset()
        self._filter = NodeFilter({})
        self._cuts: dict[tuple[str, frozenset[str] | None], _Cut | None] = {}
        self._claims: dict[str, _ClaimEntry] = {}
        # how many claim outcomes were computed (not taken from the cache): for tests and bench
        self.computed = 0
        # MigNodes left out of planning (controller.rounds.screening): name -> why
        self.excluded: dict[str, str] = {}

    # ------------------------------------------------------------------ parsing

    def node(self, name: str, body: Body) -> NodeView | None:
        """The MigNode parsed (None if invalid), once per resourceVersion."""
        revision = revision_of(body)
        known = self._nodes.get(name)
        if known is not None and revision and known[0] == revision:
            return known[1]
        view = self._view(body)
        self._nodes[name] = (revision, view)
        return view

    def parsed(self, name: str, body: Body) -> MigNode | None:
        """The MigNode parsed (None if invalid), once per resourceVersion (`node`)."""
        view = self.node(name, body)
        return view.node if view is not None else None

    def _view(self, body: Body) -> NodeView | None:
        name = name_of(body)
        self.excluded.pop(name, None)
        reported: dict[str, ModelTable] = {}
        try:
            node = MigNode.model_validate(strip(body))
            problem = screening.node_problem(node, reported)
        except ValidationError as error:
            first = error.errors()[0]
            problem = f"invalid at {'.'.join(map(str, first['loc']))}: {first['msg']}"
        if problem is not None:
            log.warning("mignode_excluded", node=name, reason=problem)
            self.excluded[name] = problem
            return None
        models: set[str] = set()
        tables = {model: self._intern(table) for model, table in reported.items()}
        gpus = 0
        for gpu in node.status.gpus if node.status else []:
            if not gpu.mig_enabled:
                continue
            gpus += 1
            models.add(gpu.model)
        return NodeView(
            node=node,
            models=tuple(sorted(models)),
            tables=tables,
            gpus=gpus,
            prepared=prepared_claims(node),
        )

    def _intern(self, table: ModelTable) -> ModelTable:
        return self._tables.setdefault(table, table)

    def policy(self, name: str, body: Body) -> GpuPartitionPolicy | None:
        """The policy parsed (None if invalid), once per resourceVersion."""
        revision = revision_of(body)
        known = self._policies.get(name)
        if known is not None and revision and known[0] == revision:
            return known[1]
        try:
            parsed: GpuPartitionPolicy | None = parse_policy(body)
        except ValidationError:
            parsed = None  # reported by the policy's own handler
        self._policies[name] = (revision, parsed)
        return parsed

    def policies(self, bodies: Mapping[str, Body]) -> dict[str, GpuPartitionPolicy]:
        """The valid policies."""
        for gone in set(self._policies) - set(bodies):
            del self._policies[gone]
        return {n: p for n, b in bodies.items() if (p := self.policy(n, b)) is not None}

    # ------------------------------------------------------------------ the world

    def refresh(self, cluster: Cluster) -> dict[str, GpuPartitionPolicy]:
        """Bring the world up to `cluster`; returns the valid policies."""
        policies = self.policies(cluster.policies)
        order = sorted(policies, key=lambda n: (-policies[n].spec.priority, n))
        # by generation, not resourceVersion: our own status writes change the latter
        policy_key = tuple(
            (n, uid_of(cluster.policies[n]), str(policies[n].metadata.get("generation")))
            for n in order
        )
        for gone in set(self._nodes) - set(cluster.mignodes):
            del self._nodes[gone]
            self.excluded.pop(gone, None)
        world_nodes: dict[str, _WorldNode] = {}
        views: list[NodeView] = []
        by_policy: dict[str, list[NodeView]] = {}
        self._unavailable = {}
        for name in sorted(cluster.mignodes):
            body = cluster.mignodes[name]
            view = self.node(name, body)
            labels = cluster.node_labels.get(name)
            if labels is None:
                labels = (body.get("metadata") or {}).get("labels") or {}
            if view is None:
                continue
            views.append(view)
            owner = self._owner(name, labels, policies, order, policy_key)
            if owner is None:
                continue
            reason = cluster.unavailable.get(name)
            if reason is not None:  # out of the world: no claim is planned there
                self._unavailable.setdefault(owner, []).append((name, reason))
                continue
            by_policy.setdefault(owner, []).append(view)
            tables = tuple(view.tables.items())
            world_nodes[name] = (owner, tables, view.models, cluster.node_facts.get(name))
        classes = tuple(sorted((n, revision_of(b)) for n, b in cluster.device_classes.items()))
        world = self._world
        if (policy_key, world_nodes, classes) != (world.policies, world.nodes, world.classes):
            self._world = _World(world.version + 1, policy_key, world_nodes, classes)
            self._filter = NodeFilter(cluster.node_facts)
            self._cuts = {}
        self._order = [p for p in order if by_policy.get(p)]
        self._prepared = frozenset().union(*(v.prepared for v in views if v.prepared))
        self._world_policies, self._classes = policies, cluster.device_classes
        self._policy_nodes = {
            p: _PolicyNodes(
                views=tuple(views),
                names=frozenset(node_name(v.node) for v in views),
            )
            for p, views in by_policy.items()
        }
        return policies

    def nodes(self, policy_name: str) -> frozenset[str]:
        """The names of the policy's nodes in the world of the last `refresh`: those of its
        `scope`, without looking at a claim."""
        mine = self._policy_nodes.get(policy_name)
        return mine.names if mine is not None else frozenset()

    def _owner(
        self,
        name: str,
        labels: Mapping[str, str],
        policies: Mapping[str, GpuPartitionPolicy],
        order: list[str],
        policy_key: tuple[tuple[str, str, str], ...],
    ) -> str | None:
        """The policy node `name` follows (cached while its labels and the policies hold)."""
        if policy_key != self._owners_key:
            self._owners = {}
            self._owners_key = policy_key
        known = self._owners.get(name)
        if known is not None and known[0] == labels:
            return known[1]
        owner = next(
            (p for p in order if policies[p].spec.node_selector.matches(dict(labels))), None
        )
        self._owners[name] = (dict(labels), owner)
        return owner

    def _cut(self, policy: str, allowed: frozenset[str] | None) -> _Cut | None:
        """The policy's nodes that `allowed` permits (None: none)."""
        key = (policy, allowed)
        if key in self._cuts:
            return self._cuts[key]
        nodes = self._policy_nodes[policy]
        names = nodes.names if allowed is None else nodes.names & allowed
        cut: _Cut | None = None
        if names:
            tables: dict[str, ModelTable] = {}
            groups: dict[tuple[str, ...], set[str]] = {}
            for view in nodes.views:
                name = node_name(view.node)
                if name not in names:
                    continue
                groups.setdefault(view.models, set()).add(name)
                for model, table in view.tables.items():
                    tables.setdefault(model, table)
            cut = _Cut(
                names=names if allowed is None else frozenset(names),
                tables=tables,
                groups={models: frozenset(ns) for models, ns in groups.items()},
            )
        self._cuts[key] = cut
        return cut

    # ------------------------------------------------------------------ claims

    def outcome(self, claim: Body, placements: tuple[PodPlacement, ...]) -> _Outcome:
        """The claim's outcome in the current world (`refresh`), computed only if something
        it depends on changed."""
        uid = uid_of(claim) or body_key(claim)
        revision = revision_of(claim)
        entry = self._claims.get(uid)
        world = self._world.version
        if (
            entry is not None
            and revision
            and entry.revision == revision
            and entry.world == world
            and entry.placements == placements
        ):
            return entry.outcome
        self.computed += 1
        outcome = self._compute(claim, placements)
        self._claims[uid] = _ClaimEntry(revision, placements, world, outcome)
        return outcome

    def forget_claims(self, keep: Iterable[str]) -> None:
        """Drop the entries of claims (uids) no longer pending."""
        keep = set(keep)
        for uid in [u for u in self._claims if u not in keep]:
            del self._claims[uid]

    def _compute(self, claim: Body, placements: tuple[PodPlacement, ...]) -> _Outcome:
        # where the claim's pods may run: a policy with none of those nodes cannot serve it
        allowed = self._filter.allowed(placements)
        priority = max((int(p.get("priority") or 0) for p in placements), default=0)
        reason: str | None = None
        for candidate in self._order:
            cut = self._cut(candidate, allowed)
            if cut is None:
                continue
            got = demand.claim_demand(
                claim,
                self._classes,
                cut.tables,
                self._world_policies[candidate].spec.policy_view(),
                CEL,
                policy_name=candidate,
                priority=priority,
            )
            if isinstance(got, demand.ClaimDemand):
                nodes = _eligible(cut, got.by_model or {})
                return _Outcome(candidate, replace(got.request, nodes=nodes))
            if isinstance(got, demand.Unsatisfiable) and reason is None:
                reason = got.reason
        return _Outcome(None, reason=reason)

    # ------------------------------------------------------------------ the scope

    def scope(
        self, policy_name: str, cluster: Cluster, allocated: frozenset[str] = frozenset()
    ) -> Scope | None:
        """None when the policy itself is invalid. `allocated`: keys of claims known to be
        allocated although the claim index does not show it yet (besides the prepared ones)."""
        policies = self.refresh(cluster)
        if policy_name not in policies:
            return None
        mine = self._policy_nodes.get(policy_name)
        allocated = allocated | self._prepared
        requests: list[Request] = []
        unsatisfiable: list[tuple[Body, str]] = []
        pending = 0
        first_in_line = bool(self._order) and self._order[0] == policy_name
        pending_uids: list[str] = []
        for key, claim in pending_claims(cluster.claims, cluster.waiting, allocated):
            pending_uids.append(uid_of(claim) or key)
            if not self._order:
                continue
            outcome = self.outcome(claim, tuple(cluster.waiting[key]))
            if outcome.owner == policy_name and outcome.request is not None:
                requests.append(outcome.request)
                pending += 1
            elif outcome.owner is None and outcome.reason is not None and first_in_line:
                unsatisfiable.append((claim, outcome.reason))
                pending += 1
        self.forget_claims(pending_uids)
        views = mine.views if mine is not None else ()
        everywhere = self._cut(policy_name, None) if mine is not None else None
        return Scope(
            nodes=tuple(v.node for v in views),
            demand=PolicyDemand(tuple(requests), tuple(unsatisfiable), pending),
            tables=everywhere.tables if everywhere is not None else {},
            gpus=sum(v.gpus for v in views),
            unavailable=tuple(self._unavailable.get(policy_name, ())),
        )


def _eligible(cut: _Cut, by_model: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
    """The nodes of `cut` having a GPU model with a candidate profile (the same object as
    `cut.names` when that is all of them, which lets the planner see an unrestricted
    request)."""
    kept = [names for models, names in cut.groups.items() if any(m in by_model for m in models)]
    if len(kept) == len(cut.groups):
        return cut.names
    return frozenset().union(*kept)
