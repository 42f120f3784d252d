"""One error hierarchy. A SimError is a user-facing failure: the CLI prints its
message as one line and exits non-zero, without a traceback."""


class SimError(Exception):
    """Base of every error the harness raises on purpose."""

    exit_code = 1


class UsageError(SimError, ValueError):
    """Bad input from the user: a flag, a file, a name. Nothing was changed."""

    exit_code = 2


class DockerUnavailableError(SimError):
    """The Docker engine or Compose v2 cannot be reached."""

    exit_code = 3


class ImageBuildError(SimError):
    """An image could not be built."""


class ClusterError(SimError):
    """A cluster operation failed (start, wait, stop)."""


class ClusterNotFoundError(ClusterError, UsageError):
    """The named cluster does not exist or is not running."""

    exit_code = 2


class FaultError(SimError):
    """A fault could not be injected or healed."""


class UnsupportedFaultError(FaultError, UsageError):
    """The fault needs a feature this machine lacks (e.g. the netem qdisc)."""

    exit_code = 2


class HistoryError(SimError, ValueError):
    """A run's history holds a record off the schema (sim/core/history.py), or lacks one the verdict needs."""


class HistoryWriteError(SimError):
    """A record could not be written to the run's history (its disk full, gone): it is not there, and no
    part of it is."""


class JobNeverTrainedError(SimError):
    """The job under test never trained (no optimizer step, no collective): nothing of it can be judged."""
