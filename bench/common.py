"""What the benchmarks share: the trainer's JSON lines, and bare `torchrun` processes on the host
run with exactly the settings a sim node gets (its command line from sim.core.torchrun, its environment
from compose/cluster.yaml's x-node and the spec)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.core.paths import TRAINER_DIR  # noqa: E402
from sim.core.spec import ClusterSpec  # noqa: E402
from sim.core.torchrun import torchrun_argv  # noqa: E402

# compose/cluster.yaml's x-node environment, less what only the node image reads (SIM_*).
NODE_ENV = {"LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
RECORD_START = '{"sim": '


def quiet(_: str) -> None:
    pass


def trainer_records(lines: Iterable[str]) -> list[dict]:
    """The trainer's JSON records (trainer/train.py emit()) among a process's output lines."""
    found = []
    for line in lines:
        start = line.find(RECORD_START)
        if start >= 0:
            try:
                found.append(json.loads(line[start:]))
            except json.JSONDecodeError:
                pass  # a line cut by a kill
    return found


def save_results(path: Path, key: str, rows: list[dict], same: Callable[[dict], tuple] | None = None) -> None:
    """Write `rows` as `key` of a results file (bench/results.json: one list of rows per benchmark),
    keeping the other benchmarks' rows. With `same` (what a row measures: figure, backend, profile),
    the rows replace only the file's rows of the same measures, in place, and the rest are kept: a run
    of some figures leaves the others' latest figures there."""
    found = json.loads(path.read_text()) if path.exists() else {}
    if same is not None:
        mine = {same(row): row for row in rows}
        kept = [mine.pop(same(row)) if same(row) in mine else row for row in found.get(key, [])]
        rows = kept + list(mine.values())
    path.write_text(json.dumps({**found, key: rows}, indent=2) + "\n")


def print_columns(lines: list[tuple[str, ...]]) -> None:
    """Print rows of cells (the first: the heading) as left-aligned columns."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_torchrun_argv(spec: ClusterSpec, node_index: int, endpoint: str, rdzv_id: str) -> list[str]:
    """A sim node's torchrun command (sim.core.torchrun) for a process on this host: this Python's torchrun,
    the repository's trainer, and `endpoint` (host:port) for the store or etcd. Nothing else changes."""
    argv = torchrun_argv(spec, node_index, rdzv_id)
    if "--rdzv-endpoint" in argv:
        argv[argv.index("--rdzv-endpoint") + 1] = endpoint
    argv[argv.index(spec.script_in_node)] = str(TRAINER_DIR / "train.py")
    return [sys.executable, "-m", "torch.distributed.run", *argv[1:]]


def bare_env(spec: ClusterSpec, environ: dict[str, str], ckpt_dir: Path) -> dict[str, str]:
    """A sim node's environment for a process on this host (SIM_CKPT_DIR: the trainer's checkpoints)."""
    return {**environ, **NODE_ENV, "SIM_CKPT_DIR": str(ckpt_dir), **dict(spec.env)}
