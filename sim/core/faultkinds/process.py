"""Process faults: a node's training processes (its workers, its torchrun agent), all of it: options, inject,
undo, result, traits, provocations, Kubernetes form.

The executor (sim/faults/nemesis.py) resolves what each strikes: a worker (by global rank anywhere, by local rank
or at random on its node: seeded), or the node's agent. Signals go as the node's own user: the one the agent and
workers run as (root would need CAP_KILL, and the nodes drop every capability).
"""

from __future__ import annotations

import dataclasses
from signal import SIGKILL, SIGSTOP, SIGTERM, Signals

from sim.core.faultoptions import NODE_TARGET, SIGNAL, FaultOptions, exactly_one, option, whole
from sim.core.history import FaultResult

from .base import (
    Act,
    ChaosMesh,
    ContinueWorker,
    EndsHold,
    ExecTask,
    ExhaustMemory,
    FaultKind,
    ForgetInForce,
    Held,
    PodChaos,
    Provocation,
    RemoveFile,
    Signal,
    Struck,
    Touch,
)

_REGROUP = "the others regroup without the node and train on"
_NODE_TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0"
# hang-collectives: the node image's instrumentation (elastic_sim_hang) holds a worker before its next
# collective while this file exists for its pid.
COLLECTIVE_HANG_FILE = "/tmp/elastic-sim-hang-{pid}"
OOM_HEADROOM = 64 * 2**20  # oom-worker: the node's limit, this much above its use


# ---------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True)
class WorkerOptions(FaultOptions):
    """One worker: at random on a node, or by local rank there, or by global rank anywhere."""

    target: str = option(NODE_TARGET, _NODE_TARGET_HELP, "random", positional=True)
    rank: int | None = option(whole(0, 0), "the worker with this global rank, wherever it runs")
    local_rank: int | None = option(whole(0, 0), "the worker with this local rank on the target node")

    def problem(self) -> str | None:
        return exactly_one(self, ("rank", "local_rank"), at_most=True)


@dataclasses.dataclass(frozen=True)
class KillWorkerOptions(WorkerOptions):
    signal: Signals = option(SIGNAL, "KILL, TERM, SEGV, INT, ...", SIGKILL)


@dataclasses.dataclass(frozen=True)
class KillAgentOptions(FaultOptions):
    target: str = option(NODE_TARGET, _NODE_TARGET_HELP, required=True, positional=True)
    signal: Signals = option(SIGNAL, "KILL: abrupt; TERM: torchrun's graceful path", SIGKILL)


@dataclasses.dataclass(frozen=True)
class NodeOptions(FaultOptions):
    target: str = option(NODE_TARGET, _NODE_TARGET_HELP, required=True, positional=True)


# ---------------------------------------------------------------- results (the history's ok records)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class WorkerResult(FaultResult):
    """The worker a fault hit."""

    pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class KillWorkerResult(WorkerResult):
    signal: str | None = None  # "SIGKILL"


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class HangWorkerResult(WorkerResult):
    """The worker held, and its id in force."""


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class HangCollectivesResult(WorkerResult):
    file: str | None = None  # the file that holds it


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class KillAgentResult(FaultResult):
    pid: int | None = None
    signal: str | None = None
    workers: tuple[int, ...] | None = None  # its workers' pids when it was signalled


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class ResumeResult(FaultResult):
    pids: tuple[int, ...] | None = None  # the workers continued (those not stopped ignore it)
    healed: tuple[str, ...] | None = None  # the hang faults in force on the node it ended


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class OomResult(WorkerResult):
    limit: int | None = None  # the node's memory limit while the hog ran
    allocated: int | None = None
    limit_kept: bool | None = None  # the spec's own memory (or a default one already low enough) was kept
    oom_kills: int | None = None
    hog_killed: bool | None = None


def _worker(at: Struck) -> dict:
    return {"node": at.node, "pid": at.pid, "rank": at.rank, "local_rank": at.local_rank}


def _worker_args(o: WorkerOptions) -> dict:
    return {"rank": o.rank, "local_rank": o.local_rank}


# ---------------------------------------------------------------- Kubernetes: exec Tasks in the worker's pod


def _or(value: int | None) -> int:
    return -1 if value is None else value


def _signal_worker(o: WorkerOptions, target: str, sig: Signals) -> ExecTask:
    return ExecTask("signal-worker", target, (int(sig), _or(o.rank), _or(o.local_rank)), seeded=True, rank=o.rank)


def _k8s_hang(o: WorkerOptions, target: str) -> Held:
    return Held(_signal_worker(o, target, SIGSTOP), ExecTask("continue-workers", target, rank=o.rank))


def _k8s_kill_agent(o: KillAgentOptions, target: str) -> PodChaos:
    return PodChaos(
        "container-kill",
        target,
        "PodChaos container-kill kills the whole container (agent and workers) and the kubelet restarts it; "
        "locally only the agent is signalled and the node container stays.",
        in_container=True,
    )


def _k8s_oom(o: WorkerOptions, target: str) -> ChaosMesh:
    return ChaosMesh(
        "StressChaos",
        {"stressors": {"memory": {"workers": 1, "size": "100%"}}},
        target,
        "oom-worker as StressChaos memory (size 100%): the kernel's OOM killer picks its victim in the pod, which "
        "may be the stressor rather than a worker; locally a memory limit is set first.",
        in_container=False,
        deadline_s=30.0,  # six one-shot deadlines: the stressor's while
    )


# ---------------------------------------------------------------- the kinds

KILL_WORKER = FaultKind(
    "kill-worker",
    ends_workers=True,
    provocations={
        "kill-worker": Provocation("worker crash", "kill-worker", 10, {"target": "{victim}"}, quick=True),
    },
    act=Act(
        verb=("kill-worker",),
        help="signal one training worker (SIGKILL by default)",
        options=KillWorkerOptions,
        strikes="worker",
        inject=lambda o, at: (Signal(at.node, at.pid, o.signal),),
        result_type=KillWorkerResult,
        result=lambda o, at, outcomes: KillWorkerResult(**_worker(at), signal=o.signal.name),
        detail=lambda o, at: f"rank {at.rank} signalled",
        already="",
        undo=None,
        k8s=lambda o, target: _signal_worker(o, target, o.signal),
        example={"target": "node1", "local_rank": 0, "signal": SIGTERM},
        allow_etcd=False,
        args=lambda o: {**_worker_args(o), "signal": o.signal.name},
        seeded=True,
    ),
)

KILL_AGENT = FaultKind(
    "kill-agent",
    removes_node=True,
    silences_node=True,
    ends_workers=True,
    loses_node=True,
    provocations={
        "kill-agent": Provocation(
            "agent crash", "kill-agent", 20, {"target": "{victim}"}, nodes="less", survival=_REGROUP, cost_s=21.0
        ),
    },
    act=Act(
        verb=("kill-agent",),
        help="signal the torchrun agent (KILL: abrupt; TERM: torchrun's graceful path)",
        options=KillAgentOptions,
        strikes="agent",
        inject=lambda o, at: (Signal(at.node, at.pid, o.signal),),
        result_type=KillAgentResult,
        result=lambda o, at, outcomes: KillAgentResult(
            node=at.node, pid=at.pid, signal=o.signal.name, workers=tuple(at.workers)
        ),
        detail=lambda o, at: f"agent {at.pid} signalled",
        already="",
        undo=None,
        k8s=_k8s_kill_agent,
        example={"target": "node1", "signal": SIGTERM},
        allow_etcd=False,
        args=lambda o: {"signal": o.signal.name},
        seeded=True,
    ),
)

HANG_WORKER = FaultKind(
    "hang-worker",
    undo_op="heal",
    in_force="hang",
    lives_in_node=True,
    stalls_workers=True,
    act=Act(
        verb=("hang-worker",),
        help="stop one worker process (SIGSTOP; its agent still sees it alive, its peers wait in a collective)",
        options=WorkerOptions,
        strikes="worker",
        inject=lambda o, at: (Signal(at.node, at.pid, SIGSTOP),),
        result_type=HangWorkerResult,
        result=lambda o, at, outcomes: HangWorkerResult(id=f"hang-{at.node}-{at.pid}", **_worker(at)),
        detail=lambda o, at: f"rank {at.rank} stopped",
        already="its worker is stopped already",
        # Its id names the one worker it stopped (`sim resume-worker` continues them all).
        undo=lambda at: (ContinueWorker(at.node, at.pid),),  # no pid (an intent): every worker
        k8s=_k8s_hang,
        example={"target": "node1", "local_rank": 1},
        allow_etcd=False,
        undo_needs_running=False,  # a stopped node's workers went with it
        args=_worker_args,
        seeded=True,
        in_force_id=lambda at: f"hang-{at.node}-{at.pid}",
        in_force_fields=lambda o, at: {"pid": at.pid},
        refusal=lambda at, fault_id: f"{at.node}: worker {at.pid} is stopped already",
    ),
)


def _hang_file(at: Struck) -> str:
    return COLLECTIVE_HANG_FILE.format(pid=at.pid)


HANG_COLLECTIVES = FaultKind(
    "hang-collectives",
    undo_op="heal",
    in_force="stall",
    lives_in_node=True,
    stalls_workers=True,
    provocations={
        "hang-collectives": Provocation(
            "hung collective",
            "hang-collectives",
            140,
            {"target": "{victim}"},
            survival="the process-group timeout fires and the agents restart the group",
            quick=True,
            cost_s=19.0,
        ),
    },
    act=Act(
        verb=("hang-collectives",),
        help="one worker stops calling collectives while its process runs on (a hang inside the script; instrumented)",
        options=WorkerOptions,
        strikes="worker",
        inject=lambda o, at: (Touch(at.node, _hang_file(at)),),
        result_type=HangCollectivesResult,
        result=lambda o, at, outcomes: HangCollectivesResult(
            id=f"stall-{at.node}-{at.pid}", **_worker(at), file=_hang_file(at)
        ),
        detail=lambda o, at: f"rank {at.rank} holds before its next collective",
        already="its worker is held already",
        undo=lambda at: (RemoveFile(at.node, at.file or ""),),
        k8s=lambda o, target: ExecTask("stall-worker", target, seeded=True),
        example={"target": "node1", "rank": 1},
        allow_etcd=False,
        undo_needs_running=False,  # the file went with a stopped node's worker
        args=_worker_args,
        seeded=True,
        in_force_id=lambda at: f"stall-{at.node}-{at.pid}",
        in_force_fields=lambda o, at: {"file": _hang_file(at)},
        refusal=lambda at, fault_id: f"{at.node}: worker {at.pid} is held already",
    ),
)

RESUME_WORKER = FaultKind(
    "resume-worker",
    undoes=True,
    resumes_workers=True,
    undoes_in_force="hang",
    act=Act(
        verb=("resume-worker",),
        help="continue the stopped workers of a node (SIGCONT)",
        options=NodeOptions,
        inject=lambda o, at: (ContinueWorker(at.node, None, strict=True), ForgetInForce(at.node, "hang")),
        result_type=ResumeResult,
        result=lambda o, at, outcomes: ResumeResult(node=at.node, pids=tuple(outcomes[0]), healed=tuple(outcomes[1])),
        detail=lambda o, at: "its workers continued",
        already="",
        undo=None,
        k8s=lambda o, target: EndsHold(),
        example={"target": "node2"},
        allow_etcd=False,
    ),
)

OOM_WORKER = FaultKind(
    "oom-worker",
    ends_workers=True,
    ooms_worker=True,
    act=Act(
        verb=("oom-worker",),
        help="the kernel's OOM killer kills one worker (a memory limit on its node, then memory pressure)",
        options=WorkerOptions,
        strikes="worker",
        inject=lambda o, at: (ExhaustMemory(at.node, at.pid, OOM_HEADROOM),),
        result_type=OomResult,
        result=lambda o, at, outcomes: OomResult(**_worker(at), **outcomes[0]),
        detail=lambda o, at: f"rank {at.rank} out of memory",
        already="",
        undo=None,
        k8s=_k8s_oom,
        example={"target": "random", "rank": 2},
        allow_etcd=False,
        args=_worker_args,
        seeded=True,
    ),
)

KINDS = (KILL_WORKER, KILL_AGENT, HANG_WORKER, HANG_COLLECTIVES, RESUME_WORKER, OOM_WORKER)
