"""Where things live: the project's own files, and the per-cluster state folder."""

from __future__ import annotations

import os
from pathlib import Path

# The project checkout (compose/, images/, trainer/ sit beside sim/).
ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TEMPLATE = ROOT / "compose" / "cluster.yaml"
IMAGES_DIR = ROOT / "images"
TRAINER_DIR = ROOT / "trainer"


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
