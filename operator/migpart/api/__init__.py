"""The migpart CRDs as pydantic models: the single source of truth for crds/*.yaml.

- `models`: GpuPartitionPolicy and MigNode, their spec and status, the group and version;
- `base`: the models' base (camelCase, frozen, unknown fields refused) and schema helpers;
- `selectors`: label selectors as a model, and `--node-selector`;
- `leases`: an agent's node Lease;
- `crdgen`: `python -m migpart.api.crdgen`, the CRD YAML from the models.

Import the names from their module (`migpart.api.models`, ...).
"""
