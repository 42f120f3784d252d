"""`sim vet`: a job put through what clusters do to it, one fault after another, with a scorecard.

A generator over the fault catalog, not a new runner: each kind's Provocation (sim/faults/catalog.py)
says how to provoke it, what survival means and what node count it leaves. The vet shares the kinds
out between clusters that run at once (two by default), builds one scenario per cluster from them
(each step fires once training is steady again: the `recovered` trigger) and hands each to the
scenario runner, which ends the run once the job is steady after the last fault. A fault that ends
the job by design (losing c10d's store host) gets a short cluster of its own, judged on ending fast
and cleanly. Then each fault is scored from the run's history: the
recovery (sim.verdict.recovery), the checkpoint loads of each rank, and the diagnoses the verdict
computes, each attributed to the fault whose window its evidence falls in.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from sim.core.errors import JobNeverTrainedError, UsageError
from sim.core.faultkinds import FAULT_KINDS, PROVOCATIONS, Provocation
from sim.core.history import FILE_NAME, FaultRecord, History
from sim.core.nodes import node_order
from sim.core.spec import ClusterSpec, check_room_beside, node_name, spec_from_options
from sim.engines.cluster import job_images, other_clusters_memory
from sim.engines.docker import Docker
from sim.faults.catalog import FAULTS
from sim.scenarios.runner import ScenarioResult, ScenarioRunner
from sim.scenarios.scenario import PROFILES, Expectation, Scenario, Step, Trigger
from sim.verdict import Verdict
from sim.verdict.checkers import CHECKS_FOR, no_training_reason
from sim.verdict.diagnoses.registry import Diagnosis, diagnose
from sim.verdict.pitfalls import PITFALL_CODES, mixed_sources, resume_sources, written_words
from sim.verdict.recovery import Recovery, recoveries
from sim.verdict.runfolder import ENDING_CHECKS, saved_logs
from sim.verdict.runmodel import RunModel
from sim.vet.forecast import Forecast
from sim.vet.forecast import render_html as forecast_html

DEFAULT_GAUNTLET = tuple(name for name, p in PROVOCATIONS.items() if p.default)  # each kind declares its own
# The kind that sets the node count (`nodes`): it restores the job's size between faults.
RESIZE = next(kind.name for kind in FAULT_KINDS if kind.changes_node_count)
QUICK_GAUNTLET = tuple(kind for kind in DEFAULT_GAUNTLET if PROVOCATIONS[kind].quick)
VET_PROFILE = "fast"
DEFAULT_MAX_RESTARTS = 30  # the gauntlet's faults, each up to two restarts, when the user sets no budget
STEP_BUDGET_S = 90.0  # how long one fault may take to recover before the job counts as not steady
SOLO_FAIL_FAST_S = 60.0
CKPT_DISK = "16m"  # a size-limited /ckpt for fill-disk, when the user gave none
_CLOCK = re.compile(r"\b(\d\d):(\d\d):(\d\d(?:\.\d+)?)\b")

Progress = Callable[[str], None]


# ---------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class PlannedFault:
    """One row of the scorecard: a kind, the step that provokes it (None: not applicable) and where it runs."""

    kind: str
    provocation: Provocation
    step: Step | None
    solo: bool = False  # on a cluster of its own: it ends the job by design
    why_not: str | None = None  # not applicable: why, and what to do


@dataclasses.dataclass(frozen=True)
class Plan:
    spec: ClusterSpec
    faults: tuple[PlannedFault, ...]
    gauntlet: tuple[Step, ...]  # the steps of the shared run, restoring steps among them
    restores: frozenset[int]  # indexes of the steps that only restore the node count (not scored)
    final_world: int

    @property
    def scored(self) -> list[PlannedFault]:
        return [f for f in self.faults if f.step is not None and not f.solo]


def parse_faults(text: str | None, quick: bool) -> tuple[str, ...]:
    """The kinds `--faults a,b,c` names (checked), or the quick or the default gauntlet."""
    if text is None:
        return QUICK_GAUNTLET if quick else DEFAULT_GAUNTLET
    if quick:
        raise UsageError("--faults and --quick both choose the faults; give one")
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds:
        raise UsageError(f"--faults {text!r}: names no fault; give some of: {', '.join(PROVOCATIONS)}")
    for kind in kinds:
        if kind not in PROVOCATIONS:
            catalog = " (a catalog fault the vet has no provocation for)" if kind in FAULTS else ""
            raise UsageError(f"--faults: unknown kind {kind!r}{catalog}; use some of: {', '.join(PROVOCATIONS)}")
    if len(set(kinds)) != len(kinds):
        raise UsageError(f"--faults {text!r}: a kind named twice; name each once")
    return kinds


VET_DEFAULTS = {"nodes": 3, "nproc_per_node": 1}


def prepare(
    options: Mapping[str, Any], script_args: Sequence[str] | None, faults: str | None, quick: bool = False
) -> tuple[ClusterSpec, tuple[str, ...]]:
    """The job's spec and the kinds to run, from `sim up`-style options: every input checked (one line each)
    before anything starts. Shared by `sim vet` and the pytest plugin's sim_vet fixture."""
    kinds = parse_faults(faults, quick)
    options = dict(options)
    for key, default in VET_DEFAULTS.items():
        if options.get(key) is None:
            options[key] = default
    spec = spec_from_options(options, script_args)
    if not spec.instrument and not spec.progress_regex and spec.script:
        raise UsageError(
            "--no-instrument: the vet must see training steps to know the job is steady; drop it, "
            "or give --progress-regex to read steps from the script's log lines"
        )
    spec = vet_spec(spec, kinds, restarts_given=options.get("max_restarts") is not None)
    plan_vet(spec, kinds, chosen=faults is not None)
    return spec, kinds


def vet_spec(spec: ClusterSpec, kinds: Sequence[str], restarts_given: bool) -> ClusterSpec:
    """The job's spec as the vet runs it: the fast profile's rendezvous timeouts under the user's own, a restart
    budget for the gauntlet unless the user set one, a size-limited /ckpt when a fault fills it."""
    profile = PROFILES[VET_PROFILE]
    conf = {**{k: str(v) for k, v in profile["rdzv_conf"].items()}, **dict(spec.rdzv_conf)}
    env = {**profile.get("env", {}), **dict(spec.env)}
    changes: dict[str, Any] = {"rdzv_conf": tuple(conf.items()), "env": tuple(env.items())}
    if not restarts_given:
        changes["max_restarts"] = DEFAULT_MAX_RESTARTS
    if spec.ckpt_size is None and any(PROVOCATIONS[k].needs_ckpt_disk for k in kinds):
        changes["ckpt_size"] = CKPT_DISK
    return dataclasses.replace(spec, **changes)


def _not_hosted(provocation: Provocation, backend: str) -> str | None:
    hosts = provocation.hosted_on
    if hosts is None or backend in hosts:
        return None
    return f"needs the {' or '.join(hosts)} backend, not {backend}; vet with --rdzv-backend {hosts[0]} to run it"


def plan_vet(spec: ClusterSpec, kinds: Sequence[str], *, chosen: bool, control_s: float = 0.0) -> Plan:
    """The scenario steps for `kinds` on `spec`. `chosen`: the user named the kinds, so one the backend cannot
    host is refused (one line) instead of scored not applicable. `control_s`: the job trains this long, steady
    and with no fault, before the first step (`sim tune`'s no-fault control window)."""
    backend, nodes = spec.rdzv_backend, spec.nodes
    max_nodes = spec.max_nodes or nodes
    if nodes < 2:
        raise UsageError(f"--nodes {nodes}: the vet needs at least 2 nodes (a fault strikes one, others survive it)")
    faults: list[PlannedFault] = []
    steps: list[Step] = []
    restores: set[int] = set()
    current = nodes

    def add(fault: str, options: Mapping[str, Any], duration: float | None, world: int, early: bool = False) -> Step:
        undo_world = (world - 1) * spec.nproc_per_node if early else None
        trigger = Trigger("recovered", world * spec.nproc_per_node, lag_s=0.0 if steps else control_s)
        step = Step(fault, options, trigger, duration, undo_once_recovered=undo_world)
        steps.append(step)
        return step

    for kind in _run_order(kinds, backend):
        provocation = PROVOCATIONS[kind]
        why_not = _not_hosted(provocation, backend)
        if why_not and chosen:
            raise UsageError(f"--faults {kind}: {why_not}")
        if why_not:
            faults.append(PlannedFault(kind, provocation, None, why_not=why_not))
            continue
        if backend in provocation.ends_job_on:
            world = nodes * spec.nproc_per_node
            step = Step(provocation.fault, _fill(provocation.options, nodes), Trigger("recovered", world))
            faults.append(PlannedFault(kind, provocation, step, solo=True))
            continue
        # Each fault strikes the job at its full size; a node can join only one below its maximum.
        if provocation.nodes == "more":
            wanted = current if current < max_nodes else current - 1
        else:
            wanted = nodes
        if current != wanted:
            restores.add(len(steps))
            add(RESIZE, {"nodes": wanted}, None, current)
            current = wanted
        options = _fill(provocation.options, current)
        step = add(provocation.fault, options, provocation.duration_s, current, provocation.undone_once_regrouped)
        faults.append(PlannedFault(kind, provocation, step))
        current += {"same": 0, "less": -1, "more": 1}[provocation.nodes]
    return Plan(spec, tuple(faults), tuple(steps), frozenset(restores), current * spec.nproc_per_node)


# Seconds a kind typically adds to a gauntlet when its provocation declares none (its cost_s, bench/vet_time.py,
# 2026-12-03), and a job-ending one's own cluster: what splitting the kinds between clusters balances.
TYPICAL_S = 10.0
SOLO_COST_S = 28.0
MAX_CLUSTERS = 4


def cluster_count(given: int | None, spec: ClusterSpec) -> int:
    """How many clusters the vet runs at once: `given` (--parallel) checked, else two (one on a swarm, where each
    run initialises the one-host swarm and leaves it at its end: two at once would race)."""
    if given is None:
        return 2 if spec.capabilities.parallel_clusters.ok else 1
    if not 1 <= given <= MAX_CLUSTERS:
        raise UsageError(
            f"--parallel {given}: give 1 to {MAX_CLUSTERS} clusters at once (1 runs every fault on one cluster)"
        )
    if given > 1:
        spec.capabilities.parallel_clusters.require(f"--parallel {given}: ")
    return given


def clusters_that_fit(wanted: int, spec: ClusterSpec, others: Mapping[str, Sequence[int]], memory_mib=None) -> int:
    """The most of `wanted` clusters of `spec` this machine holds at once beside `others` (other clusters' nodes:
    check_room_beside), at least one: the first cluster's own `up` refuses, in its own words, what cannot fit."""
    for count in range(wanted, 1, -1):
        try:
            check_room_beside("--parallel", count * spec.nodes, spec.counted_memory_mib, others, memory_mib)
            return count
        except UsageError:
            continue
    return 1


def split_kinds(kinds: Sequence[str], backend: str, clusters: int) -> list[tuple[str, ...]]:
    """`kinds` shared out between `clusters` clusters, each share in the listed order, their typical times
    balanced (longest first, each to the least loaded). A node-removing kind listed just before a node-adding one
    stays with it: the pair restores the node count itself. A kind the backend cannot host costs nothing."""
    units: list[list[str]] = []
    for kind in kinds:
        p = PROVOCATIONS[kind]
        previous = units[-1] if units else None
        if previous and len(previous) == 1 and p.nodes == "more" and PROVOCATIONS[previous[0]].nodes == "less":
            previous.append(kind)
        else:
            units.append([kind])

    def cost(kind: str) -> float:
        p = PROVOCATIONS[kind]
        if _not_hosted(p, backend):
            return 0.0
        return SOLO_COST_S if backend in p.ends_job_on else (p.cost_s or TYPICAL_S)

    loads = [0.0] * clusters
    shares: list[list[str]] = [[] for _ in range(clusters)]
    for unit in sorted(units, key=lambda u: -sum(cost(k) for k in u)):  # sorted() is stable: ties keep their order
        lane = loads.index(min(loads))
        shares[lane] += unit
        loads[lane] += sum(cost(k) for k in unit)
    order = {kind: i for i, kind in enumerate(kinds)}
    return [tuple(sorted(share, key=order.__getitem__)) for share in shares if share]


def plan_lanes(spec: ClusterSpec, kinds: Sequence[str], *, chosen: bool, clusters: int) -> tuple[Plan, ...]:
    """One plan per cluster that runs at once (split_kinds), each on a cluster of its own name."""
    shares = split_kinds(kinds, spec.rdzv_backend, clusters)
    return tuple(
        plan_vet(
            spec if i == 0 else dataclasses.replace(spec, name=f"{spec.name[:33]}-lane{i + 1}"), share, chosen=chosen
        )
        for i, share in enumerate(shares)
    )


def _run_order(kinds: Sequence[str], backend: str) -> list[str]:
    """The order the gauntlet runs `kinds` in: as listed, but with one fault that takes a node away moved to the
    end, where no restoring scale need follow it (one fewer regroup; the scorecard keeps the listed order). Not
    one that a node-adding fault follows: that pair restores itself."""
    order = list(kinds)
    shared = [
        k for k in order if _not_hosted(PROVOCATIONS[k], backend) is None and backend not in PROVOCATIONS[k].ends_job_on
    ]
    if not shared or PROVOCATIONS[shared[-1]].nodes == "less":
        return order
    for i in range(len(shared) - 1, -1, -1):
        after = shared[i + 1] if i + 1 < len(shared) else None
        if PROVOCATIONS[shared[i]].nodes == "less" and (after is None or PROVOCATIONS[after].nodes != "more"):
            order.remove(shared[i])
            order.append(shared[i])
            break
    return order


def _fill(options: Mapping[str, Any], current: int) -> dict[str, Any]:
    """Placeholders: {victim} the highest node now (never node0, c10d's store host), {less}/{more} a node count."""
    words = {"{victim}": node_name(current - 1), "{less}": current - 1, "{more}": current + 1}

    def fill(value: Any) -> Any:
        if isinstance(value, tuple):
            return tuple(map(fill, value))
        return words.get(value, value) if isinstance(value, str) else value

    return {name: fill(value) for name, value in options.items()}


# ---------------------------------------------------------------- the result


@dataclasses.dataclass(frozen=True)
class FaultScore:
    kind: str
    label: str
    outcome: str  # "survived" | "failed" | "not applicable" | "not reached"
    survival: str  # what surviving means for this kind
    why: str = ""  # not applicable or not reached: why; failed: the checks that failed
    target: str | None = None
    t_fault: float | None = None
    t_end: float | None = None  # the end of its window: the next fault, or the run's end
    recovery_s: float | None = None
    phases: dict = dataclasses.field(default_factory=dict)
    steps_lost: int | None = None
    restarts: int | None = None  # restarts the fault cost (the most on one agent)
    restarts_used: int | None = None  # by the end of its window, of...
    restart_budget: int | None = None
    throughput_before: float | None = None
    throughput_after: float | None = None
    diagnoses: tuple[dict, ...] = ()
    run_dir: str | None = None
    solo: bool = False
    # A failed fault with no diagnosis ("unexplained"): what the history holds of it, the last records of each
    # node in its window (last_records), so the user can see where it stopped.
    evidence: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """It does not fail the vet: survived or not applicable."""
        return self.outcome in ("survived", "not applicable")


@dataclasses.dataclass(frozen=True)
class VetResult:
    script: str | None
    backend: str
    nodes: int
    nproc_per_node: int
    faults: tuple[FaultScore, ...]
    run_dirs: tuple[str, ...]
    wall_s: float
    job_ended_early: str | None = None  # why the gauntlet was cut short
    # The job's own pitfalls (sim/verdict/pitfalls.py) the shared run showed, whatever the faults' outcomes: a
    # model-only checkpoint is named from its first save even when every fault was survived.
    pitfalls: tuple[dict, ...] = ()
    clusters: int = 1  # how many ran at once, each with its share of the faults

    @property
    def passed(self) -> bool:
        return all(f.ok for f in self.faults)

    @property
    def scorecard(self) -> str:
        return scorecard(self)

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["passed"] = self.passed
        return data


def _diagnosis_dict(diagnosis: Diagnosis) -> dict:
    return dataclasses.asdict(diagnosis)


def _evidence_time(diagnosis: Diagnosis, day_of: float) -> float | None:
    """The first evidence line's time as unix seconds (the evidence says only the time of day)."""
    for line in diagnosis.evidence:
        found = _CLOCK.search(line)
        if found:
            hours, minutes, seconds = int(found[1]), int(found[2]), float(found[3])
            midnight = day_of - (day_of % 86400)
            t = midnight + hours * 3600 + minutes * 60 + seconds
            return t + 86400 if t < day_of - 43200 else t
    return None


def _fault_records(run_dir: Path) -> list[FaultRecord]:
    return [r for r in History(run_dir / FILE_NAME).read().records if isinstance(r, FaultRecord)]


def score_gauntlet(plan: Plan, result: ScenarioResult) -> list[FaultScore]:
    """Each planned fault of the shared run, scored from its history."""
    run_dir = result.run_dir
    contents = History(run_dir / FILE_NAME).read()
    run = RunModel(contents.records)
    found = diagnose(run, saved_logs(run_dir))
    by_op = {r.fault.op: r for r in recoveries(run)}
    records = [r for r in contents.records if isinstance(r, FaultRecord)]
    # The steps in the order they fired: each one's first invoke record of its fault after the one before.
    fired: list[FaultRecord | None] = []
    cursor = 0.0
    for step in plan.gauntlet:
        name = FAULTS[step.fault].kind.name  # as the history records it (netem is link)
        invoke = next((r for r in records if r.fault == name and r.phase == "invoke" and r.t > cursor), None)
        fired.append(invoke)
        cursor = invoke.t if invoke else float("inf")
    ends = [r.t for r in fired if r is not None][1:] + [run.t_end]
    scores = []
    budget = plan.spec.max_restarts
    for planned in plan.faults:
        if planned.step is None:
            scores.append(_score(planned, "not applicable", planned.why_not or ""))
            continue
        if planned.solo:
            continue  # scored from its own run
        index = next(i for i, s in enumerate(plan.gauntlet) if s is planned.step)
        invoke = fired[index]
        if invoke is None:
            why = result.unfired or "the job ended before it"
            scores.append(_score(planned, "not reached", why))
            continue
        t_end = ends[[r for r in fired if r is not None].index(invoke)]
        outcome_record = next(
            (r for r in records if r.op == invoke.op and r.phase in ("ok", "fail", "info") and r.t >= invoke.t), None
        )
        if outcome_record is not None and outcome_record.phase == "fail":
            why = f"the fault could not act: {outcome_record.error}"
            if FAULTS[planned.step.fault].kind.strikes_in_write:
                why += (
                    "; write checkpoints under /ckpt (the disk every node shares), "
                    "e.g. torch.save(state, '/ckpt/snapshot.pt')"
                )
            scores.append(_score(planned, "not applicable", why, run_dir=str(run_dir)))
            continue
        recovery = by_op.get(invoke.op)
        steady_after = index + 1 < len(plan.gauntlet) and fired[index + 1] is not None
        steady_after = steady_after or (index + 1 == len(plan.gauntlet) and result.unfired is None)
        problems = []
        if not steady_after:
            problems.append(f"the job was not steady again after it: {result.unfired or 'it ended'}")
        mixed = resumed_apart(run, invoke.t, t_end)
        if mixed:
            problems.append(mixed)
        restarts = _restarts_in(run, invoke.t, t_end)
        used = _restarts_in(run, run.t_begin, t_end)
        if budget is not None and used is not None and used > budget:
            problems.append(f"the restart budget ({budget}) ran out")
        in_window = [_diagnosis_dict(d) for d in found if invoke.t <= (_evidence_time(d, invoke.t) or 0) < t_end]
        attributed = []
        if problems:
            # The job's own pitfalls first, wherever their evidence is (a node-local save long before the fault).
            own = [_diagnosis_dict(d) for d in found if d.code in PITFALL_CODES]
            timeless = [_diagnosis_dict(d) for d in found if _evidence_time(d, invoke.t) is None]
            attributed = _unique(own + [d for d in in_window + timeless if d["code"] not in PITFALL_CODES])
        # A fault the job never got steady after did not recover: no recovery figure (a step that came through
        # before the fault took hold, or a regroup that did not last, is no recovery).
        recovered = recovery if steady_after else None
        scores.append(
            FaultScore(
                planned.kind,
                planned.provocation.label,
                "failed" if problems else "survived",
                planned.provocation.survival,
                "; ".join(problems),
                target=str(planned.step.options.given().get("target") or "") or None,
                t_fault=invoke.t,
                t_end=t_end,
                recovery_s=_recovery_s(recovered),
                phases=recovered.phases.as_dict() if recovered else {},
                steps_lost=recovered.steps_lost if recovered else None,
                restarts=restarts,
                restarts_used=used,
                restart_budget=budget,
                throughput_before=recovery.throughput_before if recovery else None,
                throughput_after=recovered.throughput_after if recovered else None,
                diagnoses=tuple(attributed),
                run_dir=str(run_dir),
                evidence=tuple(last_records(contents.records, invoke.t, t_end)) if problems and not attributed else (),
            )
        )
    return scores


# The last records of each node an unexplained fault shows (a line each, at most this many characters).
LAST_RECORDS_PER_NODE = 3
_RECORD_WIDTH = 160
_RECORD_SKIP = ("t", "type", "node", "event", "run_id", "world_size", "local_rank")


def last_records(records: Sequence[Any], begin: float, end: float, per_node: int = LAST_RECORDS_PER_NODE) -> list[str]:
    """Each node's last records in [begin, end), oldest first, nodes in order: "node1 14:31:20.4  agent
    group_failed attempts_left=3 ...". What an unexplained fault's history said last, node by node."""
    by_node: dict[str, list[Any]] = {}
    for r in records:
        node = getattr(r, "node", None)
        if node and begin <= r.t < end:
            by_node.setdefault(node, []).append(r)
    lines = []
    for node in sorted(by_node, key=node_order):
        for r in by_node[node][-per_node:]:
            data = r.to_dict()
            what = " ".join(str(x) for x in (data.get("type"), data.get("event")) if x)
            fields = " ".join(f"{k}={v}" for k, v in data.items() if k not in _RECORD_SKIP and v is not None)
            clock = time.strftime("%H:%M:%S", time.gmtime(r.t)) + f".{int(r.t * 10) % 10}"
            lines.append(f"{node} {clock}  {what} {fields}".rstrip()[:_RECORD_WIDTH])
    return lines


def job_pitfalls(run_dir: Path) -> list[dict]:
    run = RunModel(History(run_dir / FILE_NAME).read().records)
    return [_diagnosis_dict(d) for d in diagnose(run, saved_logs(run_dir)) if d.code in PITFALL_CODES]


def _unique(diagnoses: list[dict]) -> list[dict]:
    seen: set[str] = set()
    return [d for d in diagnoses if not (d["code"] in seen or seen.add(d["code"]))]


def _recovery_s(recovery: Recovery | None) -> float | None:
    if recovery is None or recovery.t_recovered is None or recovery.degraded:
        return None
    return round(recovery.t_recovered - recovery.fault.t_ok, 1)


def _restarts_in(run: RunModel, begin: float, end: float) -> int | None:
    """Restarts torch counted in (begin, end]: the most on one agent (torch's budget is per agent)."""
    per_node: dict[str, int] = {}
    for r in run.agent_events("group_failed"):
        if begin < r.t <= end:
            per_node[r.node] = per_node.get(r.node, 0) + 1
    return max(per_node.values(), default=0)


def resumed_apart(run: RunModel, begin: float, end: float) -> str | None:
    """The ranks of a group started in (begin, end) resumed from different points (sim/verdict/pitfalls.py)."""
    mixed = [g for g in resume_sources(run, begin, end) if mixed_sources(g)]
    if not mixed:
        return None
    group = mixed[0]
    ranks = sorted(zip(group["ranks"], group["saves"], strict=True), key=lambda item: item[0][0].rank)
    return "the ranks resumed from different points: " + "; ".join(
        f"rank {start.rank} " + (f"loaded {path}{written_words(save)}" if path else "loaded nothing (started afresh)")
        for (start, path), save in ranks
    )


def _score(planned: PlannedFault, outcome: str, why: str, **extra: Any) -> FaultScore:
    p = planned.provocation
    return FaultScore(planned.kind, p.label, outcome, p.survival, why, **extra)


def _trained_through(result: ScenarioResult) -> str:
    """Why a fault meant to end the job counts as survived all the same: every node still running at the end
    trained on after it, and nothing else failed (seen: etcd restarted behind a Swarm service's virtual IP, where
    the agents' etcd calls waited instead of failing). Empty otherwise."""
    failing = [r for r in result.verdict.results if not r.valid]
    if [r.name for r in failing] != ["fails_cleanly"]:
        return ""
    metrics = failing[0].metrics
    running = [node for node, exit in metrics.exits.items() if exit == "running"]
    if not running or sorted(metrics.trained_on or ()) != sorted(running) or len(failing[0].reasons) != len(running):
        return ""
    return f"trained on through it: the job did not end ({', '.join(running)} training at the run's end)"


def score_solo(planned: PlannedFault, result: ScenarioResult) -> FaultScore:
    run = RunModel(History(result.run_dir / FILE_NAME).read().records)
    found = [_diagnosis_dict(d) for d in diagnose(run, saved_logs(result.run_dir))]
    failing = [f"{r.name}: {'; '.join(r.reasons)}" for r in result.verdict.results if not r.valid]
    invoke = next((r for r in _fault_records(result.run_dir) if r.phase == "invoke"), None)
    if invoke is None:
        return _score(planned, "not reached", result.unfired or "the job ended first", solo=True)
    trained_on = _trained_through(result)
    return FaultScore(
        planned.kind,
        planned.provocation.label,
        "survived" if result.verdict.valid or trained_on else "failed",
        planned.provocation.survival,
        trained_on or "; ".join(failing),
        target=str(planned.step.options.given().get("target") or "") or None,
        t_fault=invoke.t,
        t_end=run.t_end,
        diagnoses=tuple(found) if failing and not trained_on else (),
        run_dir=str(result.run_dir),
        solo=True,
    )


# ---------------------------------------------------------------- running it


class _Lane:
    """One cluster's share of the vet, in order: its gauntlet (its faults one after another on one job), then
    each of its faults that end the job by design, on a short cluster of its own. The first lane runs in the
    vet's own thread (run); the others in threads (start) once the first one's job is steady: clusters starting
    up at once would slow each other. `cancel` (Ctrl-C or an error in another lane) stops a lane's run as
    Ctrl-C does, cleaning up: a lane thread's own error sets it at once, so the vet ends with that error
    (raised in the vet's thread, by raise_error) without waiting out the other lanes' faults."""

    def __init__(self, index: int, plan: Plan, docker, progress: Progress, keep: bool, cancel: threading.Event):
        self.index, self.plan, self.progress, self.keep, self.cancel = index, plan, progress, keep, cancel
        self.docker = docker
        self.scores: list[FaultScore] = []
        self.run_dirs: list[str] = []
        self.pitfalls: list[dict] = []
        self.ended_early: str | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, after: threading.Event) -> None:
        # One engine client per thread (docker-py's session is not shared across threads); a fake stays shared.
        if type(self.docker) is Docker:
            self.docker = None
        self._thread = threading.Thread(
            target=self._run_caught, args=(after,), name=f"vet-lane{self.index + 1}", daemon=False
        )
        self._thread.start()

    def join(self) -> None:
        # In short waits: a bare join() would hold off Ctrl-C (and SIGTERM) in the vet's thread until the lane ends.
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def raise_error(self) -> None:
        """This lane's own error (not the cancel another lane's error or Ctrl-C caused), if it had one."""
        if self.error is not None and not isinstance(self.error, KeyboardInterrupt):
            raise self.error

    def _run_caught(self, after: threading.Event) -> None:
        try:
            while not after.wait(0.5):
                if self.cancel.is_set():
                    return
            self.run()
        except BaseException as error:  # raised by raise_error, in the vet's own thread
            self.error = error
            self.cancel.set()  # the other lanes stop now, cleaning up: the vet ends with this error

    def run(self, fired: threading.Event | None = None) -> None:
        """`fired`: set once this lane's first job is steady (or its run ended), for the lanes waiting on it."""
        plan, spec = self.plan, self.plan.spec
        try:
            if plan.scored:
                self._gauntlet(fired)
                fired = None
            else:
                self.scores += [_score(f, "not applicable", f.why_not or "") for f in plan.faults if f.step is None]
            solos = [planned for planned in plan.faults if planned.solo]
            for planned in solos:
                if self.cancel.is_set():
                    return
                self.progress(f"[vet] {planned.kind}: it ends the job by design, so it gets a cluster of its own")
                solo = Scenario(
                    "vet-solo",
                    f"sim vet: {planned.kind}",
                    backends=(spec.rdzv_backend,),
                    profile=VET_PROFILE,
                    steps=(planned.step,),
                    # What surviving means here: the job ends fast and cleanly (restart_budget runs with every check).
                    expect=Expectation(
                        {spec.rdzv_backend: "fails"}, fail_fast_s=SOLO_FAIL_FAST_S, checkers=("fails_cleanly",)
                    ),
                    timeout_s=STEP_BUDGET_S * 3,
                )
                suffix = "-solo" if self.index == 0 else f"-solo{self.index + 1}"
                result = self._run(solo, dataclasses.replace(spec, name=f"{spec.name[:33]}{suffix}"), fired)
                fired = None
                self.run_dirs.append(str(result.run_dir))
                require_training(result.run_dir)
                self.scores.append(score_solo(planned, result))
        finally:
            if fired is not None:  # nothing ran here: the others need not wait
                fired.set()

    def _run(self, scenario: Scenario, spec: ClusterSpec, fired: threading.Event | None, **options) -> ScenarioResult:
        return ScenarioRunner(
            scenario,
            spec.rdzv_backend,
            docker=self.docker,
            progress=self.progress,
            keep=self.keep,
            spec=spec,
            cancel=self.cancel,
            fired=fired,
            **options,
        ).run()

    def _gauntlet(self, fired: threading.Event | None) -> None:
        plan, spec = self.plan, self.plan.spec
        checkers = tuple(c for c in CHECKS_FOR["recovers"] if c not in ENDING_CHECKS)
        scenario = Scenario(
            "vet",
            "sim vet: the gauntlet",
            cluster={},
            backends=(spec.rdzv_backend,),
            profile=VET_PROFILE,
            steps=plan.gauntlet,
            expect=Expectation({spec.rdzv_backend: "recovers"}, checkers=checkers),
            timeout_s=STEP_BUDGET_S * (len(plan.gauntlet) + 1),
        )
        result = self._run(
            scenario, spec, fired, stop_after=Trigger("recovered", plan.final_world), step_timeout_s=STEP_BUDGET_S
        )
        self.run_dirs.append(str(result.run_dir))
        require_training(result.run_dir)
        self.ended_early = result.unfired
        self.scores += score_gauntlet(plan, result)
        self.pitfalls = job_pitfalls(result.run_dir)


def require_training(run_dir: Path) -> None:
    """A vet whose job never trained stops here, before any fault could be scored, with one line saying why: the
    first diagnosis's first sentence (the script's last words, its error), else how its workers ended."""
    run = RunModel(History(run_dir / FILE_NAME).read().records)
    if run.trained:
        return
    found = diagnose(run, saved_logs(run_dir))
    why = found[0].title if found else no_training_reason(run)
    raise JobNeverTrainedError(
        f"the job never trained, so no fault was run: {why[0].lower() + why[1:]}; "
        f"`python -m sim report {run_dir}` shows the run"
    )


def _told(progress: Progress, plan: Plan, clusters: int) -> Progress:
    """`progress` for one cluster's lines: with others at once, each line says whose it is ("node2" is in each)."""
    if clusters == 1:
        return progress
    name = plan.spec.name
    return lambda line: progress(f"[{name}] {line}")


def run_lanes(plans: Sequence[Plan], *, docker=None, progress: Progress = print, keep: bool = False) -> list[_Lane]:
    """Each plan on a cluster of its own, all at once (the first in this thread; the others once its job is
    steady), until every lane has ended; returns the lanes, each with its scores and run folders. An error in
    one lane (or Ctrl-C) stops the others, cleaning up, and is raised here. Shared by `sim vet` (one plan per
    share of the faults) and `sim tune` (one plan per grid point)."""
    cancel = threading.Event()
    lanes = [_Lane(i, plan, docker, _told(progress, plan, len(plans)), keep, cancel) for i, plan in enumerate(plans)]
    first_steady = threading.Event()  # the other clusters start once the first one's job is steady: not all at once
    if len(lanes) > 1:
        # Most of a gauntlet is waiting (timeouts, restarts): the machine has room for a second small cluster.
        job_images(plans[0].spec, docker, progress=progress)  # built once, before two `up`s at once
    for lane in lanes[1:]:
        lane.start(after=first_steady)
    try:
        lanes[0].run(fired=first_steady)
        for lane in lanes[1:]:
            lane.join()
    except BaseException as error:
        cancel.set()
        for lane in lanes[1:]:
            lane.join()  # they end at their next poll, cleaning up
        if isinstance(error, KeyboardInterrupt):  # maybe the cancel a lane's own error set: the vet fails with it
            for lane in lanes[1:]:
                lane.raise_error()
        raise
    for lane in lanes[1:]:
        lane.raise_error()
    return lanes


def run_vet(
    spec: ClusterSpec,
    kinds: Sequence[str],
    *,
    chosen: bool = False,
    docker=None,
    progress: Progress = print,
    keep: bool = False,
    parallel: int | None = None,
) -> tuple[VetResult, tuple[Plan, ...]]:
    """Plan, run each cluster's share of the faults (`parallel` clusters at once: cluster_count), score them.
    `spec` is the job as vet_spec made it."""
    started = time.monotonic()
    clusters = cluster_count(parallel, spec)
    if clusters > 1:
        docker = docker or Docker()
        if getattr(docker, "local", False):  # this machine's memory: found before a second `up` fails mid-vet
            fit = clusters_that_fit(clusters, spec, other_clusters_memory(docker, spec.name))
            if fit < clusters:
                progress(
                    f"[vet] this machine's memory holds {fit} cluster(s) of {spec.nodes} nodes at once, not "
                    f"{clusters}: running {fit} (a smaller --memory or fewer other clusters make room)"
                )
                clusters = fit
    plans = plan_lanes(spec, kinds, chosen=chosen, clusters=clusters)
    if len(plans) > 1:
        progress(
            f"[vet] {len(kinds)} kinds on {len(plans)} clusters at once: "
            + "; ".join(f"{plan.spec.name}: {', '.join(f.kind for f in plan.faults)}" for plan in plans)
        )
    lanes = run_lanes(plans, docker=docker, progress=progress, keep=keep)
    order = {kind: i for i, kind in enumerate(kinds)}
    scores = sorted((s for lane in lanes for s in lane.scores), key=lambda s: order[s.kind])
    ended = [
        f"{lane.plan.spec.name}: {lane.ended_early}" if len(lanes) > 1 else lane.ended_early
        for lane in lanes
        if lane.ended_early
    ]
    vet = VetResult(
        str(spec.script) if spec.script else None,
        spec.rdzv_backend,
        spec.nodes,
        spec.nproc_per_node,
        tuple(scores),
        tuple(d for lane in lanes for d in lane.run_dirs),
        round(time.monotonic() - started, 1),
        "; ".join(ended) or None,
        tuple(_unique([d for lane in lanes for d in lane.pitfalls])),
        clusters=len(lanes),
    )
    return vet, plans


# ---------------------------------------------------------------- the outputs

_MARK = {"survived": "PASS", "failed": "FAIL", "not applicable": "n/a", "not reached": "MISS"}
# A recovery's phases (sim.verdict.recovery.RecoveryPhases), in words for the page.
PHASE_WORDS = {
    "detection_s": "detection",
    "rendezvous_s": "rendezvous",
    "worker_start_s": "worker start",
    "pg_init_s": "process group init",
    "ckpt_load_s": "checkpoint load",
    "first_step_s": "first step",
}


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _rate(before: float | None, after: float | None) -> str:
    if before is None and after is None:
        return "-"
    show = lambda v: "?" if v is None else f"{v:.1f}"  # noqa: E731
    return f"{show(before)}->{show(after)}"


def scorecard(vet: VetResult, width: int = 118) -> str:
    """One row per fault, one screen."""
    head = f"{'':4} {'fault':34} {'recovery':>8} {'lost':>5} {'restarts':>9} {'steps/s':>11}  note"
    lines = [
        f"sim vet: {vet.script or 'the shipped trainer'} on {vet.nodes} nodes x {vet.nproc_per_node}, "
        f"{vet.backend}, {vet.wall_s:.0f} s" + (f" on {vet.clusters} clusters at once" if vet.clusters > 1 else ""),
        head,
    ]
    for f in vet.faults:
        restarts = "-" if f.restarts is None else f"{f.restarts} ({f.restarts_used}/{f.restart_budget})"
        lost = "-" if f.steps_lost is None else str(f.steps_lost)
        note = f.why
        if f.outcome == "failed" and f.diagnoses:
            note = " / ".join(d["title"] for d in f.diagnoses[:3])
        elif f.outcome == "failed" and not f.diagnoses:
            note = f"unexplained: {f.why}"
        if f.solo and f.outcome == "survived":
            note = f.why or "ended fast and cleanly (own cluster)"
        row = f"{_MARK[f.outcome]:4} {f.label[:34]:34} {_s(f.recovery_s):>8} {lost:>5} {restarts:>9} "
        row += f"{_rate(f.throughput_before, f.throughput_after):>11}  "
        # The note in full, wrapped under its column: a MISS or FAIL says why in words, never cut off mid-word.
        wrapped = textwrap.wrap(note, max(width - len(row), 30)) or [""]
        lines.append(row + wrapped[0])
        lines += [" " * len(row) + more for more in wrapped[1:]]
    survived = sum(f.outcome == "survived" for f in vet.faults)
    failed = [f for f in vet.faults if not f.ok]
    lines.append(
        f"{'PASS' if vet.passed else 'FAIL'}: {survived} survived, {len(failed)} failed or not reached, "
        f"{sum(f.outcome == 'not applicable' for f in vet.faults)} not applicable"
    )
    failed_codes = {d["code"] for f in failed for d in f.diagnoses[:2]}
    for d in vet.pitfalls:
        if d["code"] not in failed_codes:
            lines.append(f"  pitfall of the job: {d['title']}.")
            lines += textwrap.wrap(f"Fix: {d['fix']}", width, initial_indent="    ", subsequent_indent="      ")
    if vet.job_ended_early:
        lines += textwrap.wrap(
            f"the gauntlet was cut short: {vet.job_ended_early}", width, initial_indent="  ", subsequent_indent="    "
        )
    for f in failed:
        for d in f.diagnoses[:2]:
            lines.append(f"  {f.label}: {d['title']}.")
            lines += textwrap.wrap(f"Fix: {d['fix']}", width, initial_indent="    ", subsequent_indent="      ")
        if f.evidence:
            lines.append(f"  {f.label}: unexplained; each node's last records:")
            lines += [f"    {e}"[:width] for e in f.evidence]
    return "\n".join(lines)


def junit_xml(vet: VetResult) -> str:
    """One testcase per fault: a failure carries the diagnosis, a not-applicable one is skipped with why."""
    cases = []
    for f in vet.faults:
        name = quoteattr(f"{f.kind}: {f.label}")
        body = ""
        if f.outcome in ("failed", "not reached"):
            first = f.diagnoses[0] if f.diagnoses else None
            message = f"{first['title']}. Fix: {first['fix']}" if first else f"unexplained: {f.why}"
            detail = "\n".join(
                [f.why, *(f"{d['title']}\n  cause: {d['cause']}\n  fix: {d['fix']}" for d in f.diagnoses)]
                + (["each node's last records:", *f.evidence] if f.evidence else [])
            )
            body = f"<failure message={quoteattr(message)}>{escape(detail)}</failure>"
        elif f.outcome == "not applicable":
            body = f"<skipped message={quoteattr(f.why)}/>"
        seconds = (f.t_end - f.t_fault) if f.t_fault and f.t_end else 0.0
        cases.append(f'  <testcase classname="sim.vet" name={name} time="{seconds:.1f}">{body}</testcase>')
    failures = sum(f.outcome in ("failed", "not reached") for f in vet.faults)
    skipped = sum(f.outcome == "not applicable" for f in vet.faults)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="sim vet" tests="{len(vet.faults)}" failures="{failures}" skipped="{skipped}" '
        f'time="{vet.wall_s:.1f}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )


def fault_timelines(vet: VetResult) -> dict[str, bytes]:
    """Per fault: the run's timeline picture (sim/verdict/plot.py) cropped to its window, as PNG bytes."""
    from sim.verdict.checkers import RunSpec, check_all
    from sim.verdict.plot import draw_timeline
    from sim.verdict.timeline import build_timeline, run_origin

    pictures: dict[str, bytes] = {}
    models: dict[str, tuple] = {}
    for f in vet.faults:
        if f.run_dir is None or f.t_fault is None:
            continue
        if f.run_dir not in models:
            run = RunModel(History(Path(f.run_dir) / FILE_NAME).read().records)
            expected = "fails" if f.solo else "recovers"
            only = ("fails_cleanly",) if f.solo else tuple(c for c in CHECKS_FOR["recovers"] if c not in ENDING_CHECKS)
            verdict = check_all(run, RunSpec.from_run(run, expected=expected), only=only)
            models[f.run_dir] = (run, verdict, build_timeline(run, verdict))
        run, verdict, timeline = models[f.run_dir]
        origin = run_origin(run) or 0.0
        begin = max(0.0, f.t_fault - origin - 10.0)
        end = (f.t_end or run.t_end) - origin + 5.0
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "t.png"
            draw_timeline(
                timeline,
                path,
                title=f.label,
                verdict=verdict,
                profile=VET_PROFILE,
                window=(begin, end),
                outcome=_MARK[f.outcome],  # the fault's own, not the run's: a run shared with a failed fault FAILs
                aside=shared_run_aside(f, vet, verdict),
            )
            pictures[f.kind] = path.read_bytes()
    return pictures


def shared_run_aside(fault: FaultScore, vet: VetResult, run_verdict: Verdict) -> str | None:
    """What the picture of a fault the job survived (or that did not apply) says under its title when the run it
    was struck in ended FAIL all the same: another fault of that run failed, or a check of the run did. None
    otherwise (a failed fault's run failed with it; a solo fault had its run to itself)."""
    if fault.solo or not fault.ok:
        return None
    others = [g for g in vet.faults if g.run_dir == fault.run_dir and g is not fault and not g.ok]
    why = [f"{g.label} {'failed' if g.outcome == 'failed' else 'was not reached'}" for g in others] or [
        f"its check '{r.name.replace('_', ' ')}' failed" for r in run_verdict.results if not r.valid
    ]
    return f"the run it shared ended FAIL: {'; '.join(why)}" if why else None


def render_html(vet: VetResult, pictures: Mapping[str, bytes], extra: str = "") -> str:
    """The page; `extra`: HTML sections after the scorecard's (`sim vet --forecast`'s forecast)."""
    esc = html.escape
    rows = []
    for f in vet.faults:
        phases = ", ".join(f"{PHASE_WORDS.get(k, k)} {v:.1f}s" for k, v in f.phases.items() if v is not None)
        cells = (
            _MARK[f.outcome],
            f.label,
            _s(f.recovery_s),
            phases or "-",
            "-" if f.steps_lost is None else f.steps_lost,
            "-" if f.restarts is None else f"{f.restarts} ({f.restarts_used}/{f.restart_budget})",
            _rate(f.throughput_before, f.throughput_after).replace("->", " → "),
            f.why or f.survival,
        )
        # Figures stay on one line: "7.9 → 8.1" broken after its dash read as two numbers.
        rows.append(
            "<tr>"
            + "".join(f"<td{' class=n' if i in (2, 6) else ''}>{esc(str(c))}</td>" for i, c in enumerate(cells))
            + "</tr>"
        )
    sections = []
    for f in vet.faults:
        parts = [f"<h2>{esc(_MARK[f.outcome])} {esc(f.label)} <small>({esc(f.kind)})</small></h2>"]
        parts.append(f"<p><b>Survival means:</b> {esc(f.survival)}</p>")
        if f.why:
            parts.append(f"<p><b>{esc(f.outcome.capitalize())}:</b> {esc(f.why)}</p>")
        for d in f.diagnoses:
            evidence = "".join(f"<li><code>{esc(e)}</code></li>" for e in d["evidence"])
            parts.append(
                f"<div class=diag><b>{esc(d['title'])}</b><p>{esc(d['cause'])}</p><ul>{evidence}</ul>"
                f"<p><b>Fix:</b> {esc(d['fix'])}</p></div>"
            )
        if f.evidence:
            items = "".join(f"<li><code>{esc(e)}</code></li>" for e in f.evidence)
            parts.append(f"<div class=diag><b>Unexplained: each node's last records</b><ul>{items}</ul></div>")
        if f.kind in pictures:
            data = base64.b64encode(pictures[f.kind]).decode()
            parts.append(f'<img alt="timeline of {esc(f.label)}" src="data:image/png;base64,{data}">')
        sections.append("\n".join(parts))
    if vet.pitfalls:
        items = "".join(
            f"<div class=diag><b>{esc(d['title'])}</b><p>{esc(d['cause'])}</p>"
            f"<ul>{''.join(f'<li><code>{esc(e)}</code></li>' for e in d['evidence'])}</ul>"
            f"<p><b>Fix:</b> {esc(d['fix'])}</p></div>"
            for d in vet.pitfalls
        )
        sections.insert(0, f"<h2>Pitfalls of the job</h2>{items}")
    head = "<tr>" + "".join(
        f"<th>{h}</th>"
        for h in ("", "fault", "recovery", "phases", "steps lost", "restarts (used/budget)", "steps/s", "note")
    )
    verdict = "PASS" if vet.passed else "FAIL"
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>sim vet</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:3px 6px;font-size:13px}td.n{white-space:nowrap}img{max-width:100%}"
        ".diag{background:#fff3f3;padding:6px;margin:6px 0}"
        "</style></head><body>"
        f"<h1>sim vet: {verdict}</h1><p>{esc(vet.script or 'the shipped trainer')} on {vet.nodes} nodes x "
        f"{vet.nproc_per_node} worker{'s' if vet.nproc_per_node != 1 else ''}, {esc(vet.backend)}, {vet.wall_s:.0f} s"
        + (f", {vet.clusters} clusters at once, each with its share of the faults" if vet.clusters > 1 else "")
        + "</p>"
        f"<table>{head}</tr>{''.join(rows)}</table>" + extra + "".join(sections) + "</body></html>\n"
    )


def write_outputs(
    vet: VetResult, out_dir: Path, junit: Path | None = None, forecast: Forecast | None = None
) -> dict[str, Path]:
    """vet.json, vet.html (and JUnit XML); `forecast` (sim.vet.forecast.Forecast, `sim vet --forecast`) in both."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "vet.json", "html": out_dir / "vet.html"}
    data = vet.as_dict()
    if forecast is not None:
        data["forecast"] = forecast.as_dict()
    files["json"].write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    try:
        pictures = fault_timelines(vet)
    except Exception as error:  # noqa: BLE001 (a picture that cannot be drawn must not lose the scorecard)
        pictures = {}
        print(f"[vet] timelines not drawn: {error}")
    extra = forecast_html(forecast) if forecast is not None else ""
    files["html"].write_text(render_html(vet, pictures, extra), encoding="utf-8")
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(junit_xml(vet), encoding="utf-8")
        files["junit"] = junit
    return files
