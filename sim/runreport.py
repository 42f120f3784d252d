"""`sim report`: find a run, check its history, write the report files."""

from __future__ import annotations

from pathlib import Path

from .errors import UsageError
from .history import FILE_NAME, History
from .paths import state_home
from .verdict import Verdict


def resolve_run_dir(run: str | None) -> Path:
    """A run folder path, a run name (CLUSTER-RUNID), a cluster name (its newest run), or the newest run."""
    runs = state_home() / "runs"
    candidates = sorted((p for p in runs.glob("*") if (p / FILE_NAME).exists()), key=lambda p: p.stat().st_mtime) \
        if runs.exists() else []
    if run is None:
        if not candidates:
            raise UsageError(f"report: no runs under {runs}; start one with `python -m sim up`")
        return candidates[-1]
    path = Path(run)
    if (path / FILE_NAME).exists():
        return path
    if (runs / run / FILE_NAME).exists():
        return runs / run
    same_cluster = [p for p in candidates if p.name.startswith(f"{run}-")]
    if same_cluster:
        return same_cluster[-1]
    raise UsageError(f"report '{run}': no such run folder, run or cluster; runs are in {runs}")


def report_run(run_dir: Path, *, expected: str | None = None, title: str | None = None,
               profile: str | None = None, checkers: tuple[str, ...] | None = None, live: bool = False,
               **bounds) -> tuple[Verdict, str]:
    """Check a run's history and write its report. `live`: the run is still going, so how it
    ends (completed, fails_cleanly) is not judged yet and the verdict is provisional."""
    from .checkers import CHECKS_FOR, RunSpec, check_all
    from .diagnose import diagnose
    from .report import format_summary, write_report
    history = sorted(History(run_dir / FILE_NAME).records(), key=lambda r: r["t"])
    scenario = next((r for r in history if r.get("type") == "run" and r.get("event") == "scenario"), {})
    # Unless told, a scenario run is judged against the outcome its scenario expected.
    expected = expected or scenario.get("expected") or "recovers"
    spec = RunSpec.from_history(history, expected=expected, **bounds)
    checkers = checkers or scenario.get("checkers")
    if live:
        checkers = tuple(name for name in (checkers or CHECKS_FOR[spec.expected]) if name not in ENDING_CHECKS)
    verdict = check_all(history, spec, only=checkers)
    # A scenario run records its profile in its own line; a plain `up` in the start line.
    runs = [r for r in history if r.get("type") == "run" and r.get("event") in ("scenario", "start")]
    profile = profile or next((r.get("profile") for r in runs if r.get("event") == "scenario"),
                              next((r.get("profile") for r in runs), None))
    title = title or run_dir.name
    if live:
        title += " (still running: provisional, its end not judged yet)"
    found = diagnose(history, saved_logs(run_dir))
    files = write_report(history, verdict, run_dir / "report", title=title, profile=profile, diagnoses=found)
    return verdict, format_summary(verdict, history, title=title, profile=profile, files=files, diagnoses=found)


def saved_logs(run_dir: Path) -> dict[str, str]:
    """Every container's log as `down` saved it (node -> text); none while the cluster runs:
    the diagnoses then read the agents' events from the history alone."""
    logs_dir = run_dir / "logs"
    if not logs_dir.is_dir():
        return {}
    return {path.stem: path.read_text(errors="replace") for path in sorted(logs_dir.glob("*.log"))}


# Checkers that judge how a run ended: a live run has not ended.
ENDING_CHECKS = ("completed", "fails_cleanly")
