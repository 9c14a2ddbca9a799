"""GraphPlan: the IR view of a graph, the static analysis, scalar sinking, reports and dumps."""
