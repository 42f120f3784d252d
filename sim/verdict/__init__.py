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


@dataclasses.dataclass(frozen=True)
class CheckResult:
    name: str
    valid: bool
    reasons: tuple[str, ...] = ()  # why it failed, or notable facts when it passed
    metrics: dict = dataclasses.field(default_factory=dict)
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
