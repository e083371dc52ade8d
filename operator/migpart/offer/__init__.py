"""Offer mode: one stable pool per node, instances made when kubelet prepares a claim.

An offering node's pool lists every MIG placement its policy allows, on each GPU, as a
partitionable device with its GPU's counters (KEP-4815), in the planner's order
(`migpart.planning.listing`); kube-scheduler allocates placements by first fit, the counters
keep two overlapping ones from both being allocated, and the agent makes the instance in
`NodePrepareResources` and keeps it after (docs/offer-mode.md). The pool is written when the
policy, the node's GPUs or its health change, or a placement becomes unusable: never because a
claim was allocated or released.

- `pool.py`: what an offering node's pool lists (pure).
- `mode.py`: the mode in effect for a policy, from what it asks and what the server serves.
- `nodes.py`: which nodes offer under which policy, the devices claims hold there, and the
  publisher's slices function.
"""
