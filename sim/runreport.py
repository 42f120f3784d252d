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
               profile: str | None = None, checkers: tuple[str, ...] | None = None, **bounds) -> tuple[Verdict, str]:
    from .checkers import RunSpec, check_all
    from .report import format_summary, write_report
    history = sorted(History(run_dir / FILE_NAME).records(), key=lambda r: r["t"])
    scenario = next((r for r in history if r.get("type") == "run" and r.get("event") == "scenario"), {})
    # Unless told, a scenario run is judged against the outcome its scenario expected.
    expected = expected or scenario.get("expected") or "recovers"
    spec = RunSpec.from_history(history, expected=expected, **bounds)
    checkers = checkers or scenario.get("checkers")
    verdict = check_all(history, spec, only=checkers)
    # A scenario run records its profile in its own line; a plain `up` in the start line.
    runs = [r for r in history if r.get("type") == "run" and r.get("event") in ("scenario", "start")]
    profile = profile or next((r.get("profile") for r in runs if r.get("event") == "scenario"),
                              next((r.get("profile") for r in runs), None))
    title = title or run_dir.name
    files = write_report(history, verdict, run_dir / "report", title=title, profile=profile)
    return verdict, format_summary(verdict, history, title=title, profile=profile, files=files)
