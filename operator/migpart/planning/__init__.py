"""Pure planning: demand, the planner and layout diffs. No I/O, no clock, no logging."""
