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
