"""What an engine can do, as data: each feature supported, or refused with the one line the user sees.

An engine is chosen once, at the edge (sim/engines/engine.py, `choose_engine`); every caller below asks
its `capabilities`, never its name, so Swarm's refusals are these values and not `if` tests on "swarm".
`CAPABILITIES` holds each engine's own, known from the spec alone; an engine instance may refuse more
(a Swarm cluster whose /ckpt every host shares refuses `fill-disk`: sim/engines/swarm.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sim.core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Support:
    """One feature on one engine: supported (`refusal` None), or refused with the line the user sees."""

    refusal: str | None = None

    def __post_init__(self) -> None:
        if self.refusal is not None and (not self.refusal.strip() or "\n" in self.refusal):
            raise ValueError(f"refusal {self.refusal!r}: must be one line that says why and what to do")

    @property
    def ok(self) -> bool:
        return self.refusal is None

    def require(self, prefix: str = "") -> None:
        """Refuse (a UsageError: the input names a feature this engine lacks) unless supported."""
        if self.refusal is not None:
            raise UsageError(f"{prefix}{self.refusal}")


SUPPORTED = Support()


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """An engine's features (`--engine NAME`, named `title` in messages), and the faults it refuses."""

    engine: str
    title: str
    image_builds: Support  # --image, --requirements: an image built on this machine's engine
    host_placement: Support  # --placement, --ckpt-nfs, --ckpt-dir: nodes and /ckpt placed on several hosts
    parallel_clusters: Support  # several clusters on the engine at once (sim vet --parallel)
    refused_faults: Mapping[str, str] = dataclasses.field(default_factory=dict)  # fault kind -> why not here

    def __post_init__(self) -> None:
        if not self.engine or not self.title:
            raise ValueError("an engine's capabilities need its name and its title")
        object.__setattr__(self, "refused_faults", dict(self.refused_faults))
        for reason in self.refused_faults.values():
            Support(reason)  # one line each, as every refusal

    def fault_refusal(self, fault: str, target: str | None, cluster: str) -> str | None:
        """Why `fault` cannot work on cluster `cluster` of this engine, in one line (None: it can)."""
        reason = self.refused_faults.get(fault)
        if reason is None:
            return None
        return f"{fault} on {target or 'the cluster'}: refused on {self.title} cluster '{cluster}': {reason}"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a cluster's nodes and its /ckpt go (--placement, --ckpt-nfs, --ckpt-dir). The default (every node
    on this engine's host, /ckpt a local volume) works on every engine; any other needs `host_placement`,
    and the engine that places checks the values (sim/engines/swarm_render.py, `SwarmLayout`)."""

    placement: str = "spread"
    ckpt_nfs: str | None = None
    ckpt_dir: str | None = None

    def __post_init__(self) -> None:
        for value in (self.placement, self.ckpt_nfs, self.ckpt_dir):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"placement value {value!r}: must be text")

    @property
    def default(self) -> bool:
        return self == ONE_HOST


ONE_HOST = Placement()


COMPOSE = Capabilities(
    engine="compose",
    title="Compose",
    image_builds=SUPPORTED,
    host_placement=Support(
        "--placement, --ckpt-nfs and --ckpt-dir place nodes on Swarm hosts; add --engine swarm or drop them"
    ),
    parallel_clusters=SUPPORTED,
)
SWARM = Capabilities(
    engine="swarm",
    title="Swarm",
    image_builds=Support(
        "--image and --requirements build an image on this machine only; use them with --engine compose"
    ),
    host_placement=SUPPORTED,
    # Each run on a one-host swarm initialises the swarm and leaves it at its end: two at once would race.
    parallel_clusters=Support("a one-host swarm runs one cluster at a time; drop --parallel"),
)
# compose: one machine (docker compose); swarm: a Swarm stack, one host or many (sim/engines/swarm.py, docs/SWARM.md).
CAPABILITIES: Mapping[str, Capabilities] = {c.engine: c for c in (COMPOSE, SWARM)}
