"""The scenario catalog: the shipped scenarios (chaos/scenarios/*.yaml), name lookup and the quick suite
(the fault catalog is sim/faults/catalog.py)."""

from __future__ import annotations

from pathlib import Path

from sim.core.errors import UsageError
from sim.core.paths import SCENARIOS_DIR
from sim.scenarios.scenario import Scenario, load_scenario

SCENARIO_DIR = SCENARIOS_DIR  # chaos/scenarios/, where users find them


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
# expected outcome on each backend the catalog runs it on. A tour (tour.yaml on etcd-v2 and c10d,
# tour-v3.yaml on etcd-v3) runs most kinds one after another in one job; the scenarios whose kinds or
# outcomes differ between backends (etcd faults, partitions, restart budgets) run on their own
# (tests/unit/test_scenario.py holds this to that rule as the catalog grows).
QUICK_SUITE = frozenset(
    {
        ("tour", "etcd-v2"),
        ("etcd-cut", "etcd-v2"),
        ("etcd-loss", "etcd-v2"),
        ("etcd-restart", "etcd-v2"),
        ("etcd-wipe", "etcd-v2"),
        ("clock-skew-5s", "etcd-v2"),
        ("zombie-rank0", "etcd-v2"),
        ("tour", "c10d"),
        ("restart-budget", "c10d"),
        ("split-groups", "c10d"),
        ("clock-skew-5s", "c10d"),
        ("zombie-rank0-c10d", "c10d"),
        ("hang-default-timeout", "c10d"),
        ("hang-default-timeout", "etcd-v2"),
        ("tour-v3", "etcd-v3"),
        ("etcd-restart-v3", "etcd-v3"),
        ("node-crash", "etcd-v3"),
        ("restart-budget", "etcd-v3"),
        ("clock-skew-5s", "etcd-v3"),
    }
)
