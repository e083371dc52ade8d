"""The operator: kopf's process, migpart's own watches, and a planning loop per policy.

Three packages, by what they are about:

- `watching/`: what the operator sees of the cluster (its own watches and their indexes, the
  MigNode watch, the readings of plain bodies, the nodes' health).
- `rounds/`: one policy's planning loop and its rounds (scope, screening, plan, the specs the
  chosen nodes get, the destroy protocol, the policy status).
- `runtime/`: what the process runs on (kopf wiring and the lifecycle, the per-policy
  workers, the shared state, the port every write goes through, error mapping, metrics).
"""
