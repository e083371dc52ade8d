"""Pure planning: claim demand (`demand`, `candidates`), the planner (`planner`) and the layout
changes a plan makes (`changes`: which GPUs and nodes, and which nodes to reconfigure now).
No I/O, no clock, no logging."""
