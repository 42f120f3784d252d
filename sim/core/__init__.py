"""The bottom layer: what a cluster, a fault kind and a history are (no Docker, no verdict)."""
