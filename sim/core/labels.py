"""Docker labels: the source of truth for what belongs to which cluster (as in kind).

`down`, `ls` and test teardown find containers, networks and volumes by these,
so they work even when the compose file or the state folder is gone.
"""

import os
import socket

from sim.core.paths import state_home

CLUSTER = "elastic-sim.cluster"
ROLE = "elastic-sim.role"  # "node" | "etcd" | NETNS_HELPER
# The role of the short-lived helper container that applies a network fault from inside a node's network
# namespace (sim.engines.cluster.Cluster.net_exec): labelled like the cluster, so `down` sweeps it, and
# never one of the cluster's containers (not listed, its events not in the history).
NETNS_HELPER = "netns-helper"
NODE = "elastic-sim.node"  # node0, node1, ... (also on etcd: "etcd")
RUN = "elastic-sim.run"
# On nodes: the MiB a node counts for in its machine's memory (ClusterSpec.counted_memory_mib), read by the
# room check of another cluster's `up` on the same engine (sim.engines.cluster.check_engine_room).
MEMORY = "elastic-sim.memory-mib"
# A test session (or any caller) can tag everything it makes, then sweep by it.
SESSION = "elastic-sim.session"
SESSION_ENV = "SIM_SESSION"
IMAGE = "elastic-sim.image"  # on images: base | runtime | node | etcd
# On node images: the uid the node's processes run as; the run's events folder is given to it (they write
# their records there, without capabilities, so a root node can only write what root owns).
NODE_UID = "elastic-sim.node-uid"
# On node images: the groups that uid is in (comma-separated gids), whose bits of a file's mode it reads by.
NODE_GIDS = "elastic-sim.node-gids"
# Who made it: this host and this state home (SIM_HOME). A sweep (`down --all`, `up` over a left-over)
# touches only what it owns: two homes on one engine (a test suite's and a person's, two CI jobs)
# cannot remove each other's clusters.
OWNER = "elastic-sim.owner"


def owner() -> str:
    """This process's owner label value: HOST:STATE_HOME (resolved)."""
    return f"{socket.gethostname()}:{state_home().resolve()}"


def cluster_labels(cluster: str, run_id: str | None = None) -> dict[str, str]:
    labels = {CLUSTER: cluster, OWNER: owner()}
    if run_id:
        labels[RUN] = run_id
    session = os.environ.get(SESSION_ENV)
    if session:
        labels[SESSION] = session
    return labels


def cluster_filter(cluster: str) -> str:
    return f"label={CLUSTER}={cluster}"
