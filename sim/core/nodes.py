"""Node names: node0, node1, ... (the compose services and the agents' names)."""

PREFIX = "node"


def node_order(name: str) -> tuple[int, str]:
    """Natural order of node names (node2 before node10); any other name after every node."""
    digits = name[len(PREFIX) :] if name.startswith(PREFIX) else ""
    return (int(digits) if digits.isdigit() else 10**6, name)
