"""Chaos Toolkit extension for elastic-sim: `chaos discover chaostoolkit-elastic-sim` lists its activities.

Actions (chaosesim.actions) and probes (chaosesim.probes) are elastic-sim's own (sim/cli/toolkit.py):
the faults go through the same audited path as `sim kill-worker` and friends.
"""

from __future__ import annotations

from chaoslib.discovery.discover import discover_actions, discover_probes, initialize_discovery_result
from chaoslib.types import Discovery

__version__ = "0.1.0"
__all__ = ["__version__", "discover"]


def discover(discover_system: bool = True) -> Discovery:
    """The extension's actions and probes; with `discover_system`, the elastic-sim clusters running here."""
    discovery = initialize_discovery_result("chaostoolkit-elastic-sim", __version__, "elastic-sim")
    discovery["activities"].extend(discover_actions("chaosesim.actions"))
    discovery["activities"].extend(discover_probes("chaosesim.probes"))
    if discover_system:
        discovery["system"] = _system()
    return discovery


def _system() -> dict:
    from sim.core.errors import SimError
    from sim.engines.cluster import list_clusters
    from sim.engines.docker import Docker

    try:
        docker = Docker()
        docker.ping()
        return {"clusters": list_clusters(docker)}
    except SimError as error:
        return {"clusters": [], "error": str(error)}
