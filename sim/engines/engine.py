"""The engine a cluster runs on: one interface, chosen once at the edge and passed down.

`ClusterEngine` is what the entry points need of an engine: its `capabilities` (data: what it can do, and
for each refusal the line the user sees; sim/core/capabilities.py), the provider its clusters act through
(which carries those capabilities down to the nemesis), a cluster by name, `up` and `down`. `ComposeEngine`
(one machine, docker compose) and `SwarmEngine` (sim/engines/swarm.py: a Swarm stack, one host or many)
implement it. `choose_engine` picks one, from a new cluster's spec or from what an existing cluster is:
it is the one place that tells the engines apart by name; every caller below asks the capabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sim.core import labels
from sim.core.capabilities import ONE_HOST, Capabilities, Placement
from sim.core.errors import SimError
from sim.core.progress import Progress, to_stderr
from sim.core.spec import ClusterSpec
from sim.engines.cluster import DEFAULT_START_TIMEOUT, Cluster
from sim.engines.cluster import up as compose_up
from sim.engines.docker import Docker, DockerProvider
from sim.engines.swarm import SwarmEngine, swarm_state


class ClusterEngine(Protocol):
    """An engine that runs clusters. Small enough to fake whole in a test."""

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def docker(self) -> DockerProvider: ...  # the provider the engine's clusters act through

    def cluster(self, name: str) -> Cluster: ...

    def exists(self, cluster: Cluster) -> bool: ...  # anything of it left to remove

    def up(
        self,
        spec: ClusterSpec,
        *,
        placement: Placement = ...,
        keep: bool = ...,
        timeout: float = ...,
        progress: Progress = ...,
        replace: bool = ...,
    ) -> Cluster: ...

    def down(self, cluster: Cluster, progress: Progress = ...) -> dict[str, int]: ...


class ComposeEngine:
    """`--engine compose` (the default): the cluster is a Compose project on this machine's engine."""

    def __init__(self, docker: DockerProvider):
        self.docker = docker

    @property
    def capabilities(self) -> Capabilities:
        return self.docker.capabilities

    def cluster(self, name: str) -> Cluster:
        return Cluster(name, self.docker)

    def exists(self, cluster: Cluster) -> bool:
        return cluster.exists()

    def up(
        self,
        spec: ClusterSpec,
        *,
        placement: Placement = ONE_HOST,
        keep: bool = False,
        timeout: float = DEFAULT_START_TIMEOUT,
        progress: Progress = to_stderr,
        replace: bool = False,
    ) -> Cluster:
        if not placement.default:
            self.capabilities.host_placement.require()
        return compose_up(spec, self.docker, keep=keep, timeout=timeout, progress=progress, replace=replace)

    def down(self, cluster: Cluster, progress: Progress = to_stderr) -> dict[str, int]:
        return cluster.down()


# Each engine's maker: a new cluster's (from its spec) and an existing one's (from what it is).
_FOR_SPEC: dict[str, Callable[[Docker], ClusterEngine]] = {"compose": ComposeEngine, "swarm": SwarmEngine}
_FOR_CLUSTER: dict[str, Callable[[Docker, str], ClusterEngine]] = {
    "compose": lambda docker, _: ComposeEngine(docker),
    "swarm": SwarmEngine.of_cluster,
}


def choose_engine(docker: Docker, *, spec: ClusterSpec | None = None, name: str | None = None) -> ClusterEngine:
    """The engine, chosen once at the edge: a new cluster's from its `spec`; an existing cluster's (`name`) from
    what it is: on this engine's swarm when its services are there, or its recorded spec says so (the collector
    starts before the services), else a Compose project. `docker` is this machine's engine."""
    if (spec is None) == (name is None):
        raise ValueError("choose_engine: give a new cluster's spec or an existing cluster's name")
    if spec is not None:
        return _FOR_SPEC[spec.engine](docker)
    return _FOR_CLUSTER[_engine_of(docker, name)](docker, name)


def _engine_of(docker: Docker, name: str) -> str:
    state, _ = swarm_state(docker)
    if state != "active":
        return "compose"
    try:
        recorded = Cluster(name, docker).spec
    except (SimError, ValueError, TypeError, OSError):
        recorded = None  # a spec that cannot be read says nothing; the services still do
    if recorded is not None and recorded.engine == "swarm":
        return "swarm"
    services = docker._call("service ls", docker.api.services, filters={"label": f"{labels.CLUSTER}={name}"})
    return "swarm" if services else "compose"
