"""A node's process table: which process is the torchrun agent and which are its workers (and their ranks).

One `docker exec` runs PROBE with the node's own python3 and prints one JSON
line per process; `parse_probe` turns that into data. Ranks come from each
worker's environment (RANK, LOCAL_RANK, GROUP_RANK), which torchrun sets.
"""

from __future__ import annotations

import dataclasses
import json

from sim.core.errors import FaultError

# Runs inside the node as the training user (the owner of every process whose environ it reads). Stdlib only.
PROBE = r"""
import json, os
for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):
    try:
        with open(f'/proc/{pid}/stat') as f:
            ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            args = [a.decode(errors='replace') for a in f.read().split(b'\0') if a]
        with open(f'/proc/{pid}/environ', 'rb') as f:
            env = dict(kv.decode(errors='replace').split('=', 1) for kv in f.read().split(b'\0') if b'=' in kv)
    except (OSError, ValueError, IndexError):
        continue
    names = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE', 'TORCHELASTIC_RESTART_COUNT')
    keep = {k: env[k] for k in names if k in env}
    print(json.dumps({'pid': pid, 'ppid': ppid, 'args': args, 'env': keep}))
"""
PROBE_ARGV = ["python3", "-c", PROBE]


@dataclasses.dataclass(frozen=True)
class Worker:
    pid: int
    rank: int
    local_rank: int
    group_rank: int | None
    world_size: int | None


@dataclasses.dataclass(frozen=True)
class NodeProcesses:
    agent_pid: int | None
    workers: tuple[Worker, ...]

    def worker(self, *, rank: int | None = None, local_rank: int | None = None) -> Worker | None:
        for w in self.workers:
            if (rank is None or w.rank == rank) and (local_rank is None or w.local_rank == local_rank):
                return w
        return None

    @property
    def group_rank(self) -> int | None:
        ranks = {w.group_rank for w in self.workers if w.group_rank is not None}
        return ranks.pop() if len(ranks) == 1 else None


def _is_agent(args: list[str]) -> bool:
    # `python -m torch.distributed.run` or the `torchrun` console script; docker-init's
    # own argv also names torchrun, so the interpreter must be the one running it.
    text = " ".join(args)
    return bool(args) and "python" in args[0] and ("torch.distributed.run" in text or "/torchrun" in text)


def parse_probe(output: str) -> NodeProcesses:
    rows = []
    for line in output.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not rows:
        raise FaultError(f"could not read the node's process table: {output.strip()[:200] or 'no output'}")
    agents = [r["pid"] for r in rows if _is_agent(r["args"])]
    agent = min(agents) if agents else None
    workers = []
    for r in rows:
        env = r["env"]
        if r["ppid"] == agent and "RANK" in env and "LOCAL_RANK" in env:
            workers.append(
                Worker(
                    pid=r["pid"],
                    rank=int(env["RANK"]),
                    local_rank=int(env["LOCAL_RANK"]),
                    group_rank=int(env["GROUP_RANK"]) if "GROUP_RANK" in env else None,
                    world_size=int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None,
                )
            )
    return NodeProcesses(agent, tuple(sorted(workers, key=lambda w: w.rank)))
