"""What checkers return: plain frozen data, shared by checkers, report and runner.

The history these are computed from is a list of typed records (sim/core/history.py; one JSONL line
each), all with "t" (unix seconds, one clock) and a type; as written:

  {"type": "run", "event": "start"|"end", "spec": {...ClusterSpec fields...}, "profile": "fast"|"torch-defaults",
   "target_steps": int|None, "ckpt_interval": int|None}
  {"type": "trainer", "node": "node0", "kind": "start"|"progress"|"checkpoint"|"summary"|"warning",
   "rank", "local_rank", "world_size", "restart", "run_id",
   progress: "step", "epoch", "loss";  start: "resumed_from", "ckpt_world_size", "backend";
   checkpoint: "step", "path";  summary: "final_step", "elapsed", "steps_run_this_start";  warning: "message"}
  {"type": "agent", "node", "event": ...} with event one of
     "rdzv_joined"   round, group_rank, nodes           (the node joined round N as rank R of W nodes)
     "rdzv_complete" restart_count, group_rank, group_world_size, global_world_size (trainers)
     "group_failed"  attempts_left, max_restarts        (torch: "Worker group FAILED. k/m attempts left")
     "worker_failed" local_rank, exitcode, pid          (a worker process failed)
     "new_nodes"     count                              (membership change; the agent restarts its group)
     "group_started"                                     (the agent is spawning this round's workers)
     "group_finished"                                    (this agent's workers all exited 0)
     "keepalive_failed" | "rdzv_closed" | "rdzv_timeout" | "rdzv_error" (message)
     "rdzv_close_failed" message                         (the agent's shutdown could not close the rendezvous)
     "error_file"    message                            (the @record error-file contents torchrun printed)
     "rdzv_joining"                                      (the agent starts a rendezvous: "Rendezvous'ing worker group")
     "rdzv_graceful_exit" message                        (the rendezvous closed after the job finished)
     "worker_error"  kind, message                      (a worker's error line, once per kind: gloo_connect,
                                                         timeout, peer_lost, backend, disk_full, checkpoint_unreadable)
     "exception"     name, message                      (the agent's own AttributeError / etcd.Etcd* exception)
     "worker_exception" name, message, frame, source     (a traceback's exception, and its last frame in the
                                                         user's own files: "path:line in func" and its source line)
     "agent_signal"  signal                             (the agent was signalled)
  {"type": "worker", "node", "event": "start"|"step"|"activity"|"progress"|"exit", "rank", "local_rank",
   "world_size", "restart", "pid", "run_id", step: "n", "step"; activity: "collectives", "op";
   progress: "step", "loss", "source" ("api"|"log": log lines carry no rank); exit: "code"}
     (the node image's instrumentation, through its side channel; see sim/core/sidechannel.py)
  {"type": "docker", "node", "action": "create"|"start"|"die"|"kill"|"stop"|"pause"|"unpause"|"oom"|"destroy"|
   "network_connect"|"network_disconnect", "exit_code"?: int, "signal"?: str}
  {"type": "fault", "op", "fault", "target", "phase": "invoke"|"ok"|"fail"|"info", "args"|"result"|"error"}
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    valid: bool
    reasons: tuple[str, ...]  # why it failed, or notable facts when it passed
    metrics: Metrics  # the checker's own figures (a Metrics class per checker, below)
    # False: this run cannot be judged on this (the reasons say why, and how to enable it);
    # such a result is valid, so it neither passes nor fails the run, and the report says so.
    measured: bool = True


@dataclasses.dataclass(frozen=True)
class FaultRecovery:
    op: str
    fault: str
    target: str | None
    t_fault: float  # when the fault's `ok` record was written
    t_recovered: float | None  # first progress step at the post-fault world size; None: never
    recovery_s: float | None
    steps_lost: int | None  # highest step before the fault minus the step training resumed from
    world_before: int | None
    world_after: int | None
    throughput_before: float | None = None  # steps/s over the 10 s before the fault
    throughput_after: float | None = None  # steps/s over the 10 s after the recovery
    # A fault that slows training without stopping it (a straggler): no restart, so nothing to recover
    # from; recovery_s is None, and the steps/s while it was in force tell its cost.
    degraded: bool = False
    throughput_during: float | None = None
    # Compound faults: this fault struck while the named earlier fault's regroup was still going on
    # ("kill-worker node1"), or the named later fault struck during this one's regroup.
    struck_during: str | None = None
    regroup_cut_by: str | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    valid: bool
    expected: str  # "recovers" | "fails" | "hangs"
    results: tuple[CheckResult, ...]
    recoveries: tuple[FaultRecovery, ...]
    restarts_per_node: dict  # node -> restarts used (torch counts per agent)
    rounds: int  # rendezvous rounds seen
    # Nothing could see whether the job trained (no instrumentation, no progress lines) and nothing else failed:
    # the verdict is neither PASS nor FAIL but CANNOT TELL (valid is False: never a pass).
    undetermined: bool = False

    def result(self, name: str) -> CheckResult | None:
        return next((r for r in self.results if r.name == name), None)

    @property
    def word(self) -> str:
        """PASS, FAIL, or CANNOT TELL."""
        if self.undetermined:
            return CANNOT_TELL
        return "PASS" if self.valid else "FAIL"


CANNOT_TELL = "CANNOT TELL"


# How the report words each expected outcome.
EXPECTED_WORDS = {"recovers": "the job recovers", "fails": "the job fails", "hangs": "the job hangs"}


# ---------------------------------------------------------------- each checker's metrics


@dataclasses.dataclass(frozen=True)
class Metrics:
    """A checker's figures, one frozen class per checker; each field is checked against its type when made.
    to_json() is the check's "metrics" in report.json (a field named in OMITTED_WHEN_NONE is left out while None)."""

    OMITTED_WHEN_NONE: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not _conforms(value, hints[field.name]):
                raise TypeError(f"{type(self).__name__}.{field.name} {value!r}: not a {hints[field.name]}")

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        return {k: v for k, v in data.items() if not (v is None and k in self.OMITTED_WHEN_NONE)}


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _conforms(value: object, hint: object) -> bool:
    """Whether `value` is of the (simple) type `hint`: a class, X | None, tuple[X, ...], dict[K, V]."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if origin is tuple:
        return isinstance(value, tuple) and all(_conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
        )
    if hint is type(None):
        return value is None
    if hint in (int, float):  # a whole number is a float too; a bool is neither
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class TrainedMetrics(Metrics):
    training_seen: bool
    first_training_t: float | None


@dataclasses.dataclass(frozen=True)
class CompletedMetrics(Metrics):
    final_step: int | None
    excused_nodes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RestartBudgetMetrics(Metrics):
    per_node: dict[str, int]  # node -> restarts used (torch counts them per agent)


@dataclasses.dataclass(frozen=True)
class WorldSizeMetrics(Metrics):
    world_sizes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RanksMetrics(Metrics):
    cohorts: int


@dataclasses.dataclass(frozen=True)
class ProgressMetrics(Metrics):
    steps_lost: dict[str, int | None]  # fault op -> steps lost
    final_step: int | None
    step_source: str
    step_efficiency: float | None
    zombie_records: int


@dataclasses.dataclass(frozen=True)
class LossContinuityMetrics(Metrics):
    relative_jumps: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class CheckpointIntegrityMetrics(Metrics):
    damaged_steps: tuple[int, ...]  # the shipped trainer's checkpoints: by step


@dataclasses.dataclass(frozen=True)
class CheckpointFilesMetrics(Metrics):
    damaged_files: tuple[str, ...]  # any script's checkpoints: by the file the fault damaged


@dataclasses.dataclass(frozen=True)
class StaleCheckpointMetrics(Metrics):
    stale_writes: int
    lost: int


@dataclasses.dataclass(frozen=True)
class SingleGroupMetrics(Metrics):
    split_groups: int


@dataclasses.dataclass(frozen=True)
class HangMetrics(Metrics):
    longest_gap_s: float | None


@dataclasses.dataclass(frozen=True)
class RecoveryMetrics(Metrics):
    recoveries: tuple[FaultRecovery, ...]  # report.json writes them as objects


@dataclasses.dataclass(frozen=True)
class AgentEnd(Metrics):
    """How one agent's exit followed the faults: the fault before it, and how long after."""

    after_op: str | None
    delay_s: float  # after the fault's ok (or the run's start)
    since_invoke_s: float | None


@dataclasses.dataclass(frozen=True)
class FailsCleanlyMetrics(Metrics):
    OMITTED_WHEN_NONE: ClassVar[tuple[str, ...]] = ("trained_on",)

    exits: dict[str, str]  # node -> "exited 1" | "running"
    ended: dict[str, AgentEnd]
    # Nodes still running at the end and training on after the last fault: the job survived it, not hung
    trained_on: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class StalledMetrics(Metrics):
    OMITTED_WHEN_NONE: ClassVar[tuple[str, ...]] = ("after_op",)

    stalled_s: float | None
    after_op: str | None = None  # the last fault, after which it went quiet
