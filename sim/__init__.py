"""elastic-sim: a local cluster simulator for PyTorch elastic training."""

from .errors import SimError, UsageError
from .spec import ClusterSpec

__all__ = ["ClusterSpec", "SimError", "UsageError"]
