"""The engines: the engine interface (chosen once: engine.py), the Docker provider, images, rendering, a cluster's
life, Swarm, the collector."""
