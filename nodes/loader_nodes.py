"""Node classes (filled in by their issue)."""
NODES: list = []
