"""The engines: the Docker provider, images, rendering, a cluster's life, the collector."""
