"""Chaos scenarios: the file format, the runner and the shipped catalog (the files: chaos/scenarios/*.yaml)."""
