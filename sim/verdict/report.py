"""The report of a run: a terminal summary, report.json, and the timeline picture in a PNG and an HTML page.

Everything here is a pure function of the run model (sim/verdict/runmodel.py) and the Verdict the checkers
computed from it. The timeline is data from sim/verdict/timeline.py, drawn by sim/verdict/plot.py.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from sim.core.history import DEVICE_EVENTS, WorkerRecord
from sim.core.nodes import node_order
from sim.core.spec import emulated_devices_line
from sim.verdict import EXPECTED_WORDS, CheckResult, FaultRecovery, Verdict
from sim.verdict.checkers import Stuck
from sim.verdict.diagnoses.registry import Diagnosis, format_diagnoses
from sim.verdict.plot import draw_timeline
from sim.verdict.recovery import RecoveryPhases, recoveries
from sim.verdict.runmodel import STEP_SOURCE_WORDS, RunModel
from sim.verdict.timeline import JobEnd, build_timeline, job_end_after_faults, run_origin

RESTARTS_NOTE = "torch counts restarts per agent"
PROFILE_WORDS = {"torch-defaults": "torch defaults"}


class ReportFiles(NamedTuple):
    """The files write_report writes, in one folder (report.json's "files" names them by these fields)."""

    json: Path
    png: Path
    html: Path

    @classmethod
    def in_folder(cls, folder: Path) -> ReportFiles:
        return cls(json=folder / "report.json", png=folder / "timeline.png", html=folder / "timeline.html")


def write_report(
    run: RunModel,
    verdict: Verdict,
    out_dir: Path,
    *,
    title: str,
    profile: str | None,
    diagnoses: Sequence[Diagnosis] = (),
) -> ReportFiles:
    """Write report.json, timeline.png and timeline.html into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles.in_folder(out_dir)
    devices = device_facts(run)
    draw_timeline(
        build_timeline(run, verdict),
        files.png,
        title=title,
        verdict=verdict,
        profile=profile_label(profile, run),
        devices=devices and devices.line,
    )
    data = build_report(verdict, run, title=title, profile=profile, files=files, diagnoses=diagnoses)
    files.json.write_text(json.dumps(data.to_json(), indent=2, default=_json_default) + "\n", encoding="utf-8")
    files.html.write_text(render_html(data, files.png.read_bytes()), encoding="utf-8")
    return files


def profile_label(profile: str | None, run: RunModel) -> str:
    """ "fast", "torch defaults", ...: the given profile, else the run start record's."""
    if profile is None and run.start is not None:
        profile = run.start.profile
    return PROFILE_WORDS.get(profile, profile) if profile else "unknown"


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What ran the devices (report.json's "devices")."""

    per_node: int | None
    failure_timing: str
    line: str  # how the report words it
    calls: dict[str, int]  # emulated call -> count, over every worker process, most first
    watchdog_aborts: int  # collectives NCCL's timing held, then aborted
    seen_by_workers: bool  # the workers' own "emulated" record came (not just the spec)
    emulated: bool = True


def device_facts(run: RunModel) -> DeviceFacts | None:
    """What ran the devices: the run's spec (devices, failure_timing) and its workers' emulation records
    (images/node/elastic_sim_devices.py): the emulated calls summed over every worker process (each
    process's last count), the timing its process groups had, and the collectives NCCL's timing held. None
    for a run that says nothing of it."""
    spec = run.spec_fields
    records = [r for r in run.all_records if isinstance(r, WorkerRecord) and r.event in DEVICE_EVENTS]
    announced = next((r for r in records if r.event == "emulated"), None)
    if spec.devices != "emulated" and announced is None:
        return None
    per_node = announced.per_node if announced and announced.per_node else spec.nproc_per_node
    timing = (announced.failure_timing if announced else None) or spec.failure_timing or "nccl"
    last: dict[tuple, dict] = {}
    for r in records:
        if r.event == "emulated_calls" and r.calls:
            last[(r.node, r.pid, r.restart)] = r.calls
    calls: dict[str, int] = {}
    for counts in last.values():
        for name, n in counts.items():
            if isinstance(n, int):
                calls[name] = calls.get(name, 0) + n
    held = [r for r in records if r.event == "nccl_watchdog"]
    # Configured NCCL's, but every process group the workers made was gloo at the script's asking.
    asked_gloo = timing == "nccl" and {r.failure_timing for r in records if r.event == "emulated_group"} == {"gloo"}
    return DeviceFacts(
        per_node=per_node,
        failure_timing="gloo" if asked_gloo else timing,  # the timing in force
        line=emulated_devices_line(per_node, timing, script_asked_gloo=asked_gloo),
        calls=dict(sorted(calls.items(), key=lambda item: (-item[1], item[0]))),
        watchdog_aborts=len(held),
        seen_by_workers=announced is not None,
    )


def _calls_words(calls: dict) -> str:
    return ", ".join(f"{name} ×{n}" for name, n in calls.items()) or "none"


# ---------------------------------------------------------------- summary, JSON, HTML


@dataclasses.dataclass(frozen=True)
class RecoveryRow:
    """One fault's recovery as the report shows it: the checker's figures, when, and where the time went."""

    recovery: FaultRecovery
    since_start_s: float
    phases: RecoveryPhases

    def to_json(self) -> dict:
        return {
            **dataclasses.asdict(self.recovery),
            "since_start_s": self.since_start_s,
            "phases": self.phases.as_dict(),
        }


@dataclasses.dataclass(frozen=True)
class TrainingFacts:
    step_source: str
    seen_through: str  # the step source in words
    highest_step: int | None  # None: steps not numbered across restarts
    step_efficiency: float | None
    zombie_records: int
    not_measured: tuple[str, ...]  # checks that could not measure this run


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything the report says, typed: the verdict the checkers handed over, and what the report adds to it
    (recovery phases, job ends, training, devices). `to_json()` is report.json."""

    title: str
    verdict: Verdict
    profile: str
    start: float | None
    duration_s: float | None
    recoveries: tuple[RecoveryRow, ...]
    job_end: tuple[JobEnd, ...]
    training: TrainingFacts
    diagnoses: tuple[Diagnosis, ...]
    devices: DeviceFacts | None
    skipped_lines: int  # history lines that were not a record (torn writes)
    files: ReportFiles | None = None
    node_bounds: str | None = None  # each node's memory and pids limits, in words (None: not recorded)

    @property
    def word(self) -> str:
        return self.verdict.word

    def to_json(self) -> dict:
        """The figures of the report as plain data (what report.json holds)."""
        return {
            "title": self.title,
            "verdict": self.word,
            "valid": self.verdict.valid,
            "expected": self.verdict.expected,
            "profile": self.profile,
            "run": {"start": self.start, "duration_s": self.duration_s},
            "checks": [{**dataclasses.asdict(r), "metrics": r.metrics.to_json()} for r in self.verdict.results],
            "recoveries": [row.to_json() for row in self.recoveries],
            "job_end": [dataclasses.asdict(row) for row in self.job_end],
            "restarts_per_node": dict(self.verdict.restarts_per_node),
            "restarts_note": RESTARTS_NOTE,
            "rounds": self.verdict.rounds,
            "training": {**dataclasses.asdict(self.training), "not_measured": list(self.training.not_measured)},
            "diagnoses": [dataclasses.asdict(d) for d in self.diagnoses],
            "devices": None if self.devices is None else dataclasses.asdict(self.devices),
            "node_bounds": self.node_bounds,
            "history": {"skipped_lines": self.skipped_lines},
            "files": {} if self.files is None else {kind: str(path) for kind, path in self.files._asdict().items()},
        }


def build_report(
    verdict: Verdict,
    run: RunModel,
    *,
    title: str,
    profile: str | None,
    files: ReportFiles | None = None,
    diagnoses: Sequence[Diagnosis] = (),
) -> Report:
    """The report of a run, from its model and the verdict the checkers computed from it."""
    origin = run_origin(run)
    phases = {r.fault.op: r.phases for r in recoveries(run)}
    return Report(
        title=title,
        verdict=verdict,
        profile=profile_label(profile, run),
        start=origin,
        duration_s=None if origin is None else round(run.all_records[-1].t - origin, 3),
        recoveries=tuple(
            RecoveryRow(r, _since(r.t_fault, origin, verdict), phases.get(r.op, RecoveryPhases()))
            for r in verdict.recoveries
        ),
        job_end=tuple(job_end_after_faults(verdict, run)),
        training=TrainingFacts(
            step_source=run.step_source,
            seen_through=STEP_SOURCE_WORDS[run.step_source],
            highest_step=run.highest_step if run.steps_known else None,
            step_efficiency=_step_efficiency(verdict),
            zombie_records=len(run.zombies),
            # "trained" unmeasured is the verdict itself (CANNOT TELL), said in the headline
            not_measured=tuple(r.name for r in verdict.results if not r.measured and r.name != "trained"),
        ),
        diagnoses=tuple(diagnoses),
        devices=device_facts(run),
        skipped_lines=run.skipped_lines,
        files=files,
        node_bounds=node_bounds(run),
    )


def node_bounds(run: RunModel) -> str | None:
    """Each node's bounds as the run start record gives them (a run that ran out of memory was bounded by
    this); None for a history written before nodes had bounds."""
    spec = run.spec_fields
    if spec.pids is None:
        return None
    if spec.memory_limit:
        mib = -(-spec.memory_limit // 2**20)
        given = "--memory" if spec.memory is not None else "the default share of this machine; --memory sets it"
        memory = f"memory {mib} MiB per node, no swap ({given})"
    else:
        memory = "no memory limit (--memory none)"
    return f"{memory}; pids {spec.pids} per node"


def _step_efficiency(verdict: Verdict) -> float | None:
    progress = verdict.result("progress")
    return progress.metrics.step_efficiency if progress is not None else None


def _since(t: float, origin: float | None, verdict: Verdict) -> float:
    """Seconds since the run start; without a history, since the first fault."""
    if origin is None:
        origin = min(r.t_fault for r in verdict.recoveries)
    return round(t - origin, 3)


def _json_default(value):
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)  # Paths, enums, ...: their text is what a reader wants


def _seconds(value: float | None, never: str = "never") -> str:
    return never if value is None else f"{value:.1f} s"


def _world_change(before: int | None, after: int | None) -> str:
    return f"{'?' if before is None else before} → {'?' if after is None else after}"


def _check_row(result: CheckResult) -> list[str]:
    return [result.name, _result_word(result), str(result.reasons[0]) if result.reasons else ""]


def _result_word(result: CheckResult) -> str:
    """ok, FAIL, or n/a: not measurable on this run (the reason says how to enable it); "cannot tell" for whether
    the job trained at all."""
    if not result.measured and result.name == "trained":
        return "cannot tell"
    if not result.measured:
        return "n/a"
    return "ok" if result.valid else "FAIL"


def _fault_row(row: RecoveryRow, never: str = "never") -> list[str]:
    """One row of the faults table."""
    recovery = row.recovery
    after = recovery.throughput_after
    if recovery.degraded and after is None:
        after = recovery.throughput_during  # never healed: the rate it left training at
    return [
        f"+{row.since_start_s:.1f} s",
        recovery.fault,
        recovery.target or "-",
        "no restart" if recovery.degraded else _seconds(recovery.recovery_s, never),
        "-" if recovery.steps_lost is None else str(recovery.steps_lost),
        _world_change(recovery.world_before, recovery.world_after),
        _rate_change(recovery.throughput_before, after),
        *_phase_cells(row),
    ]


def _phase_cells(row: RecoveryRow) -> list[str]:
    """Where the recovery went, "0.1/2.2/3.0/0.8/0.4/0.9" ("?": not in the history), and the rendezvous'
    share of the recovery time; "-" where no phase is known."""
    phases = [getattr(row.phases, name) for name in PHASE_NAMES]
    if all(phase is None for phase in phases):
        return ["-", "-"]
    total, rendezvous = row.recovery.recovery_s, row.phases.rendezvous_s
    share = f"{rendezvous / total:.0%}" if rendezvous is not None and total else "-"
    return ["/".join("?" if phase is None else f"{phase:.1f}" for phase in phases), share]


def _training_words(training: TrainingFacts) -> str:
    words = [training.seen_through]
    if training.highest_step is not None:
        words.append(f"highest step {training.highest_step}")
    if training.step_efficiency is not None:
        words.append(f"step efficiency {training.step_efficiency:.0%} (steps kept / steps run)")
    if training.zombie_records:
        words.append(f"{training.zombie_records} records from zombie workers of an old round, left out")
    if training.not_measured:
        words.append(f"not measurable: {', '.join(training.not_measured)} (see the checks)")
    return "; ".join(words)


def _rate_change(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "-"
    return f"{'?' if before is None else f'{before:.2f}'} → {'?' if after is None else f'{after:.2f}'}"


# Where each recovery went: RecoveryPhases' fields, in order, by short names.
PHASE_NAMES = {
    "detection_s": "detect",
    "rendezvous_s": "rdzv",
    "worker_start_s": "start",
    "pg_init_s": "pg",
    "ckpt_load_s": "ckpt",
    "first_step_s": "step",
}
PHASES_HEADER = f"s: {'/'.join(PHASE_NAMES.values())}"
FAULT_HEADERS = [
    "time",
    "fault",
    "target",
    "recovery",
    "steps lost",
    "world",
    "steps/s before → after",
    PHASES_HEADER,
    "rdzv share",
]
JOB_END_HEADERS = ["time", "fault", "target", "agents ended after it"]


def _job_end_row(row: JobEnd) -> list[str]:
    when = f"+{row.since_start_s:.1f} s"
    ended = "-" if row.ended_after_s is None else f"{row.agents_ended} within {row.ended_after_s:.1f} s"
    return [when, row.fault, row.target or "-", ended]


def fault_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The faults table: recovery figures, or for a run meant to fail, how soon it ended."""
    if report.job_end:
        return JOB_END_HEADERS, [_job_end_row(row) for row in report.job_end]
    unmeasured = "recovery" in report.training.not_measured
    rows = [_fault_row(r, never="n/a" if unmeasured else "never") for r in report.recoveries]
    notes = [_compound_note(r.recovery) for r in report.recoveries]
    if not any(notes):
        return FAULT_HEADERS, rows
    return [*FAULT_HEADERS, "note"], [[*row, note] for row, note in zip(rows, notes, strict=True)]


def _compound_note(recovery: FaultRecovery) -> str:
    """A fault that struck during another's regroup, or whose regroup another cut: said in the faults table."""
    if recovery.struck_during:
        return f"struck during {recovery.struck_during}'s regroup"
    if recovery.regroup_cut_by:
        return f"regroup cut by {recovery.regroup_cut_by}"
    return ""


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    return [
        indent + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def headline_reasons(verdict: Verdict, diagnoses: Sequence[Diagnosis] = (), stuck: Stuck | None = None) -> list[str]:
    """What the verdict's headline says under it. A job that cannot finish: its first cause (the first diagnosis,
    with its first evidence line: the script's error and its line), then who gave up and what the rest wait for.
    A run that never trained (or where nobody could tell) says so, whatever else failed after."""
    lines = []
    if stuck is not None:
        if diagnoses:
            first = diagnoses[0]
            lines.append(f"first cause: {first.title}")
            lines += [f"  {first.evidence[0]}"] if first.evidence else []
        lines += stuck.words()
    trained = verdict.result("trained")
    if trained is not None and not trained.valid and trained.reasons:
        lines.append(trained.reasons[0])
    return lines


def format_summary(verdict: Verdict, run: RunModel, *, stuck: Stuck | None = None, **options) -> str:
    """The report for a terminal: verdict, checks, diagnoses, faults, restarts, rounds, profile, files.
    `options`: build_report's (title, profile, files, diagnoses); `stuck`: the job cannot finish (`up` found it so)."""
    report = build_report(verdict, run, **options)
    title, files, diagnoses = report.title, report.files, report.diagnoses
    expected = EXPECTED_WORDS.get(verdict.expected, verdict.expected)
    lines = [f"{title}: {report.word} (expected: {expected})"]
    lines += [f"  {line}" for line in headline_reasons(verdict, diagnoses, stuck)]
    lines.append("")
    lines.append("Checks:")
    lines += (
        _table(["check", "result", "first reason"], [_check_row(r) for r in verdict.results])
        if verdict.results
        else ["  (none)"]
    )
    if diagnoses:
        lines += ["", "Why (known causes, with the evidence and the fix):", format_diagnoses(diagnoses)]
    lines.append("")
    lines.append("Faults:")
    headers, rows = fault_table(report)
    lines += _table(headers, rows) if rows else ["  (none)"]
    lines.append("")
    restarts = ", ".join(
        f"{node} {count}"
        for node, count in sorted(verdict.restarts_per_node.items(), key=lambda item: node_order(item[0]))
    )
    lines.append(f"Restarts per node ({RESTARTS_NOTE}): {restarts or 'none'}")
    lines.append(f"Rendezvous rounds: {verdict.rounds}")
    lines.append(f"Training seen through: {_training_words(report.training)}")
    lines.append(f"Profile: {report.profile}")
    if report.node_bounds:
        lines.append(f"Node bounds: {report.node_bounds}")
    if report.devices:
        lines.append(f"Devices: {report.devices.line}")
        lines.append(f"Emulated calls (all workers, all starts): {_calls_words(report.devices.calls)}")
    if run.skipped_lines:
        lines.append(f"History: {run.skipped_lines} line(s) skipped, not a whole record (a torn write?)")
    if files is not None:
        lines.append("Files:")
        lines += [f"  {path}" for path in files]
    return "\n".join(lines) + "\n"


HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 .pass { color: #2e7d32; } h1 .fail { color: #c62828; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.ok { color: #2e7d32; font-weight: bold; } td.fail { color: #c62828; font-weight: bold; }
img { max-width: 100%; border: 1px solid #ddd; }
code { font-size: 0.85em; color: #555; }
"""


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (callers escape text); headers are escaped here; none: no header row."""
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>" if headers else ""
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _cell(text, css_class: str | None = None) -> str:
    attribute = f' class="{css_class}"' if css_class else ""
    return f"<td{attribute}>{html.escape(str(text))}</td>"


def _html_check_row(check: CheckResult) -> list[str]:
    reasons = "<br>".join(html.escape(str(reason)) for reason in check.reasons)
    metrics = html.escape(json.dumps(check.metrics.to_json(), default=_json_default))
    word = _result_word(check)
    return [
        _cell(check.name),
        _cell(word, {"ok": "ok", "FAIL": "fail"}.get(word, "")),
        f"<td>{reasons}</td>",
        f"<td><code>{metrics}</code></td>",
    ]


def _html_diagnoses(diagnoses: Sequence[Diagnosis]) -> list[str]:
    if not diagnoses:
        return []
    rows = [
        [
            _cell(d.title),
            _cell(d.cause),
            "<td>" + "<br>".join(f"<code>{html.escape(e)}</code>" for e in d.evidence) + "</td>",
            _cell(d.fix),
        ]
        for d in diagnoses
    ]
    return ["<h2>Why: known causes</h2>", _html_table(["diagnosis", "cause", "evidence", "fix"], rows)]


def render_html(report: Report, png: bytes) -> str:
    """A self-contained page (no network): the timeline inline as base64, the figures as tables."""
    verdict = report.verdict
    verdict_class = "pass" if verdict.valid else "fail"
    facts = [
        [_cell("verdict"), _cell(report.word, verdict_class)],
        *([_cell("why"), _cell(line)] for line in headline_reasons(verdict)),
        [_cell("expected"), _cell(EXPECTED_WORDS.get(verdict.expected, verdict.expected))],
        [_cell("profile"), _cell(report.profile)],
        [_cell("rendezvous rounds"), _cell(verdict.rounds)],
        [_cell("training seen through"), _cell(_training_words(report.training))],
    ]
    if report.duration_s is not None:
        facts.append([_cell("duration"), _cell(_seconds(report.duration_s))])
    if report.node_bounds:
        facts.append([_cell("node bounds"), _cell(report.node_bounds)])
    if report.devices:
        facts.append([_cell("devices"), _cell(report.devices.line)])
        facts.append([_cell("emulated calls"), _cell(_calls_words(report.devices.calls))])
    checks = [_html_check_row(check) for check in verdict.results]
    fault_headers, fault_rows = fault_table(report)
    faults = [[_cell(cell) for cell in row] for row in fault_rows]
    restarts = [
        [_cell(node), _cell(count)]
        for node, count in sorted(verdict.restarts_per_node.items(), key=lambda item: node_order(item[0]))
    ]
    image = base64.b64encode(png).decode("ascii")
    title = html.escape(report.title)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            f'<html lang="en"><head><meta charset="utf-8"><title>{title}: {report.word}</title>',
            f"<style>{HTML_STYLE}</style></head><body>",
            f'<h1>{title}: <span class="{verdict_class}">{report.word}</span></h1>',
            _html_table([], facts),
            f'<img alt="timeline of the run" src="data:image/png;base64,{image}">',
            "<h2>Checks</h2>",
            _html_table(["check", "result", "reasons", "metrics"], checks) if checks else "<p>none</p>",
            *_html_diagnoses(report.diagnoses),
            "<h2>Faults</h2>",
            _html_table(fault_headers, faults) if faults else "<p>none</p>",
            f"<h2>Restarts per node</h2><p>{html.escape(RESTARTS_NOTE)}.</p>",
            _html_table(["node", "restarts"], restarts) if restarts else "<p>none</p>",
            "</body></html>",
            "",
        ]
    )
