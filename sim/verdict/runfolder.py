"""A run folder (runs/NAME-RUNID/): find it, judge its history, write its report (`sim report`, the runner, vet)."""

from __future__ import annotations

from pathlib import Path

from sim.core.errors import UsageError
from sim.core.history import FILE_NAME, History
from sim.core.paths import state_home
from sim.verdict import Verdict


def resolve_run_dir(run: str | None) -> Path:
    """A run folder path, a run name (CLUSTER-RUNID), a cluster name (its newest run), or the newest run."""
    runs = state_home() / "runs"
    candidates = (
        sorted((p for p in runs.glob("*") if (p / FILE_NAME).exists()), key=lambda p: p.stat().st_mtime)
        if runs.exists()
        else []
    )
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


def report_run(
    run_dir: Path,
    *,
    expected: str | None = None,
    title: str | None = None,
    profile: str | None = None,
    checkers: tuple[str, ...] | None = None,
    live: bool = False,
    stuck=None,
    **bounds,
) -> tuple[Verdict, str]:
    """Check a run's history and write its report. `live`: the run is still going, so how it
    ends (completed, fails_cleanly) is not judged yet and the verdict is provisional. `stuck`: the job cannot
    finish (sim.verdict.checkers.Stuck, as `up` found it): the summary's headline says so, its first cause first."""
    from sim.verdict.report import format_summary, write_report
    from sim.verdict.runmodel import RunModel

    contents = History(run_dir / FILE_NAME).read()
    run = RunModel(contents.records, skipped_lines=contents.skipped_lines)  # built once, read by all below
    verdict, found = judge(run, saved_logs(run_dir), expected=expected, checkers=checkers, live=live, **bounds)
    scenario = run.scenario
    # A scenario run records its profile in its own line; a plain `up` in the start line.
    profile = profile or (scenario and scenario.profile) or (run.start and run.start.profile)
    title = title or run_dir.name
    if live:
        title += " (still running: provisional, its end not judged yet)"
    files = write_report(run, verdict, run_dir / "report", title=title, profile=profile, diagnoses=found)
    summary = format_summary(verdict, run, title=title, profile=profile, files=files, diagnoses=found, stuck=stuck)
    return verdict, summary


def judge(
    run, logs: dict[str, str], *, expected: str | None = None, checkers=None, live: bool = False, **bounds
) -> tuple[Verdict, list]:
    """A run's verdict and its diagnoses (a RunModel and its saved logs in; nothing written)."""
    from sim.verdict.checkers import CHECKS_FOR, RunSpec, check_all
    from sim.verdict.diagnoses.registry import diagnose

    scenario = run.scenario
    # Unless told, a scenario run is judged against the outcome its scenario expected.
    expected = expected or (scenario and scenario.expected) or "recovers"
    spec = RunSpec.from_run(run, expected=expected, **bounds)
    checkers = checkers or (scenario and scenario.checkers)
    if live:
        checkers = tuple(name for name in (checkers or CHECKS_FOR[spec.expected]) if name not in ENDING_CHECKS)
    verdict = check_all(run, spec, only=checkers, judge_training=not live)  # a live run may not have trained yet
    found = diagnose(run, logs, loss_jump_tolerance=spec.loss_jump_tolerance)
    if not verdict.valid and not found:
        from sim.verdict.diagnoses.evidence import unexplained

        found = [unexplained(run)]  # no rule's premise holds: say so, with what each node did last
    return verdict, found


def saved_logs(run_dir: Path) -> dict[str, str]:
    """Every container's log as `down` saved it (node -> text); none while the cluster runs:
    the diagnoses then read the agents' events from the history alone."""
    logs_dir = run_dir / "logs"
    if not logs_dir.is_dir():
        return {}
    return {path.stem: path.read_text(errors="replace") for path in sorted(logs_dir.glob("*.log"))}


# Checkers that judge how a run ended: a live run has not ended.
ENDING_CHECKS = ("completed", "fails_cleanly", "stalled")
