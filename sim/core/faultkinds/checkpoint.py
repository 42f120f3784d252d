"""Checkpoint faults: the newest checkpoint damaged (corrupt-checkpoint), its writer killed or frozen mid-write
(kill-during-checkpoint, freeze-during-checkpoint), all of it: options, inject, undo, result, traits,
provocation, Kubernetes form.

The write faults wait for the node's worker to open a file under the checkpoint directory for writing and act
the moment it does: a kill inside a checkpoint write by design, not by luck. A frozen writer finishes its write
late, as a zombie's, once healed (the node unpaused, the worker continued).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from signal import SIGKILL, SIGSTOP, Signals

from sim.core.faultoptions import DIRECTORY, NODE_TARGET, SECONDS, SIGNAL, FaultOptions, OptionKind, option
from sim.core.history import FaultResult

from .base import (
    ACT_MARKER,
    Act,
    CatchWriter,
    ContinueWorker,
    ExecTask,
    FaultKind,
    Provocation,
    RunNodeScript,
    Struck,
)

CKPT_DIR = "/ckpt"  # every node's mount of the cluster's checkpoint volume
CORRUPTIONS = ("bitflip", "truncate")
CORRUPTION = OptionKind("corruption", str, lambda v: v in CORRUPTIONS, "bitflip or truncate")
_CKPT_DIR_HELP = "the checkpoint directory inside the nodes (shared by all)"
_CORRUPTING = "corrupting a checkpoint"


@dataclasses.dataclass(frozen=True)
class CorruptOptions(FaultOptions):
    target: str = option(
        NODE_TARGET, "the node that writes the damage (the directory is shared)", "random", positional=True
    )
    mode: str = option(CORRUPTION, "bitflip: flip a bit in 8 random bytes; truncate: cut to half its length", "bitflip")
    dir: str = option(DIRECTORY, _CKPT_DIR_HELP, CKPT_DIR)


@dataclasses.dataclass(frozen=True)
class InWriteOptions(FaultOptions):
    target: str = option(NODE_TARGET, "the node whose worker writes checkpoints", "rank0", positional=True)
    dir: str = option(DIRECTORY, _CKPT_DIR_HELP, CKPT_DIR)
    within: float = option(SECONDS, "how long to wait for a write", 60.0)


@dataclasses.dataclass(frozen=True)
class KillInWriteOptions(InWriteOptions):
    signal: Signals = option(SIGNAL, "KILL, TERM, ...", SIGKILL)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class CorruptResult(FaultResult):
    """The node that damaged the newest checkpoint, and what its script reports of the damage (the mode's own
    facts stay in `extra`). The checkpoint kinds' results are parsed from their node script's report, kept as
    written."""

    file: str | None = None
    size: int | None = None
    mode: str | None = None  # bitflip | truncate


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class KillInWriteResult(FaultResult):
    """The writer signalled: its pid, the file it wrote and that file's size at the signal."""

    signal: str | None = None
    pid: int | None = None
    file: str | None = None
    size_at_kill: int | None = None
    # The file was gone at the signal (its size recorded as None): renamed into place, whole, between the
    # trigger seeing it open and the signal.
    gone_at_kill: bool = False

    @classmethod
    def _derived(cls, data: Mapping) -> dict:
        return {"gone_at_kill": "size_at_kill" in data and data["size_at_kill"] is None}


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class FreezeResult(FaultResult):
    """The writer frozen: its pid and the file it holds open."""

    pid: int | None = None
    file: str | None = None


def _marker(at: Struck) -> str:
    return ACT_MARKER.format(f"freeze-{at.node}")


CORRUPT_CHECKPOINT = FaultKind(
    "corrupt-checkpoint",
    damages_checkpoint=True,
    act=Act(
        verb=("corrupt-checkpoint",),
        help="flip bits in, or truncate, the newest checkpoint file",
        options=CorruptOptions,
        inject=lambda o, at: (RunNodeScript(at.node, "corrupt", _CORRUPTING, (o.dir, o.mode), seeded=True),),
        result_type=CorruptResult,
        result=lambda o, at, outcomes: CorruptResult.parse({"node": at.node, **outcomes[0]}),
        detail=lambda o, at: f"{o.mode} of the newest checkpoint",
        already="",
        undo=None,
        k8s=lambda o, target: ExecTask("corrupt", target, (o.dir, o.mode), seeded=True),
        example={"target": "node0", "mode": "truncate", "dir": "/data/ckpt"},
        allow_etcd=False,
        args=lambda o: {"mode": o.mode, "directory": o.dir},
        seeded=True,
    ),
)

KILL_DURING_CHECKPOINT = FaultKind(
    "kill-during-checkpoint",
    ends_workers=True,
    damages_checkpoint=True,
    strikes_in_write=True,
    provocations={
        "kill-during-checkpoint": Provocation(
            "kill during a checkpoint write",
            "kill-during-checkpoint",
            160,
            {"target": "rank0", "within": 30.0},
            survival="the half-written file is never loaded: the job resumes from the previous checkpoint",
            cost_s=7.0,
        ),
    },
    act=Act(
        verb=("kill-during-checkpoint",),
        help="signal the worker that writes a checkpoint, the moment it opens the file",
        options=KillInWriteOptions,
        strikes="writer",
        inject=lambda o, at: (CatchWriter(at.node, o.dir, at.left or o.within, o.signal),),
        result_type=KillInWriteResult,
        result=lambda o, at, outcomes: KillInWriteResult.parse(
            {"node": at.node, "signal": o.signal.name, **outcomes[0]}
        ),
        detail=lambda o, at: "its writer signalled",
        already="",
        undo=None,
        k8s=lambda o, target: ExecTask("kill-in-write", target, (o.dir, o.within, int(o.signal))),
        example={"target": "rank0", "within": 30.0},
        allow_etcd=False,
        args=lambda o: {"directory": o.dir, "within": o.within, "signal": o.signal.name},
    ),
)

FREEZE_DURING_CHECKPOINT = FaultKind(
    "freeze-during-checkpoint",
    undo_op="heal",
    in_force="freeze",
    silences_node=True,
    lives_in_node=True,
    freezes_node=True,
    holds_write_open=True,
    act=Act(
        verb=("freeze-during-checkpoint",),
        help="freeze a node while its worker writes a checkpoint (SIGSTOP at the open, then docker pause); "
        "heal lets the write finish late, as a zombie's",
        options=InWriteOptions,
        strikes="writer",
        # The intent first: the watcher stops a worker in the node, and goes on doing so if our call is
        # interrupted; heal ends the watcher, unpauses the node and continues its workers.
        inject=lambda o, at: (CatchWriter(at.node, o.dir, at.left or o.within, SIGSTOP, _marker(at), True),),
        result_type=FreezeResult,
        result=lambda o, at, outcomes: FreezeResult.parse({"id": f"freeze-{at.node}", "node": at.node, **outcomes[0]}),
        detail=lambda o, at: "waiting for a checkpoint write",
        already="already frozen",
        undo=lambda at: (ContinueWorker(at.node, at.pid),),  # an intent knows no pid yet: every worker
        k8s=lambda o, target: None,  # no Chaos Mesh primitive, no exec form
        example={"target": "rank0", "within": 30.0},
        allow_etcd=False,
        undo_needs_running=False,  # its node's processes went with a stopped node
        args=lambda o: {"directory": o.dir, "within": o.within},
        in_force_fields=lambda o, at: {"act": _marker(at)},
        in_force_after=lambda o, at, outcomes: {
            "pid": outcomes[0]["pid"],
            "detail": f"frozen while pid {outcomes[0]['pid']} writes {outcomes[0]['file']}",
        },
    ),
)

KINDS = (CORRUPT_CHECKPOINT, KILL_DURING_CHECKPOINT, FREEZE_DURING_CHECKPOINT)
