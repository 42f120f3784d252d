"""What the long benchmarks built from generated scenarios share (bench/soak.py, bench/ckpt_kills.py):
run a scenario written as a dict through the real runner, read its report, and sum up recoveries."""

from __future__ import annotations

import json
import statistics

import yaml

from bench.common import ROOT, print_columns
from sim.scenarios.runner import ScenarioResult, run_scenario
from sim.scenarios.scenario import parse_scenario

# Scripts in a generated scenario are named as from the shipped catalog's folder.
SOURCE_DIR = ROOT / "chaos" / "scenarios"


def run_generated(document: dict, backend: str, seed: int) -> tuple[ScenarioResult, dict]:
    """Run `document` (a scenario as YAML would hold it) on `backend`; its result and report.json."""
    text = yaml.safe_dump(document, sort_keys=False)
    scenario = parse_scenario(text, str(SOURCE_DIR / f"{document['name']}.yaml"))
    [result] = run_scenario(scenario, backend, seed=seed)
    report = json.loads((result.run_dir / "report" / "report.json").read_text())
    return result, report


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, round(q) - 1))]


def recovery_rows(report: dict) -> list[dict]:
    """Per fault kind of a report: injected, recovered, recovery p50/p95 (s), steps lost (sum, max)."""
    by_kind: dict[str, list[dict]] = {}
    for recovery in report.get("recoveries", []):
        # etcd's restart is a restart-node of the etcd container: named as the scenario names it.
        kind = "etcd-restart" if recovery["target"] == "etcd" else recovery["fault"]
        by_kind.setdefault(kind, []).append(recovery)
    rows = []
    for kind, recoveries in sorted(by_kind.items()):
        times = sorted(r["recovery_s"] for r in recoveries if r.get("recovery_s") is not None)
        lost = [r["steps_lost"] for r in recoveries if r.get("steps_lost") is not None]
        rows.append(
            {
                "fault": kind,
                "injected": len(recoveries),
                # A fault training went on through (degraded: no restart, steps after it) took nothing to recover.
                "recovered": len(times) + sum(1 for r in recoveries if r.get("degraded")),
                "recovery_p50_s": percentile(times, 50),
                "recovery_p95_s": percentile(times, 95),
                "steps_lost": sum(lost),
                "steps_lost_max": max(lost, default=None),
            }
        )
    return rows


def damaged_resumes(report: dict) -> tuple[list[int], bool]:
    """The checkpoint steps damaged on purpose, and whether no start resumed from one of them
    (the checkpoint_integrity checker's verdict)."""
    check = next((c for c in report.get("checks", []) if c["name"] == "checkpoint_integrity"), None)
    if check is None:
        return [], False
    return list(check["metrics"].get("damaged_steps", [])), bool(check["valid"] and check["measured"])


def unusable_checkpoints(result: ScenarioResult) -> list[str]:
    """The shipped trainer's warnings about checkpoints it found damaged and skipped at a resume."""
    found = []
    for line in (result.run_dir / "history.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "trainer" and "unusable checkpoint" in str(record.get("message", "")):
            found.append(record["message"])
    return found


def print_recovery_table(backend: str, rows: list[dict]) -> None:
    def cell(value) -> str:
        return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)

    keys = ("fault", "injected", "recovered", "recovery_p50_s", "recovery_p95_s", "steps_lost", "steps_lost_max")
    print(f"\n{backend}:")
    print_columns([keys, *[tuple(cell(row[k]) for k in keys) for row in rows]])
