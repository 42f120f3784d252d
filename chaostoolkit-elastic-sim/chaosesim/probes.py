"""Probes of a running elastic-sim cluster's training, read from its run history."""

from chaos.toolkit import PROBES

globals().update(PROBES)
__all__ = sorted(PROBES)
