"""One action per fault kind of elastic-sim's catalog (kill-worker -> kill_worker), the CLI's arguments.

Each returns the audited result of its Nemesis call (the history's `ok` record). The cluster: the
experiment's configuration key `sim_cluster`, else $SIM_CLUSTER, else "sim".
"""

from sim.cli.toolkit import ACTIONS

globals().update(ACTIONS)
__all__ = sorted(ACTIONS)
