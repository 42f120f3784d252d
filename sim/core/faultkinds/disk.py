"""Disk faults: the cluster's checkpoint disk filled (fill-disk), all of it: options, inject, undo, result,
traits, provocation, Kubernetes form.

A filler file goes on the cluster's own size-limited checkpoint storage (/ckpt, a tmpfs: `ckpt_size`) until
`leave` bytes are free, so the next write fails with ENOSPC; heal removes it. The filler outlives its node's
container (the volume is shared): any running node can remove it.
"""

from __future__ import annotations

import dataclasses
import posixpath
from errno import ENOSPC

from sim.core.faultoptions import DIRECTORY, NODE_TARGET, SIZE, FaultOptions, option
from sim.core.history import FaultResult

from .base import (
    ACT_MARKER,
    Act,
    ChaosMesh,
    FaultKind,
    Provocation,
    RemoveFile,
    RequireCkptStorage,
    RunNodeScript,
    Struck,
)

CKPT_DIR = "/ckpt"  # every node's mount of the cluster's checkpoint volume
FILL_AT_MOST = 16 * 2**30  # fill-disk refuses a disk with more free than this: the host's own
_FILLER = ".sim-filler"  # the fill script's file, in the folder it fills


@dataclasses.dataclass(frozen=True)
class FillOptions(FaultOptions):
    target: str = option(
        NODE_TARGET, "the node that writes the filler (the directory is shared)", "random", positional=True
    )
    dir: str = option(
        DIRECTORY,
        "the checkpoint directory inside the nodes (shared by all); its disk must be size-limited (cluster ckpt_size)",
        CKPT_DIR,
    )
    leave: int = option(SIZE, "bytes left free, e.g. 4k", 0)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class FillResult(FaultResult):
    """What fill-disk wrote: its filler, how much, and what was left free."""

    file: str | None = None  # the filler
    written: int | None = None  # its bytes
    free: int | None = None


def _marker(at: Struck) -> str:
    return ACT_MARKER.format(f"fill-{at.node}")


def _inject(o: FillOptions, at: Struck) -> tuple[RunNodeScript, ...]:
    hint = "; give the cluster a size-limited one (ckpt_size)"
    # The filler runs on in the node if our call is interrupted: the intent names it (its marker), for heal to end.
    return (
        RunNodeScript(at.node, "fill", "filling the disk", (o.dir, o.leave, FILL_AT_MOST), act=_marker(at), hint=hint),
    )


def _k8s(o: FillOptions, target: str) -> ChaosMesh:
    return ChaosMesh(
        "IOChaos",
        {
            "volumePath": o.dir,
            "path": f"{o.dir.rstrip('/')}/**/*",
            "errno": ENOSPC,
            "percent": 100,
            "methods": ["write", "create"],
        },
        "random",  # the filled disk is every pod's
        f"fill-disk as IOChaos fault errno {ENOSPC} (ENOSPC) on every write under {o.dir}: the disk is not filled, "
        "each write fails as on a full one" + (f" (leave {o.leave} bytes is not mapped)" if o.leave else "") + ".",
        head={"action": "fault"},
    )


FILL_DISK = FaultKind(
    "fill-disk",
    undo_op="heal",
    in_force="fill",
    fills_disk=True,
    provocations={
        "fill-disk": Provocation(
            "full checkpoint disk (5 s)",
            "fill-disk",
            150,
            duration_s=5.0,
            survival="a failed write does not lose the last good checkpoint: training goes on or resumes from it",
            needs_ckpt_disk=True,
        ),
    },
    act=Act(
        verb=("fill-disk",),
        help="fill the checkpoint disk (size-limited: cluster ckpt_size) so the next write fails with ENOSPC",
        options=FillOptions,
        requires=lambda o: (RequireCkptStorage(o.dir),),
        inject=_inject,
        result_type=FillResult,
        result=lambda o, at, outcomes: FillResult(id=f"fill-{at.node}", node=at.node, **outcomes[0]),
        detail=lambda o, at: "filler being written",
        already="a filler is in place already",
        undo=lambda at: (RemoveFile(at.node, at.file or ""),),
        k8s=_k8s,
        example={"target": "node2", "leave": 4096},
        allow_etcd=False,
        args=lambda o: {"directory": o.dir, "leave": o.leave},
        # Recorded before it writes: the filler's path is the script's (the folder's .sim-filler).
        in_force_fields=lambda o, at: {"file": posixpath.join(o.dir, _FILLER), "act": _marker(at)},
        in_force_after=lambda o, at, outcomes: {
            "file": outcomes[0]["file"],
            "detail": f"{outcomes[0]['written'] >> 20} MiB filler",
        },
        undo_anywhere=lambda at: (at.file or "").startswith(CKPT_DIR + "/"),
    ),
)
KINDS = (FILL_DISK,)
