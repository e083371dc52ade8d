"""The operator: kopf's process, migpart's own watches, and a planning loop per policy.

Four packages, each importing only those below it (an import-linter contract):

- `runtime/`: kopf wiring and the lifecycle (start-up, take-over, cleanup).
- `rounds/`: one policy's planning loop and its rounds (scope, screening, plan, the destroy
  protocol, the policy status).
- `watching/`: what the operator sees of the cluster (its own watches and their indexes, the
  MigNode watch).
- `core/`: what all of them stand on (the shared state, the port every write goes through,
  the MigNode specs, node health, plain-body readings, the per-policy workers, error
  mapping, metrics).
"""
