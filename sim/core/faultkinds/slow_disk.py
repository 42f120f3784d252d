"""slow-disk: a node's checkpoint writes throttled, all of it: options, inject, undo, result, traits, provocation,
Chaos Mesh form.

The node's container gets a block-I/O limit on the disk under its checkpoint mount (its cgroup's write
throttle, what `docker run --device-write-bps` sets; the engine cannot change that on a running container, so
the executor writes the cgroup's file: LimitWrites). What the limit slows is what reaches the disk from the
node's own processes: a save that is flushed and fsynced (torch.distributed.checkpoint's FileSystemWriter
does; a careful torch.save does), direct I/O. A buffered write that nobody syncs lands in the page cache at
full speed (cgroup v1 charges its writeback to no container). The limit lives in the container's cgroup: a
stop, kill or restart of the node ends it.
"""

from __future__ import annotations

import dataclasses

from sim.core.faultoptions import NODE_TARGET, SIZE, FaultOptions, option
from sim.core.history import FaultResult

from .base import Act, ChaosMesh, FaultKind, LimitWrites, Provocation

CKPT_DIR = "/ckpt"  # every node's mount of the cluster's checkpoint volume


@dataclasses.dataclass(frozen=True)
class SlowDiskOptions(FaultOptions):
    target: str = option(
        NODE_TARGET, "a node (node0, ...), or random (seeded), store-host, rank0", required=True, positional=True
    )
    write_rate: int = option(SIZE, "bytes a second its checkpoint writes get, e.g. 1m", required=True)

    def problem(self) -> str | None:
        return None if self.write_rate else "write_rate 0: no throttle; give bytes a second, e.g. 1m"


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class SlowDiskResult(FaultResult):
    """What slow-disk did: the node whose writes under the checkpoint mount are throttled, and to what."""

    write_rate: int | None = None  # bytes a second
    dir: str | None = None


def _k8s(o: SlowDiskOptions, target: str) -> ChaosMesh:
    return ChaosMesh(
        "IOChaos",
        {
            "action": "latency",
            "volumePath": CKPT_DIR,
            "path": f"{CKPT_DIR}/**/*",
            "delay": "100ms",
            "percent": 100,
            "methods": ["write", "fsync"],
        },
        target,
        f"slow-disk ({o.write_rate} bytes/s on {CKPT_DIR}) as IOChaos latency 100ms on every write and fsync under "
        f"{CKPT_DIR}: Chaos Mesh delays each call instead of limiting the bandwidth.",
    )


SLOW_DISK = FaultKind(
    "slow-disk",
    undo_op="heal",
    in_force="slow-disk",
    degrading=True,
    lives_in_node=True,
    provocations={
        "slow-disk": Provocation(
            "slow checkpoint disk (1 MiB/s, 10 s)",
            "slow-disk",
            170,
            {"target": "{victim}", "write_rate": 2**20},
            duration_s=10.0,
            survival="checkpoint saves slow down, nothing fails: steps go on",
            default=False,
        ),
    },
    act=Act(
        verb=("slow-disk",),
        help="throttle a node's checkpoint writes (its cgroup's block-I/O limit on the disk under /ckpt)",
        options=SlowDiskOptions,
        inject=lambda o, at: (LimitWrites(at.node, CKPT_DIR, o.write_rate),),
        result_type=SlowDiskResult,
        result=lambda o, at, outcomes: SlowDiskResult(
            id=f"slow-disk-{at.node}", node=at.node, write_rate=o.write_rate, dir=CKPT_DIR
        ),
        detail=lambda o, at: f"writes to {CKPT_DIR} at {o.write_rate} bytes/s",
        already="its checkpoint writes are throttled already",
        undo=lambda at: (LimitWrites(at.node, CKPT_DIR, 0),),
        k8s=_k8s,
        example={"target": "node1", "write_rate": 2**20},
        allow_etcd=False,
        undo_needs_running=False,  # a stopped node's cgroup went with it, and its limit
    ),
)
KINDS = (SLOW_DISK,)
