"""torchair's foundations: the bottom layer of the package.

Logging and switches, the op and value-dependent registries, safe atomic file writes and the data
types every stage shares (gears, node-meta keys). Nothing here imports anything above it; see
docs/architecture.md for the whole stack.
"""
