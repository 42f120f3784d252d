"""`sim forecast`: what failures will cost this job at a real scale, from a vet's measurements.

A pure model: measurements (Measurements, read from a vet's vet.json and its runs' histories by
`measure`) and named failure rates (FailureRates: Llama 3's by default) in, a table (Forecast) out.
Nothing here runs Docker; `measure` only reads files the vet wrote.

The model, per scale (N nodes). Each fault kind k strikes every node at its own rate (independent
failures), so the job sees it at N·λ_k. Each costs its measured recovery R_k (fault to first step)
and slow start S_k (the steps its first seconds after fell short of the speed before it) and, when it
restarts the workers, the work since the last checkpoint: on average half a
checkpoint cycle, (τ + δ)/2, with τ the training time between saves and δ the time a save blocks
training. Of the time left, δ/(τ + δ) goes to saves. So, as shares of wall time:

    restarts   = Σ N·λ_k·(R_k + S_k)
    re-done    = Σ N·λ_k·(τ + δ)/2        (kinds that restart the workers)
    checkpoint = (1 − restarts − re-done)·δ/(τ + δ)
    goodput    = (1 − restarts − re-done)·τ/(τ + δ)

Young's interval τ* = √(2·δ·M), M the job's mean time between restarting failures, maximises it
(to first order). Every figure names its source: a measurement (which run, which phase) or an
assumption (Assumptions lists them all).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import re
import statistics
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.core.errors import UsageError
from sim.core.faultkinds import PROVOCATIONS, UNKNOWN, kind_of
from sim.core.history import FILE_NAME, History, RunRecord, WorkerRecord
from sim.verdict.recovery import THROUGHPUT_WINDOW_S, recoveries
from sim.verdict.runmodel import RunModel

HOURS_PER_DAY = 24.0
DEFAULT_SCALES = (64, 512, 2048)
DEFAULT_GPUS_PER_NODE = 8

# ---------------------------------------------------------------- failure rates


@dataclasses.dataclass(frozen=True)
class Category:
    """One row of a published breakdown: its name, its count, and the fault kind of ours it maps to."""

    name: str
    count: int
    kind: str
    why: str


# Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4, Table 5: the 419 unexpected interruptions of a
# 54-day pre-training snapshot on 16,384 H100 GPUs (2,048 hosts of 8). The counts add up to 419 (the table's
# "Faulty GPU" percentage, 30.1 %, is not 148/419 = 35.3 %: the counts are used). Mapped to the vet's kinds:
# a broken GPU or host takes its node out of the job (its workers cannot start there again until it is
# replaced): node loss; a software failure crashes the workers and the node stays: worker crash; a switch,
# cable or NIC cuts the node off: a partition; NCCL's watchdog firing is a hung collective.
LLAMA3_SOURCE = "Meta, The Llama 3 Herd of Models (2024), sec. 3.3.4, Table 5: 419 unexpected interruptions"
LLAMA3_DAYS = 54
LLAMA3_NODES = 2048
_NODE = "the node leaves the job until it is replaced"
LLAMA3 = (
    Category("Faulty GPU", 148, "kill-node", _NODE),
    Category("GPU HBM3 memory", 72, "kill-node", _NODE),
    Category("Software bug", 54, "kill-worker", "the workers crash, the node stays"),
    Category("Network switch/cable", 35, "partition", "the node is cut off"),
    Category("Host maintenance (unplanned)", 32, "kill-node", _NODE),
    Category("GPU SRAM memory", 19, "kill-node", _NODE),
    Category("GPU system processor", 17, "kill-node", _NODE),
    Category("NIC", 7, "partition", "the node is cut off"),
    Category("NCCL watchdog timeouts", 7, "hang-collectives", "a collective hangs until the watchdog"),
    Category("Silent data corruption", 6, "kill-node", _NODE),
    Category("GPU thermal interface + sensor", 6, "kill-node", _NODE),
    Category("SSD", 3, "kill-node", _NODE),
    Category("Power supply", 3, "kill-node", _NODE),
    Category("Server chassis", 2, "kill-node", _NODE),
    Category("IO expansion board", 2, "kill-node", _NODE),
    Category("Dependency", 2, "kill-worker", "the workers crash, the node stays"),
    Category("CPU", 2, "kill-node", _NODE),
    Category("System memory", 2, "kill-node", _NODE),
)
# A kind the rates name that the vet did not measure: the measured kind that stands in for it, in order.
STAND_INS = {
    "kill-node": ("stop-node", "restart-node", "kill-agent", "kill-worker"),
    "partition": ("kill-node", "stop-node", "kill-worker"),
    "hang-collectives": ("kill-worker",),
    "kill-worker": ("kill-agent", "kill-node"),
}
KIND_WORDS = {
    "kill-worker": "worker crash",
    "kill-node": "node loss",
    "partition": "network cut",
    "hang-collectives": "hung collective",
}


@dataclasses.dataclass(frozen=True)
class FailureRates:
    """Per node, the failures per hour of each kind of ours, and where the figures come from."""

    per_node_hour: Mapping[str, float]
    source: str
    mapping: tuple[str, ...] = ()  # how the source's categories became our kinds, a line each

    def __post_init__(self) -> None:
        if not self.per_node_hour or any(not (math.isfinite(r) and r >= 0) for r in self.per_node_hour.values()):
            raise UsageError("failure rates: each must be a number of failures per node-hour, zero or more")
        if sum(self.per_node_hour.values()) <= 0:
            raise UsageError("failure rates: all zero; give at least one kind a rate")

    @property
    def node_mtbf_h(self) -> float:
        return 1.0 / sum(self.per_node_hour.values())


def llama3_rates(categories: Sequence[Category] = LLAMA3) -> FailureRates:
    node_hours = LLAMA3_DAYS * HOURS_PER_DAY * LLAMA3_NODES
    rates: dict[str, float] = {}
    for c in categories:
        rates[c.kind] = rates.get(c.kind, 0.0) + c.count / node_hours
    total = sum(c.count for c in categories)
    mapping = []
    for kind in rates:
        rows = [c for c in categories if c.kind == kind]
        count = sum(c.count for c in rows)
        names = ", ".join(f"{c.name} {c.count}" for c in rows)
        mapping.append(f"{kind} ({KIND_WORDS.get(kind, kind)}, {rows[0].why}): {count}/{total}: {names}")
    source = f"{LLAMA3_SOURCE} in {LLAMA3_DAYS} days on {LLAMA3_NODES} nodes of 8 GPUs"
    return FailureRates(rates, source, tuple(mapping))


def scaled_rates(base: FailureRates, node_mtbf_h: float, given: str) -> FailureRates:
    """`base`'s mix of kinds at a node MTBF of `node_mtbf_h` hours (`--mtbf-node 200d`)."""
    factor = (1.0 / node_mtbf_h) / sum(base.per_node_hour.values())
    rates = {k: v * factor for k, v in base.per_node_hour.items()}
    return FailureRates(rates, f"--mtbf-node {given} (a node fails once in {given}), in Llama 3's mix", base.mapping)


_MTBF = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(y|d|h|m|s)\s*$")
_MTBF_HOURS = {"y": 365 * 24.0, "d": 24.0, "h": 1.0, "m": 1 / 60, "s": 1 / 3600}


def parse_mtbf(flag: str, text: object) -> float:
    """Hours in "200d", "4800h", "1.5y" (a mean time between failures; "m" is minutes)."""
    found = _MTBF.match(str(text))
    hours = float(found[1]) * _MTBF_HOURS[found[2]] if found else 0.0
    if not found or hours <= 0:
        raise UsageError(f"{flag} {text!r}: not a time between failures; use e.g. 200d, 4800h or 1.5y")
    return hours


def table_rates(table: Mapping[str, Any], where: str) -> FailureRates:
    """Per-kind node MTBFs, as pyproject.toml's [tool.elastic-sim.mtbf] gives them: kill-node = "300d"."""
    if not isinstance(table, Mapping) or not table:
        raise UsageError(f'{where}: give each kind\'s MTBF per node, e.g. kill-node = "300d"')
    rates = {}
    for kind, value in table.items():
        if kind not in STAND_INS and kind not in KIND_WORDS:
            known = ", ".join(KIND_WORDS)
            raise UsageError(f"{where}: {kind}: not a kind the forecast rates; use some of {known}")
        rates[kind] = 1.0 / parse_mtbf(f"{where}: {kind} =", value)
    given = ", ".join(f"{k} {v}" for k, v in table.items())
    return FailureRates(rates, f"{where} (per node: {given})", ())


# ---------------------------------------------------------------- measurements

PHASES = ("detection_s", "rendezvous_s", "worker_start_s", "pg_init_s", "ckpt_load_s", "first_step_s")
# How each phase of a recovery would change at scale: set by torch's settings (kept as the vet ran them) or
# growing with the job (measured at small scale: a lower bound there).
PHASE_NATURE = {
    "detection_s": ("settings", "set by torch's settings (keep-alive, monitor interval, stop timeout)"),
    "rendezvous_s": ("settings", "set by torch's settings (last_call_timeout, join polls); more agents join at scale"),
    "worker_start_s": ("grows", "grows with the job: spawning and importing on every node"),
    "pg_init_s": ("grows", "grows with the world size: every rank connects to the store"),
    "ckpt_load_s": ("grows", "grows with the checkpoint: a bigger model loads longer"),
    "first_step_s": ("grows", "grows with the model: building it and its first step"),
}
SETTING_KEYS = ("last_call_timeout", "join_timeout", "keep_alive_interval", "keep_alive_max_attempt")
# torch's own defaults for them, read from torch 2.13's torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:
# RendezvousTimeout._DEFAULT_TIMEOUTS (join 600 s, last_call 30 s) and create_handler's keep_alive_interval (5 s)
# and keep_alive_max_attempt (3).
TORCH_DEFAULTS = {
    "last_call_timeout": "30",
    "join_timeout": "600",
    "keep_alive_interval": "5",
    "keep_alive_max_attempt": "3",
}


def node_leaves(kind: str) -> bool:
    """A vetted kind (sim vet --faults) whose node leaves the job: the others lose it (its agent's keep-alive
    stops: killed, stopped, frozen, cut off) and it does not rejoin at once (a restart's does). Torch drops it from
    the rendezvous only once it is keep_alive_interval × keep_alive_max_attempt old (detection); the new round then
    has fewer nodes than the job's most, so it waits last_call_timeout before it completes (rendezvous). Its
    provocation's fault kind says (sim.core.faultkinds), not a list of names."""
    provocation = PROVOCATIONS.get(kind)
    traits = kind_of(provocation.fault) if provocation is not None else UNKNOWN
    return traits.loses_node and not traits.rejoins_nodes


@dataclasses.dataclass(frozen=True)
class KindCost:
    """One fault kind as the vet measured it."""

    kind: str
    recovery_s: float
    phases: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    steps_lost: int | None = None
    restarts: bool = True  # it restarts the workers: the work since the last checkpoint is done again
    # The slow start after it: the steps the first THROUGHPUT_WINDOW_S seconds after the recovery fell short of the
    # window before the fault, as seconds of training (a restarted job's first steps are slower: warm-up).
    slow_s: float = 0.0
    # The phases moved from the vet's settings to the forecast's (at_settings), a line each; () where none was.
    modelled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("recovery_s", "slow_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{self.kind}: {name} {value!r}: must be a time of zero or more")

    @property
    def lost_s(self) -> float:
        """The time it costs besides re-done work: its recovery and its slow start."""
        return self.recovery_s + self.slow_s

    @property
    def biggest_phase(self) -> tuple[str, float] | None:
        known = [(p, v) for p, v in self.phases.items() if v is not None and p in PHASE_NATURE]
        return max(known, key=lambda pv: pv[1]) if known else None


@dataclasses.dataclass(frozen=True)
class Measurements:
    """What the vet measured of this job. `save_s`: how long one checkpoint save blocks training (the slowest
    rank's, median over saves; None: no save seen with its duration). `interval_steps`: the steps between
    saves the job keeps (None: no two saves seen)."""

    step_s: float
    kinds: tuple[KindCost, ...]
    save_s: float | None = None
    interval_steps: float | None = None
    nodes: int = 1
    gpus_per_node: int = 1
    saves_seen: int = 0
    saves_timed: int = 0  # the saves δ is the median of (per saved step, the slowest rank's)
    save_how: str = ""  # how those saves were written: the instrumented call and a file, e.g. "os.replace onto /ckpt/x"
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the rdzv_conf the vet ran with
    source: str = ""
    max_nodes: int | None = None  # the job's most nodes (torchrun --nnodes MIN:MAX): a round below it waits last call
    # The settings the kinds' costs are at (at_settings): None, the vet's own (`settings`).
    at: Mapping[str, str] | None = None
    given: frozenset[str] = frozenset()  # the fields the user gave instead of the vet's (save_s, interval_steps)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise UsageError(f"step time {self.step_s!r} s: must be more than zero")
        if not self.kinds:
            raise UsageError(
                "the vet recovered from no fault: nothing to forecast from; vet with kill-worker,kill-node"
            )
        for name in ("save_s", "interval_steps"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} {value!r}: must be zero or more")

    @property
    def interval_s(self) -> float | None:
        """τ: the training time between two saves."""
        return None if self.interval_steps is None else self.interval_steps * self.step_s

    def cost(self, kind: str) -> tuple[KindCost, str | None]:
        """The measured cost of `kind`, or of the kind that stands in for it (and that kind's name)."""
        measured = {k.kind: k for k in self.kinds}
        if kind in measured:
            return measured[kind], None
        for other in (*STAND_INS.get(kind, ()), *measured):
            if other in measured:
                return measured[other], other
        raise AssertionError("kinds is never empty")  # __post_init__


def step_seconds(run: RunModel, before: float = math.inf) -> float | None:
    """Seconds per step while training steadily: the median, over rank 0's consecutive progress records of one
    cohort, of the time per step between them (a save or a stall between two records is an outlier there). Only
    the records before `before` (a soak's re-measure: its segment before the soak's faults)."""
    per_step = []
    previous = None
    for beat in run.progress:
        if beat.t >= before:
            break
        if beat.rank not in (0, None):
            continue
        if previous is not None and run.cohort_index(previous.t) == run.cohort_index(beat.t):
            steps = beat.step - previous.step
            if steps > 0:
                per_step.append((beat.t - previous.t) / steps)
        previous = beat
    return statistics.median(per_step) if per_step else None


def save_costs(run: RunModel, before: float = math.inf) -> tuple[list[float], list[int]]:
    """(the seconds each save blocked training: per saved step, the slowest rank's; the saved steps). A save whose
    record holds no step (an optimizer that keeps none, as SGD) saved the step the job had reached when it began.
    Only the saves recorded before `before`."""
    by_step: dict[int, float] = {}
    steps = set()
    for write in run.checkpoint_writes:
        if write.t >= before:
            continue
        step = write.step
        if step is None and isinstance(write, WorkerRecord) and run.steps_known:
            step = _step_at(run, write.began if write.began is not None else write.t)
        if step is None:
            continue
        steps.add(step)
        if isinstance(write, WorkerRecord) and write.seconds is not None:
            by_step[step] = max(by_step.get(step, 0.0), write.seconds)
    return list(by_step.values()), sorted(steps)


def interval_of(steps: Sequence[int]) -> float | None:
    """The steps between saves the job keeps: the most common gap between the saved steps (sorted, each once). One
    saved step: that step (a job saves at multiples of its interval, `step % k == 0`: a vet that strikes as soon as
    the job is steady may see only the first save, at k). None: no save seen."""
    unique = sorted(set(steps))
    gaps = [b - a for a, b in itertools.pairwise(unique)]
    if gaps:
        return float(statistics.mode(gaps))
    return float(unique[0]) if unique and unique[0] > 0 else None


def run_settings(records: Iterable[Any]) -> dict[str, str]:
    start = next((r for r in records if isinstance(r, RunRecord) and r.event == "start"), None)
    conf = start.spec_fields.pairs["rdzv_conf"] if start else {}
    return {k: str(v) for k, v in conf.items() if k in SETTING_KEYS}


def slow_start(fault: Mapping[str, Any], window_s: float) -> float:
    """Seconds of training a fault's slow start cost: the `window_s` seconds its throughput after the recovery was
    measured over, at that throughput, short of the throughput before it (0 where it was as fast, or either is
    unknown)."""
    before, after = fault.get("throughput_before"), fault.get("throughput_after")
    if not before or after is None or after >= before:
        return 0.0
    return round(window_s * (1 - after / before), 3)


def after_window(run: RunModel, first_step: float) -> float:
    """The seconds of training the throughput after a recovery was measured over (sim.verdict.recovery's throughput:
    rank 0's progress in THROUGHPUT_WINDOW_S from the first step, cohort by cohort): the whole window, or less where
    the next fault or the run's end came first. The vet strikes again as soon as the job is steady, a second or two
    after the first step: a slow start measured there is the first seconds' only, the slowest, not the window's."""
    end = first_step + THROUGHPUT_WINDOW_S
    spans: dict[int, list[float]] = {}
    for beat in run.progress[bisect.bisect_left(run.progress_times, first_step) :]:
        if beat.t >= end:
            break
        if beat.rank in (0, None):
            spans.setdefault(run.cohort_index(beat.t), []).append(beat.t)
    return sum(times[-1] - times[0] for times in spans.values())


def after_windows(vet: Mapping[str, Any], runs: Sequence[RunModel]) -> dict[float, float]:
    """For each of the vet's faults (by its invoke time, vet.json's t_fault) whose recovery its runs show, the seconds
    its throughput after was measured over (after_window). A fault not found there: its vet.json window, from its
    first step (t_fault + recovery_s, to within its own ok) to its end (t_end: the next fault, the run's end)."""
    found = {}
    invoked = {f.get("t_fault") for f in vet.get("faults", ())}
    for run in runs:
        for r in recoveries(run):
            if r.fault.t_invoke in invoked and r.first_progress is not None:
                found[r.fault.t_invoke] = after_window(run, r.first_progress.t)
    for f in vet.get("faults", ()):
        t, end, recovery = f.get("t_fault"), f.get("t_end"), f.get("recovery_s")
        if t not in found and None not in (t, end, recovery):
            found[t] = min(THROUGHPUT_WINDOW_S, max(0.0, end - t - recovery))
    return found


def measurements_from(vet: Mapping[str, Any], runs: Sequence[RunModel], source: str = "") -> Measurements:
    """The measurements in a vet's result (vet.json's dict) and its runs' models: pure."""
    kinds = []
    windows = after_windows(vet, runs)
    for f in vet.get("faults", ()):
        if f.get("outcome") != "survived" or f.get("recovery_s") is None or f.get("solo"):
            continue
        lost = f.get("steps_lost")
        restarted = bool(f.get("restarts")) or bool(lost)
        phases = dict(f.get("phases") or {})
        slow = slow_start(f, windows.get(f.get("t_fault"), THROUGHPUT_WINDOW_S))
        kinds.append(KindCost(f["kind"], float(f["recovery_s"]), phases, lost, restarted, slow))
    step_times = [s for s in (step_seconds(run) for run in runs) if s is not None]
    if not step_times:
        raise UsageError(f"{source or 'the vet'}: its runs show no training steps; vet a job that steps")
    saves: list[float] = []
    intervals = []
    seen = 0
    settings: dict[str, str] = {}
    max_nodes = None
    how = ""
    for run in runs:
        max_nodes = max_nodes or run.spec_fields.max_nodes
        costs, steps = save_costs(run)
        saves += costs
        timed = [w for w in run.checkpoint_writes if isinstance(w, WorkerRecord) and w.seconds is not None]
        if timed and not how:
            op = statistics.mode(w.op for w in timed)
            how = f"{op} onto {next(w.path for w in timed if w.op == op)}"
        seen += len(steps)
        interval = interval_of(steps)
        if interval is not None:
            intervals.append(interval)
        settings = settings or run_settings(run.records)
    return Measurements(
        step_s=statistics.median(step_times),
        kinds=tuple(kinds),
        save_s=statistics.median(saves) if saves else None,
        interval_steps=statistics.median(intervals) if intervals else None,
        nodes=int(vet.get("nodes") or 1),
        gpus_per_node=int(vet.get("nproc_per_node") or 1),
        saves_seen=seen,
        saves_timed=len(saves),
        save_how=how,
        settings=settings,
        source=source,
        max_nodes=max_nodes,
    )


def read_runs(vet: Mapping[str, Any], base: Path) -> list[RunModel]:
    """The models of the vet's shared runs (not the job-ending kinds' own clusters), from their histories."""
    solo = {f.get("run_dir") for f in vet.get("faults", ()) if f.get("solo")}
    runs = []
    for run_dir in vet.get("run_dirs", ()):
        if run_dir in solo:
            continue
        path = Path(run_dir)
        path = path if path.is_absolute() else base / path
        history = path / FILE_NAME
        if history.is_file():
            runs.append(RunModel(History(history).read().records))
    return runs


def measure(vet_path: Path) -> Measurements:
    """The measurements of the vet whose vet.json is `vet_path` (a file or the folder holding it)."""
    import json

    path = vet_path / "vet.json" if vet_path.is_dir() else vet_path
    try:
        vet = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; run `sim vet` (it writes vet.json) or name its folder") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not a vet.json ({error}); give the vet.json `sim vet` wrote") from None
    if not isinstance(vet, dict) or "faults" not in vet:
        raise UsageError(f"{path}: not a vet.json (no faults); give the vet.json `sim vet` wrote")
    return measure_vet(vet, path.parent, str(path))


def with_given(m: Measurements, save_s: float | None = None, interval_steps: float | None = None) -> Measurements:
    """`m` with the save cost and the checkpoint interval the user gave in place of the vet's (named as given)."""
    given = {
        name: value for name, value in (("save_s", save_s), ("interval_steps", interval_steps)) if value is not None
    }
    return dataclasses.replace(m, **given, given=m.given | frozenset(given)) if given else m


def waits(settings: Mapping[str, str]) -> tuple[float, float]:
    """(the last call, the keep-alive expiry: interval × attempts) in seconds under `settings`, torch's defaults
    for what they do not set."""

    def get(key: str) -> float:
        return float(settings.get(key, TORCH_DEFAULTS[key]))

    return get("last_call_timeout"), get("keep_alive_interval") * get("keep_alive_max_attempt")


def settings_words(settings: Mapping[str, str]) -> str:
    """The settings that fix the waits, each with torch's default where it differs."""
    said = []
    for key in ("last_call_timeout", "keep_alive_interval", "keep_alive_max_attempt"):
        value = settings.get(key, TORCH_DEFAULTS[key])
        said.append(
            f"{key}={value}" + (f" (torch's default {TORCH_DEFAULTS[key]})" if value != TORCH_DEFAULTS[key] else "")
        )
    return ", ".join(said)


def at_settings(m: Measurements, target: Mapping[str, str]) -> Measurements:
    """`m` with each kind's setting-driven phases moved from the vet's settings to `target`'s (missing keys: the
    vet's). A round below the job's most nodes (a kind whose node leaves, or a vet below --max-nodes) waits the last
    call: its rendezvous moves by the last calls' difference; a node that leaves is dropped after its keep-alive
    expires: its detection moves by the expiries' difference. Each move is named in the kind's `modelled`."""
    target = {**m.settings, **target}
    (call_v, alive_v), (call_t, alive_t) = waits(m.settings), waits(target)
    kinds = []
    for cost in m.kinds:
        leaves = node_leaves(cost.kind)
        below = leaves or (m.max_nodes is not None and m.nodes < m.max_nodes)
        moves = []
        if below and call_t != call_v:
            moves.append(("rendezvous_s", call_t - call_v, f"last call {call_v:g} s -> {call_t:g} s"))
        if leaves and alive_t != alive_v:
            moves.append(("detection_s", alive_t - alive_v, f"keep-alive expiry {alive_v:g} s -> {alive_t:g} s"))
        phases, recovery, notes = dict(cost.phases), cost.recovery_s, []
        for phase, delta, why in moves:
            measured = phases.get(phase)
            if measured is not None:  # the wait is in this phase: it cannot go below zero
                phases[phase] = round(max(0.0, measured + delta), 3)
                delta = phases[phase] - measured
            recovery = round(max(0.0, recovery + delta), 3)
            was = "?" if measured is None else f"{measured:.1f}"
            now = "?" if measured is None else f"{phases[phase]:.1f}"
            notes.append(f"{phase.removesuffix('_s')} {was} s measured -> {now} s modelled ({why})")
        kinds.append(dataclasses.replace(cost, phases=phases, recovery_s=recovery, modelled=tuple(notes)))
    return dataclasses.replace(m, kinds=tuple(kinds), at=target)


def parse_settings(text: str) -> dict[str, str]:
    """`--rdzv-conf`: "torch-defaults" or k=v pairs of SETTING_KEYS, whole seconds (or attempts)."""
    if text.strip() == "torch-defaults":
        return dict(TORCH_DEFAULTS)
    settings = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in SETTING_KEYS or not value.isdigit() or int(value) < 1:
            raise UsageError(
                f"--rdzv-conf {text!r}: {item.strip()!r} is not one of {', '.join(SETTING_KEYS)} = a whole number "
                "of 1 or more; use e.g. --rdzv-conf last_call_timeout=30,keep_alive_interval=5, or torch-defaults"
            )
        settings[key] = value
    return settings


def measure_vet(vet: Mapping[str, Any], base: Path, source: str) -> Measurements:
    """The measurements of a vet's result (vet.json's dict, or VetResult.as_dict()); run folders relative to `base`."""
    runs = read_runs(vet, base)
    if not runs:
        raise UsageError(f"{source}: none of its runs' histories is there (run_dirs); forecast where the vet ran")
    return measurements_from(vet, runs, source)


# ---------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class Shares:
    """Where the wall time goes, as fractions adding up to 1."""

    restarts: float
    redone: float
    checkpoint: float
    goodput: float


def shares(rates_s: Mapping[str, float], costs: Mapping[str, KindCost], tau: float, delta: float) -> Shares:
    """The model (the module's docstring): `rates_s` the job's failures per second by kind, `costs` each kind's
    measured cost, τ the training seconds between saves, δ a save's seconds. No checkpoint (τ infinite): the
    work since the job's start is lost, and re-done work takes everything."""
    restarts = sum(rate * costs[k].lost_s for k, rate in rates_s.items())
    restarting = sum(rate for k, rate in rates_s.items() if costs[k].restarts)
    redone = restarting * (tau + delta) / 2 if math.isfinite(tau) else (1.0 if restarting else 0.0)
    left = max(0.0, 1.0 - restarts - redone)
    if left == 0.0:  # the failures take all the time: scale the two to it
        total = restarts + redone
        return Shares(restarts / total, redone / total, 0.0, 0.0)
    cycle = tau + delta
    checkpoint = left * delta / cycle if math.isfinite(tau) and cycle > 0 else 0.0
    return Shares(restarts, redone, checkpoint, left - checkpoint)


def young_interval(delta: float, mtbf_s: float) -> float:
    """Young's checkpoint interval τ* = √(2·δ·M): δ a save's cost, M the mean time between failures."""
    return math.sqrt(2.0 * delta * mtbf_s)


@dataclasses.dataclass(frozen=True)
class KindShare:
    kind: str
    per_day: float  # interruptions of this kind per day, the whole job
    loss_share: float  # its part of the time lost to failures (restarts + re-done work)
    cost: KindCost
    stand_in: str | None  # the measured kind used for it (None: measured itself)


@dataclasses.dataclass(frozen=True)
class ScaleForecast:
    nodes: int
    gpus: int
    per_day: float  # interruptions per day
    mtbf_h: float  # the job's mean time between failures
    shares: Shares
    interval_s: float  # τ the job keeps (inf: no checkpoint)
    young_s: float | None  # τ*; None: the save cost is not known
    goodput_at_young: float | None
    kinds: tuple[KindShare, ...]
    levers: tuple[str, ...]  # biggest first

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["interval_s"] = None if math.isinf(self.interval_s) else self.interval_s
        return data


@dataclasses.dataclass(frozen=True)
class Forecast:
    measurements: Measurements
    rates: FailureRates
    scales: tuple[ScaleForecast, ...]
    assumptions: tuple[str, ...]

    def as_dict(self) -> dict:
        m = self.measurements
        return {
            "source": m.source,
            "measured": {
                "step_s": m.step_s,
                "save_s": m.save_s,
                "interval_steps": m.interval_steps,
                "interval_s": m.interval_s,
                "saves_seen": m.saves_seen,
                "saves_timed": m.saves_timed,
                "save_how": m.save_how,
                "given": sorted(m.given),
                "settings": dict(m.settings),
                "forecast_settings": None if m.at is None else dict(m.at),
                "torch_defaults": dict(TORCH_DEFAULTS),
                "kinds": [dataclasses.asdict(k) for k in m.kinds],
                "vet_nodes": m.nodes,
            },
            "rates": {"source": self.rates.source, "per_node_hour": dict(self.rates.per_node_hour)},
            "mapping": list(self.rates.mapping),
            "scales": [s.as_dict() for s in self.scales],
            "assumptions": list(self.assumptions),
        }


def forecast_scale(m: Measurements, rates: FailureRates, nodes: int, gpus_per_node: int) -> ScaleForecast:
    """The job at `nodes` nodes under `rates`, from `m`."""
    per_s = {k: nodes * r / 3600.0 for k, r in rates.per_node_hour.items() if r > 0}
    costs, stand_ins = {}, {}
    for kind in per_s:
        costs[kind], stand_ins[kind] = m.cost(kind)
    delta = m.save_s or 0.0
    tau = m.interval_s if m.interval_s is not None else math.inf
    now = shares(per_s, costs, tau, delta)
    total = sum(per_s.values())
    restarting = sum(r for k, r in per_s.items() if costs[k].restarts)
    young = young_interval(delta, 1.0 / restarting) if m.save_s and restarting else None
    at_young = shares(per_s, costs, young, delta).goodput if young else None
    lost = {
        k: r * costs[k].lost_s + (r * (tau + delta) / 2 if costs[k].restarts and math.isfinite(tau) else 0.0)
        for k, r in per_s.items()
    }
    lost_total = sum(lost.values()) or 1.0
    kinds = tuple(
        sorted(
            (KindShare(k, r * 86400, lost[k] / lost_total, costs[k], stand_ins[k]) for k, r in per_s.items()),
            key=lambda s: -s.loss_share,
        )
    )
    scale = ScaleForecast(
        nodes, nodes * gpus_per_node, total * 86400, 1 / total / 3600, now, tau, young, at_young, kinds, ()
    )
    return dataclasses.replace(scale, levers=levers(scale, per_s, costs, delta))


MIN_LEVER_GAIN = 0.001  # a lever besides the biggest is named when it lifts goodput by 0.1 points or more


def levers(scale: ScaleForecast, per_s: Mapping[str, float], costs: Mapping[str, KindCost], delta: float) -> tuple:
    """What would lift goodput most, one sentence each, biggest gain first."""
    found: list[tuple[float, str]] = []
    now = scale.shares.goodput
    if scale.young_s is not None and scale.goodput_at_young is not None:
        kept = "never" if math.isinf(scale.interval_s) else f"every {duration(scale.interval_s)}"
        found.append(
            (
                scale.goodput_at_young - now,
                f"checkpoint every {duration(scale.young_s)} (Young's τ*) instead of {kept}: "
                f"goodput {pct(now)} → {pct(scale.goodput_at_young)}",
            )
        )
    elif delta == 0.0 and math.isinf(scale.interval_s):
        found.append((1.0 - now, "checkpoint at all: every restart now re-does the job from its start"))
    top = scale.kinds[0] if scale.kinds else None
    if top is not None and top.loss_share > 0:
        name = KIND_WORDS.get(top.kind, top.kind)
        said = f"{name} is {pct(top.loss_share)} of the loss"
        phase = top.cost.biggest_phase
        if phase is not None and phase[1] > 0:
            which, seconds = phase
            nature = PHASE_NATURE[which][1]
            cut = {**costs, top.kind: dataclasses.replace(top.cost, recovery_s=top.cost.recovery_s - seconds)}
            better = shares(per_s, cut, scale.interval_s, delta).goodput
            found.append(
                (
                    better - now,
                    f"{said}: "
                    + (
                        f"its {top.cost.recovery_s:.0f} s recovery is mostly {which.removesuffix('_s')} "
                        f"({seconds:.0f} s"
                        if seconds > top.cost.recovery_s / 2
                        else f"its recovery's biggest phase is {which.removesuffix('_s')} ({seconds:.0f} s of "
                        f"{top.cost.recovery_s:.0f} s"
                    )
                    + f", {nature}); without it goodput {pct(now)} → {pct(better)}",
                )
            )
        else:
            found.append((0.0, f"{said}: its {top.cost.recovery_s:.0f} s recovery has no phases measured"))
    if delta > 0 and not math.isinf(scale.interval_s):
        tau = scale.young_s or scale.interval_s
        faster = shares(per_s, costs, tau, delta / 2).goodput
        base = scale.goodput_at_young if scale.young_s else now
        found.append(
            (
                faster - base,
                f"halve the save's {delta:.2f} s (an async or sharded save) at τ {duration(tau)}: "
                f"goodput {pct(base)} → {pct(faster)}",
            )
        )
    ranked = sorted(found, key=lambda g: -g[0])
    # The biggest always; the others only where they move goodput by a tenth of a point or more.
    return tuple(text for i, (gain, text) in enumerate(ranked) if i == 0 or gain >= MIN_LEVER_GAIN)


def assumptions(m: Measurements, rates: FailureRates, vet_nodes: int) -> tuple[str, ...]:
    said = [
        f"failure rates: {rates.source}; a node fails once every {rates.node_mtbf_h / 24:.0f} days on average",
        "failures are independent and arrive at a constant rate (exponential), each node alike",
        "a failure that restarts the workers loses on average half a checkpoint cycle, (τ + δ)/2",
        f"step time {m.step_s:.3f} s: measured (median of rank 0's steady steps in the vet's runs)",
    ]
    if "save_s" in m.given:
        said.append(f"save cost δ {m.save_s:.3f} s: GIVEN (--save-cost), not measured")
    elif m.save_s is None:
        said.append(
            "save cost δ: NOT measured (the vet saw no save with its duration): taken as 0, so no τ*; "
            "give --save-cost, or vet the job saving more often"
        )
    else:
        how = f" ({m.save_how}, ...)" if m.save_how else ""
        said.append(
            f"save cost δ {m.save_s:.3f} s: measured by the instrumentation around the script's own saves (its "
            "torch.save or DCP save, to the rename that publishes it where it writes atomically), the slowest "
            f"rank's, the median of {m.saves_timed} save{'' if m.saves_timed == 1 else 's'}{how}"
        )
    if "interval_steps" in m.given:
        said.append(f"checkpoint interval τ {m.interval_steps:g} steps = {m.interval_s:.1f} s: GIVEN (--ckpt-every)")
    elif m.interval_steps is None:
        said.append(
            "checkpoint interval: NOT measured (the vet saw fewer than two saves: its faults struck first): "
            "every restart re-does the whole job; give --ckpt-every, or vet the job saving more often"
        )
    else:
        said.append(
            f"checkpoint interval τ {m.interval_steps:g} steps = {m.interval_s:.1f} s: measured (the most common gap "
            "between the saved steps; one saved step: that step, the job saving at its multiples)"
        )
    said.append(
        f"recovery times measured on {vet_nodes} nodes here, under the vet's rdzv settings "
        f"{settings_words(m.settings)}. Their waits are set by torch's settings: a round below the job's most nodes "
        "(a node left) waits last_call_timeout (rendezvous); a node that leaves is dropped once its keep-alive "
        "(keep_alive_interval × keep_alive_max_attempt) expires (detection). Worker start, pg init, checkpoint load "
        "and first step grow with the job: measured at small scale, so a lower bound at scale"
    )
    if m.at is None:
        said.append(
            "forecast at the vet's own rdzv settings (the job at scale run with them); at others: --rdzv-conf, "
            "e.g. --rdzv-conf torch-defaults"
        )
    else:
        moved = [f"{k.kind}: {line}" for k in m.kinds for line in k.modelled]
        said.append(
            f"forecast at rdzv settings {settings_words(m.at)}, not the vet's: "
            + ("; ".join(moved) if moved else "no measured phase waits on a setting that differs")
        )
    return tuple(said)


def forecast(
    m: Measurements,
    rates: FailureRates,
    nodes: Sequence[int] = DEFAULT_SCALES,
    gpus_per_node: int = 8,
    settings: Mapping[str, str] | None = None,
) -> Forecast:
    """The forecast at each of `nodes`; at the rdzv `settings` given (their setting-driven phases moved: at_settings),
    else at the vet's own."""
    if settings is not None:
        m = at_settings(m, settings)
    scales = tuple(forecast_scale(m, rates, n, gpus_per_node) for n in nodes)
    said = list(assumptions(m, rates, m.nodes))
    used = sorted({(k.kind, k.stand_in) for s in scales for k in s.kinds if k.stand_in})
    said += [f"{kind} was not vetted: its measured stand-in is {other}'s recovery" for kind, other in used]
    return Forecast(m, rates, scales, tuple(said))


# ---------------------------------------------------------------- input and output


def parse_scales(text: str) -> tuple[int, ...]:
    try:
        scales = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        scales = ()
    if not scales or any(n < 1 for n in scales):
        raise UsageError(f"--nodes {text!r}: give node counts, e.g. --nodes 64,512,2048")
    return scales


def pct(share: float) -> str:
    return f"{100 * share:.1f} %"


def duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds < 10:  # a short checkpoint interval (0.2 s) is not "every 0 s"
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render(f: Forecast, width: int = 118) -> str:
    m = f.measurements
    lines = [
        f"sim forecast: from {m.source or 'a vet'} ({m.nodes} nodes x {m.gpus_per_node} here)",
        "measured: step "
        + f"{m.step_s:.3f} s, save δ "
        + ("-" if m.save_s is None else f"{m.save_s:.3f} s")
        + ", interval τ "
        + ("-" if m.interval_s is None else f"{m.interval_steps:g} steps = {m.interval_s:.1f} s"),
    ]
    at = "the vet's" if m.at is None else "the forecast's: modelled where they differ from the vet's"
    said = [
        f"phases in s: [S] set by torch's settings, at {at}; [G] grows with the job, measured: a lower bound",
        f"the vet's rdzv settings: {settings_words(m.settings)}",
    ]
    if m.at is not None:
        said.append(f"the forecast's rdzv settings: {settings_words(m.at)}")
    for line in said:
        lines += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="    ")
    tags = {"settings": "S", "grows": "G"}
    for k in m.kinds:
        phases = ", ".join(
            f"{p.removesuffix('_s')} {v:.1f}[{tags[PHASE_NATURE[p][0]]}]"
            for p, v in k.phases.items()
            if v is not None and p in PHASE_NATURE
        )
        said = f"{k.kind}: recovery {k.recovery_s:.1f} s + slow start {k.slow_s:.1f} s, steps lost {k.steps_lost}"
        lines += textwrap.wrap(
            f"{said} ({phases or 'no phases'})", width, initial_indent="  ", subsequent_indent="    "
        )
        for line in k.modelled:
            lines += textwrap.wrap(f"modelled: {line}", width, initial_indent="    ", subsequent_indent="      ")
    head = (
        f"{'nodes':>6} {'GPUs':>6} {'int/day':>8} {'MTBF':>8} {'restarts':>9} {'re-done':>8} {'ckpt':>6} "
        f"{'goodput':>8} {'τ*':>7} {'at τ*':>7}"
    )
    lines += ["", head]
    for s in f.scales:
        lines.append(
            f"{s.nodes:>6} {s.gpus:>6} {s.per_day:>8.1f} {duration(s.mtbf_h * 3600):>8} "
            f"{pct(s.shares.restarts):>9} {pct(s.shares.redone):>8} {pct(s.shares.checkpoint):>6} "
            f"{pct(s.shares.goodput):>8} {'-' if s.young_s is None else duration(s.young_s):>7} "
            f"{'-' if s.goodput_at_young is None else pct(s.goodput_at_young):>7}"
        )
    for s in f.scales:
        lines.append(f"at {s.nodes} nodes:")
        mix = ", ".join(
            f"{KIND_WORDS.get(k.kind, k.kind)} {k.per_day:.1f}/day ({pct(k.loss_share)} of the loss"
            + (f", as {k.stand_in}" if k.stand_in else "")
            + ")"
            for k in s.kinds
        )
        lines += textwrap.wrap(mix, width, initial_indent="  ", subsequent_indent="    ")
        for i, lever in enumerate(s.levers):
            head = "  biggest lever: " if i == 0 else "  then: "
            lines += textwrap.wrap(head + lever, width, subsequent_indent="    ")
    lines.append("")
    lines.append("the failure mix (our kinds from the source's categories):")
    for line in f.rates.mapping:
        lines += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="    ")
    lines.append("assumptions:")
    for said in f.assumptions:
        lines += textwrap.wrap(said, width, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines)


def render_html(f: Forecast) -> str:
    """The forecast as an HTML section (vet.html's, or a page of its own)."""
    import html

    esc = html.escape
    heads = ("nodes", "GPUs", "interruptions/day", "MTBF", "restarts", "re-done", "checkpoint", "goodput", "τ*")
    rows = []
    for s in f.scales:
        cells = (
            s.nodes,
            s.gpus,
            f"{s.per_day:.1f}",
            duration(s.mtbf_h * 3600),
            pct(s.shares.restarts),
            pct(s.shares.redone),
            pct(s.shares.checkpoint),
            pct(s.shares.goodput),
            "-" if s.young_s is None else f"{duration(s.young_s)} ({pct(s.goodput_at_young or 0)})",
        )
        rows.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in cells) + "</tr>")
    levers = "".join(f"<li><b>{s.nodes} nodes:</b> {esc(s.levers[0])}</li>" for s in f.scales if s.levers)
    measured = "".join(
        f"<tr><td>{esc(k.kind)}</td><td>{k.recovery_s:.1f} s</td><td>{k.slow_s:.1f} s</td><td>{k.steps_lost}</td><td>"
        + esc(
            ", ".join(
                f"{p.removesuffix('_s')} {v:.1f} s ({PHASE_NATURE[p][0]})"
                for p, v in k.phases.items()
                if v is not None and p in PHASE_NATURE
            )
            + "".join(f"; modelled: {line}" for line in k.modelled)
        )
        + "</td></tr>"
        for k in f.measurements.kinds
    )
    said = "".join(f"<li>{esc(a)}</li>" for a in f.assumptions)
    mapping = "".join(f"<li>{esc(line)}</li>" for line in f.rates.mapping)
    return (
        "<h2>Forecast at scale</h2>"
        f"<table><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr>{''.join(rows)}</table>"
        f"<p><b>Biggest levers</b></p><ul>{levers}</ul><p><b>Measured by the vet</b> (phases: set by torch's "
        "settings, or growing with the job)</p><table><tr><th>kind</th><th>recovery</th><th>slow start</th>"
        f"<th>steps lost</th><th>phases</th></tr>{measured}</table>"
        f"<p><b>Failure mix</b></p><ul>{mapping}</ul><p><b>Assumptions</b></p><ul>{said}</ul>"
    )


# ---------------------------------------------------------------- the check against a soak


@dataclasses.dataclass(frozen=True)
class SoakMeasure:
    """What a soak's history shows between its first fault and its last (the last one's own cost is not in it)."""

    window_s: float
    faults: int  # faults that struck inside the window (all but the last)
    steps: int  # net progress: the step reached at the window's end less the one at its start
    step_s: float  # the soak's own steady step time
    # The soak's own recoveries from the faults in the window, as the vet measures them: the mean recovery and
    # slow start (None: none measured). The model given these tells its own error from its inputs'.
    recovery_s: float | None = None
    slow_s: float | None = None
    # Their phases, each the mean over the recoveries that show it, and the slowest recovery: where the soak's
    # recoveries differ from the vet's is seen phase by phase (waits on settings, or work on a shared CPU).
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)
    slowest_s: float | None = None

    @property
    def goodput(self) -> float:
        return self.steps * self.step_s / self.window_s


def _step_at(run: RunModel, t: float) -> int | None:
    index = bisect.bisect_left(run.progress_times, t)
    return run.progress[index - 1].step if index > 0 else None


def soak_recoveries(run: RunModel, begin: float, end: float) -> list[tuple[float, float, Mapping[str, float | None]]]:
    """The recoveries from the faults invoked in [begin, end) that reached a first step, each as the vet measures
    it: (its recovery, its slow start over the seconds its throughput after was measured, its phases)."""
    inside = [r for r in recoveries(run) if begin <= r.fault.t_invoke < end and r.first_progress is not None]
    return [
        (
            r.public().recovery_s,
            slow_start(dataclasses.asdict(r.public()), after_window(run, r.first_progress.t)),
            r.phases.as_dict(),
        )
        for r in inside
    ]


def _phase_stat(found: Sequence[Mapping[str, float | None]], stat: Callable[[list[float]], float]) -> dict:
    """Each phase's `stat` over the recoveries that show it (a phase none shows is left out)."""
    phases = {}
    for phase in PHASES:
        values = [p[phase] for p in found if p.get(phase) is not None]
        if values:
            phases[phase] = round(stat(values), 3)
    return phases


def soak_measure(run: RunModel, skip: int = 0) -> SoakMeasure:
    """The goodput a soak measured: the steps it gained from its first fault to its last, at its own step time,
    over that time (a step re-done after a restart counts once). `skip`: the first faults were the re-measure's
    (remeasure), not the soak's: the window begins at the fault after them."""
    invokes = sorted(f.t_invoke for f in run.faults)
    if len(invokes) < skip + 2:
        after = f" after the re-measure's {skip}" if skip else ""
        raise UsageError(
            f"the soak struck {len(invokes) - skip} fault(s){after}: it needs two or more to measure between"
        )
    begin, end = invokes[skip], invokes[-1]
    first, last = _step_at(run, begin), _step_at(run, end)
    step_s = step_seconds(run)
    if first is None or last is None or step_s is None:
        raise UsageError("the soak's history shows no training steps around its faults: nothing to measure")
    found = soak_recoveries(run, begin, end)
    times = [f[0] for f in found]
    return SoakMeasure(
        end - begin,
        len(invokes) - 1 - skip,
        last - first,
        step_s,
        statistics.mean(times) if times else None,
        statistics.mean(f[1] for f in found) if found else None,
        _phase_stat([f[2] for f in found], statistics.mean),
        max(times, default=None),
    )


@dataclasses.dataclass(frozen=True)
class Remeasured:
    """A kind's inputs measured again on the soak's own cluster just before its soak, under the load the soak runs
    under (sim forecast --check): `faults` of the kind, each once the job was steady, as the vet strikes; the median
    of their recoveries (with phases) and slow starts; the step time and save cost of that segment (None: not seen
    there, the vet's kept). The vet's one sample of a restart's CPU-bound phases (worker start, first step) was
    measured under another load of a shared host: 12 to 74 s for the same restart within one soak here."""

    cost: KindCost  # the vet's KindCost for the kind with the medians in place of its recovery, slow start, phases
    faults: int  # the re-measure's faults struck
    samples: tuple[float, ...]  # each recovery seen, in order
    slow_samples: tuple[float, ...]
    until: float  # the segment's end: the soak's first fault
    step_s: float | None = None
    save_s: float | None = None

    def applied(self, m: Measurements) -> Measurements:
        """`m` with the re-measured inputs in place of the vet's: the kind's cost, the step time, the save cost."""
        kinds = tuple(self.cost if k.kind == self.cost.kind else k for k in m.kinds)
        if self.cost.kind not in {k.kind for k in m.kinds}:
            kinds += (self.cost,)
        return dataclasses.replace(
            m,
            kinds=kinds,
            step_s=self.step_s if self.step_s is not None else m.step_s,
            save_s=self.save_s if self.save_s is not None else m.save_s,
        )

    def as_dict(self) -> dict:
        return {
            "kind": self.cost.kind,
            "faults": self.faults,
            "recovery_s": self.cost.recovery_s,
            "slow_s": self.cost.slow_s,
            "phases": dict(self.cost.phases),
            "samples": list(self.samples),
            "slow_samples": list(self.slow_samples),
            "step_s": self.step_s,
            "save_s": self.save_s,
        }


def remeasure(m: Measurements, run: RunModel, kind: str, faults: int) -> Remeasured | None:
    """The kind's inputs as the soak's first `faults` faults (its re-measure) measured them, or None where none of
    them reached a first step (nothing re-measured: the vet's inputs stand)."""
    invokes = sorted(f.t_invoke for f in run.faults)
    if faults < 1 or len(invokes) <= faults:
        return None
    until = invokes[faults]
    found = soak_recoveries(run, invokes[0], until)
    if not found:
        return None
    base = m.cost(kind)[0]
    cost = dataclasses.replace(
        base,
        kind=kind,
        recovery_s=statistics.median(f[0] for f in found),
        slow_s=statistics.median(f[1] for f in found),
        phases=_phase_stat([f[2] for f in found], statistics.median),
        modelled=(),
    )
    saves = save_costs(run, before=until)[0]
    return Remeasured(
        cost,
        faults,
        tuple(f[0] for f in found),
        tuple(f[1] for f in found),
        until,
        step_seconds(run, before=until),
        statistics.median(saves) if saves else None,
    )


def soak_prediction(m: Measurements, kind: str, faults: int, window_s: float, cost: KindCost | None = None) -> Shares:
    """The model at the vet's own scale for a soak: `faults` faults of `kind` in `window_s` seconds, each costing
    what the vet measured (or `cost`)."""
    cost = cost or m.cost(kind)[0]
    tau = m.interval_s if m.interval_s is not None else math.inf
    return shares({kind: faults / window_s}, {kind: cost}, tau, m.save_s or 0.0)
