"""What the operator sees of the cluster: in-memory views filled by its own watches.

A round reads these, never the API server; they wake the planning loops when they change.

- `indexes.py`: the watched indexes (`WATCHED`) and the `Cluster` value a round reads.
- `mignodes.py`: the MigNode watch and, per node, one slice write at a time.
"""
