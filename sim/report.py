"""The report of a run: a terminal summary, report.json, and a timeline picture (PNG + HTML).

Everything here is a pure function of the history (see sim/verdict.py for its records)
and the Verdict the checkers computed from it; the picture is drawn off-screen (Agg).
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import html
import json
import re
import statistics
from pathlib import Path
from typing import Iterable, Sequence

from .diagnose import Diagnosis, format_diagnoses
from .runmodel import STEP_SOURCE_WORDS, RunModel
from .verdict import CheckResult, FaultRecovery, Verdict

RESTARTS_NOTE = "torch counts restarts per agent"
EXPECTED_WORDS = {"recovers": "the job recovers", "fails": "the job fails"}
PROFILE_WORDS = {"torch-defaults": "torch defaults"}

# Fault ops that undo earlier ones: they end a shaded span instead of starting one.
REPAIR_FAULTS = ("heal", "unpause")
# Faults that stay in force until a heal/unpause (the others act once).
REVERSIBLE_FAULTS = ("partition", "pause", "link")
DOCKER_DOWN = ("die", "kill", "stop", "destroy")
# Agent events after which a node has no workers until its next progress line.
AGENT_RESTARTS = ("worker_failed", "group_failed", "new_nodes")

# Lane states, in drawing order: later ones are drawn on top of earlier ones.
LANE_STATES = ("running", "restarting", "paused", "dead", "zombie", "partitioned")
LANE_COLORS = {"running": "#54a24b", "restarting": "#f2a93b", "paused": "#4c78a8",
               "dead": "#3b3b3b", "zombie": "#e45756", "partitioned": "#9d55b5"}
LANE_LABELS = {"running": "running (training seen; etcd: up)", "restarting": "restarting / joining",
               "paused": "paused", "dead": "dead (container down)",
               "zombie": "zombie (an old round's worker, left behind)", "partitioned": "partitioned (cut off)"}
NO_PROGRESS_COLOR = "#ececec"
FAULT_COLOR = "#d62728"
ROUND_SEPARATION_S = 1.0  # rendezvous events closer than this are one round
ETCD = "etcd"


@dataclasses.dataclass(frozen=True)
class ReportFiles:
    json: Path
    png: Path
    html: Path


def write_report(history: Sequence[dict], verdict: Verdict, out_dir: Path, *,
                 title: str, profile: str | None, diagnoses: Sequence[Diagnosis] = ()) -> ReportFiles:
    """Write report.json, timeline.png and timeline.html into out_dir."""
    history = list(history)  # read more than once: a History.records() generator would run dry
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(json=out_dir / "report.json", png=out_dir / "timeline.png", html=out_dir / "timeline.html")
    draw_timeline(build_timeline(history, verdict), files.png, title=title, verdict=verdict,
                  profile=profile_label(profile, history))
    data = report_data(verdict, history, title=title, profile=profile, files=files, diagnoses=diagnoses)
    files.json.write_text(json.dumps(data, indent=2, default=_json_default) + "\n", encoding="utf-8")
    files.html.write_text(render_html(data, files.png.read_bytes()), encoding="utf-8")
    return files


# ---------------------------------------------------------------- reading the history

def run_origin(history: Sequence[dict]) -> float | None:
    """The x axis starts here: the run's start record, else the first record."""
    for record in history:
        if record.get("type") == "run" and record.get("event") == "start" and _is_time(record.get("t")):
            return float(record["t"])
    times = [float(r["t"]) for r in history if _is_time(r.get("t"))]
    return min(times) if times else None


def run_last_time(history: Sequence[dict]) -> float | None:
    times = [float(r["t"]) for r in history if _is_time(r.get("t"))]
    return max(times) if times else None


def profile_label(profile: str | None, history: Sequence[dict]) -> str:
    """"fast", "torch defaults", ...: the given profile, else the run record's."""
    if profile is None:
        profile = next((r.get("profile") for r in history
                        if r.get("type") == "run" and r.get("event") == "start"), None)
    return PROFILE_WORDS.get(profile, profile) if profile else "unknown"


def _is_time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _records(history: Iterable[dict], type_: str, **fields) -> list[dict]:
    """Records of one type (and field values), with a time, in time order."""
    found = [r for r in history if r.get("type") == type_ and _is_time(r.get("t"))
             and all(r.get(key) == value for key, value in fields.items())]
    return sorted(found, key=lambda r: r["t"])


def _fault_node(record: dict) -> str | None:
    """The node a fault acted on: the one it resolved ("random" -> node1), else its target."""
    result = record.get("result") if isinstance(record.get("result"), dict) else {}
    return result.get("node") or record.get("target")


def _fault_id(record: dict) -> str:
    """The id `heal <id>` names: partitions carry theirs; pauses and links are "<fault>-<node>"."""
    result = record.get("result") if isinstance(record.get("result"), dict) else {}
    return result.get("id") or f"{record.get('fault')}-{_fault_node(record)}"


def _repairs(fault: dict, repair: dict) -> bool:
    if repair.get("fault") == "heal":
        return repair.get("target") in ("all", _fault_id(fault))
    return fault.get("fault") == "pause" and _fault_node(repair) == _fault_node(fault)


# ---------------------------------------------------------------- the timeline, as data

@dataclasses.dataclass(frozen=True)
class FaultSpan:
    start: float  # seconds since run start: the fault's invoke
    end: float  # its heal/unpause, or the end of its recovery
    label: str  # fault and target
    outcome: str = ""  # "recovered in 4.4 s, 4 steps lost", "never recovered", "agents ended 1.2 s later", or ""


@dataclasses.dataclass(frozen=True)
class Timeline:
    """What the picture shows, in seconds since run start."""
    end: float
    steps: tuple[tuple[float, int], ...]  # (t, highest step any rank reported around t)
    throughput: tuple[tuple[float, float], ...]  # (t, steps/s over the window before t)
    throughput_window_s: float
    world: tuple[tuple[float, int], ...]  # (t, trainers) at each change
    lanes: dict  # node -> state -> list of (start, end)
    faults: tuple[FaultSpan, ...]
    rounds: tuple[tuple[float, str], ...]  # (t, label) of each rendezvous round
    step_source: str = "trainer"  # sim.runmodel.STEP_SOURCES: what the step axis counts


def build_timeline(history: Sequence[dict], verdict: Verdict) -> Timeline:
    origin = run_origin(history)
    if origin is None:
        return Timeline(end=0.0, steps=(), throughput=(), throughput_window_s=1.0, world=(),
                        lanes={}, faults=(), rounds=())
    # Shift every time to "seconds since start" once, so nothing below needs the origin.
    history = [{**r, "t": float(r["t"]) - origin} for r in history if _is_time(r.get("t"))]
    end = max([0.0] + [r["t"] for r in history])
    model = RunModel(history)  # the checkers' reading of the run: steps, beats and zombies of any script
    steps, throughput, window = step_series(model.progress, end)
    recovery_check = verdict.result("recovery")
    # Not measurable (no training seen at all): no recovery to draw, rather than "never recovered".
    recoveries = {r.op: r for r in verdict.recoveries} if recovery_check is None or recovery_check.measured else {}
    # A run meant to fail: each fault is shaded up to the agents' exits it caused, and says so.
    job_end = {row["op"]: row for row in _job_end_after_faults(verdict, history, 0.0)}
    fault_spans = tuple(_ending(fault_span(fault, history, recoveries.get(fault.get("op")), origin, end),
                                job_end.get(fault.get("op")))
                        for fault in _applied_faults(history))
    return Timeline(end=end, steps=steps, throughput=throughput, throughput_window_s=window,
                    world=world_series(history, model), lanes=node_lanes(history, end, model),
                    faults=fault_spans, rounds=rendezvous_rounds(history), step_source=model.step_source)


def step_series(progress: Sequence[dict], end: float):
    """Highest step per small time bin, and the rolling throughput computed from it
    (from the run model's progress: whatever step source the script offered)."""
    progress = [r for r in progress if isinstance(r.get("step"), int)]
    window = min(20.0, max(2.0, end / 15))  # wide enough to average over several steps
    if not progress:
        return (), (), window
    bin_s = max(end / 600, 0.05)  # about one bin per pixel column
    highest: dict[int, tuple[float, int]] = {}
    for record in progress:
        index = int(record["t"] // bin_s)
        t, step = highest.get(index, (record["t"], record["step"]))
        highest[index] = (max(t, record["t"]), max(step, record["step"]))
    steps = tuple(highest[i] for i in sorted(highest))
    # New steps per bin; a fall back to a checkpoint counts as none, the steps redone do count.
    gains = [(t, max(0, step - previous)) for (_, previous), (t, step) in zip(steps, steps[1:])]
    gain_times = [t for t, _ in gains]
    cumulative = [0]
    for _, gain in gains:
        cumulative.append(cumulative[-1] + gain)
    throughput = []
    sample_s = window / 8  # finer sampling only shows the aliasing of steps against the window
    for index in range(int(end // sample_s) + 1):
        t = index * sample_s
        new_steps = (cumulative[bisect.bisect_right(gain_times, t)]
                     - cumulative[bisect.bisect_right(gain_times, t - window)])
        throughput.append((t, new_steps / window))
    return steps, tuple(throughput), window


def world_series(history: Sequence[dict], model: RunModel) -> tuple[tuple[float, int], ...]:
    """Trainers in the job over time: from the workers' own records (zombies aside) and completed rendezvous."""
    sizes = [(r["t"], r.get("world_size")) for r in model.starts + model.beats]
    sizes += [(r["t"], r.get("global_world_size")) for r in history
              if r.get("type") == "agent" and r.get("event") == "rdzv_complete"]
    changes: list[tuple[float, int]] = []
    for t, size in sorted((t, s) for t, s in sizes if isinstance(s, int)):
        if not changes or changes[-1][1] != size:
            changes.append((t, size))
    return tuple(changes)


def rendezvous_rounds(history: Sequence[dict]) -> tuple[tuple[float, str], ...]:
    """One mark per round: every agent reports each round, so merge by round number or by time."""
    first_seen_by_round: dict[int, float] = {}
    unnumbered = []
    for record in _records(history, "agent"):
        if record.get("event") == "rdzv_joined" and isinstance(record.get("round"), int):
            first_seen_by_round.setdefault(record["round"], record["t"])
        elif record.get("event") in ("rdzv_joined", "rdzv_complete"):
            unnumbered.append(record["t"])
    marks = [(t, f"round {n}") for n, t in first_seen_by_round.items()]
    for t in unnumbered:
        if all(abs(t - seen) > ROUND_SEPARATION_S for seen, _ in marks):
            marks.append((t, ""))
    return tuple(sorted(marks))


def _applied_faults(history: Sequence[dict]) -> list[dict]:
    """One record per fault that took effect (its ok, or info: outcome unknown), repairs aside."""
    return [r for r in _records(history, "fault") if r.get("phase") in ("ok", "info")
            and r.get("fault") not in REPAIR_FAULTS]


def _invoke_time(fault: dict, history: Sequence[dict]) -> float:
    return next((r["t"] for r in history if r.get("type") == "fault" and r.get("op") == fault.get("op")
                 and r.get("phase") == "invoke"), fault["t"])


def _repair_time(fault: dict, history: Sequence[dict]) -> float | None:
    """When a reversible fault (partition, pause, link) was undone; None: never."""
    return next((r["t"] for r in _records(history, "fault", phase="ok")
                 if r["t"] >= fault["t"] and r.get("fault") in REPAIR_FAULTS and _repairs(fault, r)), None)


def fault_span(fault: dict, history: Sequence[dict], recovery: FaultRecovery | None, origin: float,
               end: float) -> FaultSpan:
    """From the fault's invoke to its heal (reversible faults) or to the end of its recovery."""
    if fault.get("fault") in REVERSIBLE_FAULTS:
        span_end = _repair_time(fault, history)
    elif recovery is not None:
        span_end = None if recovery.t_recovered is None else recovery.t_recovered - origin
    else:
        span_end = fault["t"]
    label = " ".join(str(part) for part in (fault.get("fault"), fault.get("target")) if part)
    if _fault_node(fault) not in (None, fault.get("target")):  # "random", "rank:3": name the node it hit
        label += f" → {_fault_node(fault)}"
    return FaultSpan(start=_invoke_time(fault, history), end=end if span_end is None else span_end,
                     label=label, outcome=_recovery_words(recovery))


def _ending(span: FaultSpan, job_end: dict | None) -> FaultSpan:
    if not job_end or job_end["ended_after_s"] is None:
        return span
    return dataclasses.replace(span, end=max(span.end, span.start + job_end["ended_after_s"]),
                               outcome=f"agents ended {job_end['ended_after_s']:.1f} s later")


def _recovery_words(recovery: FaultRecovery | None) -> str:
    if recovery is None:
        return ""
    if recovery.recovery_s is None:
        return "never recovered"
    lost = "" if recovery.steps_lost is None else f", {recovery.steps_lost} steps lost"
    return f"recovered in {recovery.recovery_s:.1f} s{lost}"


# ---------------------------------------------------------------- node lanes

def lane_names(history: Sequence[dict]) -> list[str]:
    """node0, node1, ... (also those the run's spec names but that left no record), then etcd."""
    names = {r["node"] for r in history if r.get("type") in ("trainer", "worker", "agent", "docker")
             and isinstance(r.get("node"), str)}
    for record in history:
        if record.get("type") == "run" and isinstance((record.get("spec") or {}).get("nodes"), int):
            names.update(f"node{i}" for i in range(record["spec"]["nodes"]))
        elif record.get("type") == "fault" and isinstance((record.get("result") or {}).get("node"), str):
            names.add(record["result"]["node"])
    return sorted(names, key=_lane_order)


def _lane_order(name: str):
    match = re.fullmatch(r"(.*?)(\d*)", name)
    return name == ETCD, match.group(1), int(match.group(2) or 0)


def _intervals(opens: Iterable[float], closes: Iterable[float], end: float) -> list[tuple[float, float]]:
    """Periods from an open to the next close (repeated opens and closes are no-ops)."""
    events = sorted([(t, 0) for t in closes] + [(t, 1) for t in opens])  # a close before an open at one time
    found, since = [], None
    for t, is_open in events:
        if is_open and since is None:
            since = t
        elif not is_open and since is not None:
            found.append((since, t))
            since = None
    if since is not None:
        found.append((since, end))
    return found


def _running_stretches(progress: list[dict], breaks: list[float]) -> list[tuple[float, float]]:
    """Periods of steady progress: split where another state began, or where progress stalled
    for much longer than a step takes (the node waits on a peer it cannot reach)."""
    if not progress:
        return []
    step_gaps = [b["t"] - a["t"] for a, b in zip(progress, progress[1:]) if b.get("step") != a.get("step")]
    stall_s = max(2.0, 5 * statistics.median(step_gaps)) if step_gaps else 2.0
    stretches = [[progress[0]["t"], progress[0]["t"]]]
    for t in (r["t"] for r in progress[1:]):
        last = stretches[-1][1]
        broken = bisect.bisect_right(breaks, last) < bisect.bisect_right(breaks, t)  # a break in (last, t]
        if t - last > stall_s or broken:
            stretches.append([t, t])
        else:
            stretches[-1][1] = t
    return [(start, stop) for start, stop in stretches]


def _partitions(history: Sequence[dict], names: list[str], end: float) -> dict[str, list[tuple[float, float]]]:
    """Node -> periods it was on a side of a partition (the fault's target names the nodes)."""
    cut: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for fault in _records(history, "fault", phase="ok", fault="partition"):
        healed = _repair_time(fault, history)
        text = " ".join(str(part) for part in (fault.get("target"), (fault.get("result") or {}).get("partition")))
        for name in names:
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                cut[name].append((fault["t"], end if healed is None else healed))
    return cut


def node_lanes(history: Sequence[dict], end: float,
               model: RunModel | None = None) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Per node, when it was running, restarting, paused, dead, a zombie or cut off: from Docker,
    agent and worker events. A node trains while its workers show steps or collective calls; for a
    script nothing shows (no instrumentation, no progress lines), from its agent's "Starting worker
    group" until the group fails or the node goes down."""
    model = model or RunModel([r for r in history if _is_time(r.get("t"))])
    names = lane_names(history)
    partitioned = _partitions(history, names, end)
    records_of: dict[str, list[dict]] = {name: [] for name in names}  # one pass: histories get long
    for record in history:
        records_of.get(record.get("node"), []).append(record)
    beats_of: dict[str, list[dict]] = {name: [] for name in names}
    for record in model.beats:
        beats_of.get(record.get("node"), []).append(record)
    zombies_of: dict[str, list[dict]] = {name: [] for name in names}
    for record in model.zombies:
        zombies_of.get(record.get("node"), []).append(record)
    lanes = {}
    for name in names:
        own = records_of[name]
        docker = {action: [r["t"] for r in _records(own, "docker", action=action)]
                  for action in (*DOCKER_DOWN, "start", "pause", "unpause")}
        down = sorted(t for action in DOCKER_DOWN for t in docker[action])
        agent = _records(own, "agent")
        group_started = [r["t"] for r in agent if r.get("event") == "group_started"]
        # A (re)started container is joining until it trains again.
        restart_begins = docker["start"] + [r["t"] for r in agent if r.get("event") in AGENT_RESTARTS]
        if name == ETCD:  # no trainers there: it is "running" while its container is up
            running, restarting = _intervals(docker["start"], down, end), []
        elif model.beats:
            beats = beats_of[name]
            running = _running_stretches(beats, sorted(restart_begins + down + docker["pause"]))
            restarting = _intervals(restart_begins, [r["t"] for r in beats] + down, end)
        else:
            running = _intervals(group_started, restart_begins + down, end)
            restarting = _intervals(restart_begins, group_started + down, end)
        lanes[name] = {
            "running": running,
            "restarting": restarting,
            "paused": _intervals(docker["pause"], docker["unpause"] + down, end),
            "dead": _intervals(down, docker["start"], end),
            "zombie": _running_stretches(zombies_of[name], []),
            "partitioned": partitioned[name],
        }
    return lanes


# ---------------------------------------------------------------- the picture

def draw_timeline(timeline: Timeline, path: Path, *, title: str, verdict: Verdict, profile: str) -> None:
    # Imported here: the summary and JSON need no matplotlib; Figure + Agg canvas, no pyplot, no display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(timeline.lanes)
    lanes_height = 0.36 * max(len(names), 1) + 0.4
    figure = Figure(figsize=(13, 5.6 + lanes_height), dpi=110, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    step_ax, world_ax, lanes_ax = figure.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [3.0, 1.1, lanes_height]})
    x_max = max(timeline.end, 1.0) * 1.01

    _draw_steps(step_ax, timeline)
    _draw_world(world_ax, timeline)
    _draw_lanes(lanes_ax, timeline, names)
    for ax in (step_ax, world_ax, lanes_ax):
        ax.set_xlim(0, x_max)
        _shade_faults(ax, timeline.faults, x_max)
        for t, _ in timeline.rounds:
            ax.axvline(t, color="#555555", linestyle=":", linewidth=1.0, zorder=1)
    lanes_ax.set_xlabel("seconds since run start")

    verdict_word = "PASS" if verdict.valid else "FAIL"
    figure.suptitle(f"{title} — {verdict_word}", fontsize=15, fontweight="bold",
                    color="#2e7d32" if verdict.valid else "#c62828")
    step_ax.set_title(f"expected: {EXPECTED_WORDS.get(verdict.expected, verdict.expected)}   ·   "
                      f"profile: {profile}   ·   {len(timeline.faults)} fault(s)   ·   "
                      f"{verdict.rounds} rendezvous round(s)   ·   {timeline.end:.1f} s",
                      loc="left", fontsize=9, color="#444444")
    _figure_legend(figure)
    canvas.draw()  # lay out first: labels are stacked by their rendered size
    _stacked_labels(step_ax, [(f.start, "\n".join(filter(None, (f.label, f.outcome)))) for f in timeline.faults],
                    canvas.get_renderer(), FAULT_LABEL_STYLE)
    _stacked_labels(world_ax, [(t, f" {label}") for t, label in timeline.rounds if label],
                    canvas.get_renderer(), ROUND_LABEL_STYLE)
    figure.savefig(path, dpi=110)


def _draw_steps(ax, timeline: Timeline) -> None:
    relative = timeline.step_source == "optimizer-relative"
    ax.set_ylabel("optimizer steps\n(per worker process)" if relative else "global step")
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
    if not timeline.steps:
        ax.text(0.5, 0.5, "no step recorded: pass --progress-regex to read the script's own step lines",
                transform=ax.transAxes, ha="center", va="center", color="#888888")
        return
    times, steps = zip(*timeline.steps)
    # steps-post: the step holds until the next report, so a fall back to a checkpoint shows as a drop.
    step_line, = ax.plot(times, steps, drawstyle="steps-post", color="#1f5fa8", linewidth=1.8,
                         label="steps of the newest worker process" if relative
                         else "global step (highest across ranks)", zorder=3)
    ax.set_ylim(0, max(steps) * 1.35 + 1)  # headroom for the fault labels
    rate_ax = ax.twinx()
    rate_times, rates = zip(*timeline.throughput)
    rate_line, = rate_ax.plot(rate_times, rates, color="#e8710a", linewidth=1.0, alpha=0.85,
                              label=f"throughput (steps/s, {timeline.throughput_window_s:.0f} s rolling)")
    rate_ax.set_ylim(0, max(max(rates), 1e-9) * 1.6)  # keep it below the labels at the top
    rate_ax.set_ylabel("steps/s", color="#e8710a")
    rate_ax.tick_params(axis="y", colors="#e8710a")
    ax.legend(handles=[step_line, rate_line], loc="lower right", fontsize=8, framealpha=0.9)


def _draw_world(ax, timeline: Timeline) -> None:
    ax.set_ylabel("world size\n(trainers)")
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
    if not timeline.world:
        ax.set_yticks([])
        return
    times, sizes = zip(*timeline.world)
    ax.plot([*times, timeline.end], [*sizes, sizes[-1]], drawstyle="steps-post", color="#333333", linewidth=1.6)
    ax.set_ylim(0, max(sizes) * 1.45)
    ax.set_yticks(sorted(set(sizes)))


def _draw_lanes(ax, timeline: Timeline, names: list[str]) -> None:
    ax.set_ylim(len(names) - 0.5 if names else 0.5, -0.5)  # node0 on top
    ax.set_yticks(range(len(names)), names)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if not names:
        ax.text(0.5, 0.5, "no node records", transform=ax.transAxes, ha="center", va="center", color="#888888")
        return
    for row, name in enumerate(names):
        ax.broken_barh([(0, max(timeline.end, 1.0) * 1.01)], (row - 0.32, 0.64), facecolors=NO_PROGRESS_COLOR)
        for state in LANE_STATES:
            periods = [(start, stop - start) for start, stop in timeline.lanes[name][state]]
            if state == "partitioned":  # hatched over the rest: a cut-off node may still be running
                ax.broken_barh(periods, (row - 0.38, 0.76), facecolors="none", edgecolors=LANE_COLORS[state],
                               hatch="////", linewidth=1.2, zorder=3)
            else:
                ax.broken_barh(periods, (row - 0.32, 0.64), facecolors=LANE_COLORS[state], zorder=2)


def _shade_faults(ax, faults: Sequence[FaultSpan], x_max: float) -> None:
    min_width = x_max / 300  # an instant fault still shows
    for span in faults:
        ax.axvspan(span.start, max(span.end, span.start + min_width), color=FAULT_COLOR, alpha=0.10,
                   linewidth=0, zorder=0)
        ax.axvline(span.start, color=FAULT_COLOR, linewidth=1.0, alpha=0.7, zorder=1)


FAULT_LABEL_STYLE = {"fontsize": 8, "color": "#8b1a1a", "bbox": {
    "boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": FAULT_COLOR, "alpha": 0.9, "linewidth": 0.6}}
ROUND_LABEL_STYLE = {"fontsize": 7, "color": "#555555"}


def _stacked_labels(ax, labels: Sequence[tuple[float, str]], renderer, style: dict) -> None:
    """Texts hung from the top of the panel at their x, each in the first row where it overlaps
    no other label (placed by rendered size, so the figure must be laid out already)."""
    from matplotlib.transforms import blended_transform_factory

    transform = blended_transform_factory(ax.transData, ax.transAxes)
    panel = ax.get_window_extent(renderer)
    rows: list[tuple[float, float]] = []  # (top in axes fraction, display x where its last label ends)
    for x, label in sorted(labels):
        text = ax.text(x, 0.97, label, transform=transform, va="top", ha="left", zorder=5, **style)
        box = text.get_window_extent(renderer)
        if box.x1 > panel.x1:  # too close to the right edge: hang it to the left of its line
            text.set_horizontalalignment("right")
            box = text.get_window_extent(renderer)
        row = next((i for i, (_, row_end) in enumerate(rows) if box.x0 > row_end + 6), len(rows))
        if row == len(rows):
            top = rows[-1][0] - (box.height + 6) / panel.height if rows else 0.97
            rows.append((top, 0.0))
        rows[row] = (rows[row][0], box.x1)
        text.set_y(rows[row][0])


def _figure_legend(figure) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=LANE_COLORS[s], label=LANE_LABELS[s]) for s in LANE_STATES if s != "partitioned"]
    handles += [Patch(facecolor="none", edgecolor=LANE_COLORS["partitioned"], hatch="////",
                      label=LANE_LABELS["partitioned"]),
                Patch(facecolor=NO_PROGRESS_COLOR, label="no progress / unknown"),
                Patch(facecolor=FAULT_COLOR, alpha=0.25, label="fault (invoke → heal, recovery or job end)"),
                Line2D([], [], color="#555555", linestyle=":", label="rendezvous round")]
    figure.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)


# ---------------------------------------------------------------- summary, JSON, HTML

def report_data(verdict: Verdict, history: Sequence[dict], *, title: str, profile: str | None,
                files: ReportFiles | None = None, diagnoses: Sequence[Diagnosis] = ()) -> dict:
    """The figures of the report as plain data (what report.json holds)."""
    origin = run_origin(history)
    last = run_last_time(history)
    model = RunModel([r for r in history if _is_time(r.get("t"))])
    return {
        "title": title,
        "verdict": "PASS" if verdict.valid else "FAIL",
        "valid": verdict.valid,
        "expected": verdict.expected,
        "profile": profile_label(profile, history),
        "run": {"start": origin, "duration_s": None if origin is None else round(last - origin, 3)},
        "checks": [dataclasses.asdict(result) for result in verdict.results],
        "recoveries": [{**dataclasses.asdict(r), "since_start_s": _since(r.t_fault, origin, verdict)}
                       for r in verdict.recoveries],
        "job_end": _job_end_after_faults(verdict, history, origin),
        "restarts_per_node": dict(verdict.restarts_per_node),
        "restarts_note": RESTARTS_NOTE,
        "rounds": verdict.rounds,
        "training": {"step_source": model.step_source, "seen_through": STEP_SOURCE_WORDS[model.step_source],
                     "highest_step": model.highest_step if model.steps_known else None,
                     "step_efficiency": _step_efficiency(verdict), "zombie_records": len(model.zombies),
                     "not_measured": [r.name for r in verdict.results if not r.measured]},
        "diagnoses": [dataclasses.asdict(d) for d in diagnoses],
        "files": {} if files is None else {k: str(v) for k, v in dataclasses.asdict(files).items()},
    }


def _step_efficiency(verdict: Verdict) -> float | None:
    progress = verdict.result("progress")
    return progress.metrics.get("step_efficiency") if progress is not None else None


def _job_end_after_faults(verdict: Verdict, history: Sequence[dict], origin: float | None) -> list[dict]:
    """For a run meant to fail: each fault, and how long after its invoke the agents it ended
    exited (None: none followed it). Recovery figures say nothing there; this says how it ended."""
    fails_cleanly = verdict.result("fails_cleanly")
    if fails_cleanly is None:
        return []
    ended = fails_cleanly.metrics.get("ended", {})
    rows = []
    for fault in _applied_faults(history):
        delays = [e["since_invoke_s"] for e in ended.values() if e["after_op"] == fault.get("op")]
        t = _invoke_time(fault, history)
        rows.append({"op": fault.get("op"), "fault": fault.get("fault"), "target": fault.get("target"),
                     "since_start_s": None if origin is None else round(t - origin, 3),
                     "agents_ended": len(delays), "ended_after_s": max(delays) if delays else None})
    return rows


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
    """ok, FAIL, or n/a: not measurable on this run (the reason says how to enable it)."""
    if not result.measured:
        return "n/a"
    return "ok" if result.valid else "FAIL"


def _fault_row(recovery: dict, never: str = "never") -> list[str]:
    """One row of the faults table, from a recovery as report_data gives it."""
    steps_lost = recovery["steps_lost"]
    return [f"+{recovery['since_start_s']:.1f} s", recovery["fault"], recovery["target"] or "-",
            _seconds(recovery["recovery_s"], never), "-" if steps_lost is None else str(steps_lost),
            _world_change(recovery["world_before"], recovery["world_after"]),
            _rate_change(recovery.get("throughput_before"), recovery.get("throughput_after"))]


def _training_words(training: dict) -> str:
    words = [training["seen_through"]]
    if training["highest_step"] is not None:
        words.append(f"highest step {training['highest_step']}")
    if training["step_efficiency"] is not None:
        words.append(f"step efficiency {training['step_efficiency']:.0%} (steps kept / steps run)")
    if training["zombie_records"]:
        words.append(f"{training['zombie_records']} records from zombie workers of an old round, left out")
    if training["not_measured"]:
        words.append(f"not measurable: {', '.join(training['not_measured'])} (see the checks)")
    return "; ".join(words)


def _rate_change(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "-"
    return f"{'?' if before is None else f'{before:.2f}'} → {'?' if after is None else f'{after:.2f}'}"


FAULT_HEADERS = ["time", "fault", "target", "recovery", "steps lost", "world", "steps/s before → after"]
JOB_END_HEADERS = ["time", "fault", "target", "agents ended after it"]


def _job_end_row(row: dict) -> list[str]:
    when = "-" if row["since_start_s"] is None else f"+{row['since_start_s']:.1f} s"
    ended = "-" if row["ended_after_s"] is None else \
        f"{row['agents_ended']} within {row['ended_after_s']:.1f} s"
    return [when, row["fault"], row["target"] or "-", ended]


def fault_table(data: dict) -> tuple[list[str], list[list[str]]]:
    """The faults table: recovery figures, or for a run meant to fail, how soon it ended."""
    if data["job_end"]:
        return JOB_END_HEADERS, [_job_end_row(row) for row in data["job_end"]]
    unmeasured = "recovery" in data.get("training", {}).get("not_measured", ())
    return FAULT_HEADERS, [_fault_row(r, never="n/a" if unmeasured else "never") for r in data["recoveries"]]


def _table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    return [indent + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in [headers, *rows]]


def format_summary(verdict: Verdict, history: Sequence[dict], *, title: str, profile: str | None,
                   files: ReportFiles | None = None, diagnoses: Sequence[Diagnosis] = ()) -> str:
    """The report for a terminal: verdict, checks, diagnoses, faults, restarts, rounds, profile, files."""
    history = list(history)
    data = report_data(verdict, history, title=title, profile=profile, files=files, diagnoses=diagnoses)
    expected = EXPECTED_WORDS.get(verdict.expected, verdict.expected)
    lines = [f"{title}: {data['verdict']} (expected: {expected})", ""]
    lines.append("Checks:")
    lines += _table(["check", "result", "first reason"], [_check_row(r) for r in verdict.results]) \
        if verdict.results else ["  (none)"]
    if diagnoses:
        lines += ["", "Why (known causes, with the evidence and the fix):", format_diagnoses(diagnoses)]
    lines.append("")
    lines.append("Faults:")
    headers, rows = fault_table(data)
    lines += _table(headers, rows) if rows else ["  (none)"]
    lines.append("")
    restarts = ", ".join(f"{node} {count}" for node, count in sorted(verdict.restarts_per_node.items(),
                                                                       key=lambda item: _lane_order(item[0])))
    lines.append(f"Restarts per node ({RESTARTS_NOTE}): {restarts or 'none'}")
    lines.append(f"Rendezvous rounds: {verdict.rounds}")
    lines.append(f"Training seen through: {_training_words(data['training'])}")
    lines.append(f"Profile: {data['profile']}")
    if files is not None:
        lines.append("Files:")
        lines += [f"  {path}" for path in (files.json, files.png, files.html)]
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


def _html_check_row(check: dict) -> list[str]:
    reasons = "<br>".join(html.escape(str(reason)) for reason in check["reasons"])
    metrics = html.escape(json.dumps(check["metrics"], default=_json_default)) if check["metrics"] else ""
    word = "n/a" if not check.get("measured", True) else "ok" if check["valid"] else "FAIL"
    return [_cell(check["name"]), _cell(word, {"ok": "ok", "FAIL": "fail"}.get(word, "")),
            f"<td>{reasons}</td>", f"<td><code>{metrics}</code></td>"]


def _html_diagnoses(diagnoses: list[dict]) -> list[str]:
    if not diagnoses:
        return []
    rows = [[_cell(d["title"]), _cell(d["cause"]),
             "<td>" + "<br>".join(f"<code>{html.escape(e)}</code>" for e in d["evidence"]) + "</td>", _cell(d["fix"])]
            for d in diagnoses]
    return ["<h2>Why: known causes</h2>", _html_table(["diagnosis", "cause", "evidence", "fix"], rows)]


def render_html(data: dict, png: bytes) -> str:
    """A self-contained page (no network): the timeline inline as base64, the figures as tables."""
    verdict_class = "pass" if data["valid"] else "fail"
    facts = [[_cell("verdict"), _cell(data["verdict"], verdict_class)],
             [_cell("expected"), _cell(EXPECTED_WORDS.get(data["expected"], data["expected"]))],
             [_cell("profile"), _cell(data["profile"])],
             [_cell("rendezvous rounds"), _cell(data["rounds"])],
             [_cell("training seen through"), _cell(_training_words(data["training"]))]]
    if data["run"]["duration_s"] is not None:
        facts.append([_cell("duration"), _cell(_seconds(data["run"]["duration_s"]))])
    checks = [_html_check_row(check) for check in data["checks"]]
    fault_headers, fault_rows = fault_table(data)
    faults = [[_cell(cell) for cell in row] for row in fault_rows]
    restarts = [[_cell(node), _cell(count)] for node, count in
                sorted(data["restarts_per_node"].items(), key=lambda item: _lane_order(item[0]))]
    image = base64.b64encode(png).decode("ascii")
    title = html.escape(data["title"])
    return "\n".join([
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>{title}: {data["verdict"]}</title>',
        f"<style>{HTML_STYLE}</style></head><body>",
        f'<h1>{title}: <span class="{verdict_class}">{data["verdict"]}</span></h1>',
        _html_table([], facts),
        f'<img alt="timeline of the run" src="data:image/png;base64,{image}">',
        "<h2>Checks</h2>", _html_table(["check", "result", "reasons", "metrics"], checks) if checks else "<p>none</p>",
        *_html_diagnoses(data["diagnoses"]),
        "<h2>Faults</h2>", _html_table(fault_headers, faults) if faults else "<p>none</p>",
        f"<h2>Restarts per node</h2><p>{html.escape(RESTARTS_NOTE)}.</p>",
        _html_table(["node", "restarts"], restarts) if restarts else "<p>none</p>",
        "</body></html>", ""])
