"""Pure planning: no I/O, no clock, no logging (import-linter keeps it so). docs/code-map.md
walks it module by module.

- claim demand: `demand` (a claim's demand), `candidates` (the profiles one request accepts);
- the planner: `model` (its input and output), `planner` (`plan`), `greedy`, `index` and
  `evaluate` (the greedy), `repair`, `search` and `bounds` (the local search);
- one node packed exactly: `packer`, `packing`, `targets`, `transport`, `classes`, `cost`;
- beside a plan: `spares`, `overtime` (the objective over time), `changes` (which GPUs and
  nodes a plan changes, and which to reconfigure now), `codec` (the `migpart plan` contract);
- offer mode: `offer` (which placements a node offers, in which order), `listing` (the
  order a stable pool lists every placement in).
"""
