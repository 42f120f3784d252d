"""The shipped scenarios (chaos/scenarios/*.yaml) and name lookup."""

from __future__ import annotations

from pathlib import Path

from sim.errors import UsageError

from .scenario import Scenario, load_scenario

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def shipped_paths() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*.yaml"))


def shipped_scenarios() -> list[Scenario]:
    return [load_scenario(path) for path in shipped_paths()]


def find_scenario(name_or_path: str) -> Path:
    """A path to a scenario file, or the name of a shipped one."""
    path = Path(name_or_path)
    if path.exists():
        return path  # a folder, or a file: load_scenario says what is wrong with it
    shipped = SCENARIO_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(p.stem for p in shipped_paths()) or "none"
    raise UsageError(f"scenario '{name_or_path}': no such file or shipped scenario; shipped: {names}")


# The scenarios `make test` runs (the rest run in `make test-full`): every fault kind and every
# expected outcome on each backend the catalog runs it on, the shortest scenario for each; on
# etcd-v3, tour-v3 runs most kinds in one job (tests/unit/test_scenario.py holds this to that rule
# as the catalog grows).
QUICK_SUITE = frozenset(
    {
        ("agent-crash", "etcd-v2"),
        ("corrupt-checkpoint", "etcd-v2"),
        ("etcd-cut", "etcd-v2"),
        ("etcd-loss", "etcd-v2"),
        ("etcd-restart", "etcd-v2"),
        ("etcd-wipe", "etcd-v2"),
        ("freeze-short", "etcd-v2"),
        ("full-disk", "etcd-v2"),
        ("hang-collectives", "etcd-v2"),
        ("hang-worker", "etcd-v2"),
        ("kill-during-checkpoint", "etcd-v2"),
        ("lossy-link", "etcd-v2"),
        ("node-crash", "etcd-v2"),
        ("node-restart", "etcd-v2"),
        ("oom-worker", "etcd-v2"),
        ("preemption", "etcd-v2"),
        ("scale-down", "etcd-v2"),
        ("straggler", "etcd-v2"),
        ("agent-crash", "c10d"),
        ("freeze-long", "c10d"),
        ("node-crash", "c10d"),
        ("node-restart", "c10d"),
        ("preemption", "c10d"),
        ("restart-budget", "c10d"),
        ("scale-up", "c10d"),
        ("split-groups", "c10d"),
        ("etcd-restart-v3", "etcd-v3"),
        ("node-crash", "etcd-v3"),
        ("restart-budget", "etcd-v3"),
        ("tour-v3", "etcd-v3"),
    }
)
