"""The diagnoses' registry (DIAGNOSES, in order: the root cause first) and `diagnose`, which runs them.

A diagnosis is a pure function of a run, like a checker: the history records (as in
sim/verdict/__init__.py) and each node's container log text (`docker logs --timestamps` form, as saved
in runs/NAME-RUNID/logs/; plain text without timestamps works too) go in, and out comes the
cause, the evidence (records or log lines, each with its node and time) and the fix in plain
words, or nothing. Each one is unit-tested on logs captured from real torchrun 2.13 runs
(tests/data/logs/).

Where a node's log is given, its agent and trainer records are read from the log (the whole
story, with the lines the collector may not have reached); otherwise from the history.
Everything else (the run's spec, faults, Docker events, worker side-channel records) comes
from the history.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence

from sim.core.agentlog import parse_node_log
from sim.core.history import AgentRecord, TrainerRecord
from sim.verdict.diagnoses.collectives import (
    NCCL_DEFAULT_TIMEOUT_S,
    init_peer_lost,
    nccl_dead_peer,
    process_group_timeout,
    stuck_at_exit,
)
from sim.verdict.diagnoses.evidence import (
    Diagnosis,
    _clip,
)
from sim.verdict.diagnoses.rendezvous import (
    c10d_store_lost,
    clock_skew,
    engine_lost,
    etcd_lost,
    etcd_without_v2,
    last_call_wait,
    late_join_at_end,
    lost_before_ranks,
    name_resolution,
    shared_tcp_store,
    spare_agent_exit,
    waiting_for_nodes,
)
from sim.verdict.diagnoses.resources import (
    damaged_checkpoint_loaded,
    disk_full,
    loss_jump,
    oom_kill,
    superseded_round_checkpoint,
)
from sim.verdict.diagnoses.script import (
    ended_without_training,
    restart_budget,
    script_error,
    trained_through,
)
from sim.verdict.pitfalls import PITFALLS, Finding
from sim.verdict.recovery import LOSS_JUMP_TOLERANCE
from sim.verdict.runmodel import RunModel

MAX_EVIDENCE_CHARS = 300
__all__ = ["DIAGNOSES", "NCCL_DEFAULT_TIMEOUT_S", "Diagnosis", "diagnose", "format_diagnoses"]


def diagnose(
    run: RunModel | Sequence[Mapping], logs: Mapping[str, str], loss_jump_tolerance: float = LOSS_JUMP_TOLERANCE
) -> list[Diagnosis]:
    """Every known cause the run shows, most fundamental first (the loss judged as the
    loss_continuity checker judges it, at the same tolerance)."""
    run = _with_logs(run if isinstance(run, RunModel) else RunModel(run), logs)

    def apply(rule: Callable[..., Diagnosis | None]) -> Diagnosis | None:
        if rule is loss_jump:
            return rule(run, loss_jump_tolerance)
        if rule in QUOTES_LOGS:
            return rule(run, dict(logs))
        return rule(run)

    found = map(apply, DIAGNOSES)
    return [diagnosis for diagnosis in found if diagnosis is not None]


def format_diagnoses(diagnoses: Sequence[Diagnosis], width: int = 100) -> str:
    """The diagnoses as a terminal block; empty when there are none."""
    lines = []
    for number, found in enumerate(diagnoses, 1):
        lines.append(f"Diagnosis {number}/{len(diagnoses)} [{found.code}]: {found.title}")
        lines += _field("cause", found.cause, width)
        for index, item in enumerate(found.evidence):
            wrapped = textwrap.wrap(_clip(item, MAX_EVIDENCE_CHARS), width - 12, subsequent_indent="    ")
            lines += [f"  {'evidence:' if index == 0 and i == 0 else '':<10}{line}" for i, line in enumerate(wrapped)]
        lines += _field("fix", found.fix, width)
    return "\n".join(lines)


def _field(name: str, text: str, width: int) -> list[str]:
    wrapped = textwrap.wrap(text, width - 12) or [""]
    return [f"  {name + ':' if i == 0 else '':<10}{line}" for i, line in enumerate(wrapped)]


def _with_logs(run: RunModel, logs: Mapping[str, str]) -> RunModel:
    """The run with each logged node's agent and trainer records read from its log instead."""
    if not logs:
        return run
    kept = [r for r in run.all_records if not (isinstance(r, (AgentRecord, TrainerRecord)) and r.node in logs)]
    return RunModel(
        [*kept, *(r for node, text in logs.items() for r in parse_node_log(node, text))],
        skipped_lines=run.skipped_lines,
    )


# Most fundamental first: a cause before the budget it burned, the budget before what followed.
def _pitfall(rule: Callable[[RunModel], Finding | None]) -> Callable[[RunModel], Diagnosis | None]:
    """A pitfall of the job's own (sim/verdict/pitfalls.py) as a diagnosis."""

    def diagnosis(run: RunModel) -> Diagnosis | None:
        found = rule(run)
        return found and Diagnosis(found.code, found.title, found.cause, found.evidence, found.fix)

    diagnosis.__name__ = rule.__name__
    return diagnosis


# The job's own pitfalls first: a script that resumes its ranks from different points fails whatever else happened.
DIAGNOSES: tuple[Callable[..., Diagnosis | None], ...] = (
    script_error,
    ended_without_training,
    trained_through,
    *map(_pitfall, PITFALLS),
    engine_lost,
    name_resolution,
    etcd_without_v2,
    clock_skew,
    shared_tcp_store,
    c10d_store_lost,
    etcd_lost,
    disk_full,
    oom_kill,
    damaged_checkpoint_loaded,
    superseded_round_checkpoint,
    init_peer_lost,
    process_group_timeout,
    nccl_dead_peer,
    loss_jump,
    restart_budget,
    lost_before_ranks,
    waiting_for_nodes,
    spare_agent_exit,
    late_join_at_end,
    stuck_at_exit,
    last_call_wait,
)
# Rules that quote the script's own output: they read the nodes' logs as text.
QUOTES_LOGS = (ended_without_training,)
