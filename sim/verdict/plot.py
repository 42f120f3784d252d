"""The report's picture: a run's timeline (sim/verdict/timeline.py) drawn off-screen with matplotlib (Agg).

Three panels on one time axis: the step and throughput, the world size, and one lane per node;
faults are shaded and labelled, rendezvous rounds marked.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from sim.verdict import EXPECTED_WORDS, Verdict
from sim.verdict.timeline import LANE_STATES, FaultSpan, Timeline

LANE_COLORS = {
    "running": "#54a24b",
    "restarting": "#f2a93b",
    "paused": "#4c78a8",
    "dead": "#3b3b3b",
    "zombie": "#e45756",
    "partitioned": "#9d55b5",
}
LANE_LABELS = {
    "running": "running (training seen; etcd: up)",
    "restarting": "restarting / joining",
    "paused": "paused",
    "dead": "dead (container down)",
    "zombie": "zombie (an old round's worker, left behind)",
    "partitioned": "partitioned (cut off)",
}
FAIL_COLOR = "#c62828"
# The title's word: PASS green, n/a grey, anything else (FAIL, MISS, CANNOT TELL) red.
WORD_COLORS = {"PASS": "#2e7d32", "n/a": "#666666"}
ASIDE_WIDTH = 70  # characters a line of the aside (right of the run's figures, above the steps) holds
NO_PROGRESS_COLOR = "#ececec"
FAULT_COLOR = "#d62728"


def draw_timeline(
    timeline: Timeline,
    path: Path,
    *,
    title: str,
    verdict: Verdict,
    profile: str,
    window: tuple[float, float] | None = None,
    devices: str | None = None,
    outcome: str | None = None,
    aside: str | None = None,
) -> None:
    """`window`: draw only these seconds since the run's start (`sim vet`'s picture of one fault). `devices`: a
    line under the title on what ran the devices ("devices emulated on CPU ..."), if said. `outcome`: the word
    the title gives when it is not the run's verdict (`sim vet`: the fault's own, PASS FAIL MISS n/a), with
    `aside`, a line under it (that the run it shared ended otherwise)."""
    # Imported here: the summary and JSON need no matplotlib; Figure + Agg canvas, no pyplot, no display.
    from matplotlib import rc_context

    # Every text here is the history's (node names, fault labels, a side-channel line's fields): shown as
    # written, never parsed as mathtext (`$...$`), which fails on a name like `n$^{$`.
    with rc_context({"text.parse_math": False}):
        _draw(
            timeline,
            path,
            title=title,
            verdict=verdict,
            profile=profile,
            window=window,
            devices=devices,
            outcome=outcome,
            aside=aside,
        )


def _draw(
    timeline: Timeline,
    path: Path,
    *,
    title: str,
    verdict: Verdict,
    profile: str,
    window: tuple[float, float] | None,
    devices: str | None,
    outcome: str | None,
    aside: str | None,
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(timeline.lanes)
    lanes_height = 0.36 * max(len(names), 1) + 0.4
    figure = Figure(figsize=(13, 5.6 + lanes_height), dpi=110, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    step_ax, world_ax, lanes_ax = figure.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [3.0, 1.1, lanes_height]}
    )
    x_max = max(timeline.end, 1.0) * 1.01

    _draw_steps(step_ax, timeline)
    _draw_world(world_ax, timeline)
    _draw_lanes(lanes_ax, timeline, names)
    for ax in (step_ax, world_ax, lanes_ax):
        ax.set_xlim(*(window or (0, x_max)))
        _shade_faults(ax, timeline.faults, x_max)
        for t, _ in timeline.rounds:
            ax.axvline(t, color="#555555", linestyle=":", linewidth=1.0, zorder=1)
    lanes_ax.set_xlabel("seconds since run start")

    word = outcome or verdict.word
    figure.suptitle(f"{title} — {word}", fontsize=15, fontweight="bold", color=WORD_COLORS.get(word, FAIL_COLOR))
    step_ax.set_title(
        f"expected: {EXPECTED_WORDS.get(verdict.expected, verdict.expected)}   ·   "
        f"profile: {profile}   ·   {len(timeline.faults)} fault(s)   ·   "
        f"{verdict.rounds} rendezvous round(s)   ·   {timeline.end:.1f} s" + (f"\n{devices}" if devices else ""),
        loc="left",
        fontsize=9,
        color="#444444",
    )
    if aside:  # the run ended otherwise than the picture's title says: said beside the run's own figures
        step_ax.set_title(
            "\n".join(textwrap.wrap(aside, ASIDE_WIDTH)),
            loc="right",
            fontsize=10,
            fontweight="bold",
            color="#333333",
        )
    _figure_legend(figure)
    canvas.draw()  # lay out first: labels are stacked by their rendered size
    # Labelled where they show: a crop (`window`) leaves out what lies outside it, whose labels would hang in the
    # margins, cut off; a fault that began before the crop and lasts into it is labelled at the crop's left edge.
    left, right = window or (0.0, x_max)
    faults = [f for f in timeline.faults if f.start <= right and max(f.end, f.start) >= left]
    _stacked_labels(
        step_ax,
        [(max(f.start, left), "\n".join(filter(None, (f.label, f.outcome)))) for f in faults],
        canvas.get_renderer(),
        FAULT_LABEL_STYLE,
    )
    rounds = [(t, f" {label}") for t, label in timeline.rounds if label and left <= t <= right]
    _stacked_labels(world_ax, rounds, canvas.get_renderer(), ROUND_LABEL_STYLE)
    figure.savefig(path, dpi=110)


def _draw_steps(ax, timeline: Timeline) -> None:
    relative = timeline.step_source == "optimizer-relative"
    ax.set_ylabel("optimizer steps\n(per worker process)" if relative else "global step")
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
    if not timeline.steps:
        ax.text(
            0.5,
            0.5,
            "no step recorded: pass --progress-regex to read the script's own step lines",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="#888888",
        )
        return
    times, steps = zip(*timeline.steps, strict=True)
    # steps-post: the step holds until the next report, so a fall back to a checkpoint shows as a drop.
    (step_line,) = ax.plot(
        times,
        steps,
        drawstyle="steps-post",
        color="#1f5fa8",
        linewidth=1.8,
        label="steps of the newest worker process" if relative else "global step (highest across ranks)",
        zorder=3,
    )
    ax.set_ylim(0, max(steps) * 1.35 + 1)  # headroom for the fault labels
    rate_ax = ax.twinx()
    rate_times, rates = zip(*timeline.throughput, strict=True)
    (rate_line,) = rate_ax.plot(
        rate_times,
        rates,
        color="#e8710a",
        linewidth=1.0,
        alpha=0.85,
        label=f"throughput (steps/s, {timeline.throughput_window_s:.0f} s rolling)",
    )
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
    times, sizes = zip(*timeline.world, strict=True)
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
                ax.broken_barh(
                    periods,
                    (row - 0.38, 0.76),
                    facecolors="none",
                    edgecolors=LANE_COLORS[state],
                    hatch="////",
                    linewidth=1.2,
                    zorder=3,
                )
            else:
                ax.broken_barh(periods, (row - 0.32, 0.64), facecolors=LANE_COLORS[state], zorder=2)


def _shade_faults(ax, faults: Sequence[FaultSpan], x_max: float) -> None:
    min_width = x_max / 300  # an instant fault still shows
    for span in faults:
        ax.axvspan(
            span.start, max(span.end, span.start + min_width), color=FAULT_COLOR, alpha=0.10, linewidth=0, zorder=0
        )
        ax.axvline(span.start, color=FAULT_COLOR, linewidth=1.0, alpha=0.7, zorder=1)


FAULT_LABEL_STYLE = {
    "fontsize": 8,
    "color": "#8b1a1a",
    "bbox": {
        "boxstyle": "round,pad=0.3",
        "facecolor": "white",
        "edgecolor": FAULT_COLOR,
        "alpha": 0.9,
        "linewidth": 0.6,
    },
}
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
        # Placed on the finished layout: the savefig's layout pass must not make room for them (many labels
        # crowded at one x, as in a history with one node's clock an hour off, stack below the panel and
        # would squeeze the axes to nothing).
        text.set_in_layout(False)
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
    handles += [
        Patch(facecolor="none", edgecolor=LANE_COLORS["partitioned"], hatch="////", label=LANE_LABELS["partitioned"]),
        Patch(facecolor=NO_PROGRESS_COLOR, label="no progress / unknown"),
        Patch(facecolor=FAULT_COLOR, alpha=0.25, label="fault (invoke → heal, recovery or job end)"),
        Line2D([], [], color="#555555", linestyle=":", label="rendezvous round"),
    ]
    figure.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
