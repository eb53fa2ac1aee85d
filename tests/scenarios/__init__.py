"""End-to-end scenarios under faults, duplicates, poison records and crashes, each ending in an exact state check."""
