"""elastic-sim: a local cluster simulator for PyTorch elastic training."""

from sim.core.errors import SimError, UsageError
from sim.core.spec import ClusterSpec

__all__ = ["ClusterSpec", "SimError", "UsageError"]
