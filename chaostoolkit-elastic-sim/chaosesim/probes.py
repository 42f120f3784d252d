"""Probes of a running elastic-sim cluster's training, read from its run history."""

from sim.cli.toolkit import PROBES

globals().update(PROBES)
__all__ = sorted(PROBES)
