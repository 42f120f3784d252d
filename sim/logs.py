"""Following a running job in the terminal: agent lines as they are, trainer
progress compacted (rank 0, every tenth step) so a person can read along."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Iterable, TextIO

from .cluster import Cluster

COMPACT_EVERY = 10


def compact(lines: Iterable[str], every: int = COMPACT_EVERY) -> Iterable[str]:
    for line in lines:
        start = line.find('{"sim"')
        if start < 0:
            yield line
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            yield line
            continue
        kind = record.get("sim")
        if kind == "progress":
            if record.get("rank") == 0 and record.get("step", 0) % every == 0:
                yield (f"{line[:start]}step {record['step']} loss {record.get('loss', float('nan')):.4f} "
                       f"world {record.get('world_size')} restart {record.get('restart')}")
        elif kind in ("start", "summary", "warning") and (kind != "start" or record.get("rank") == 0):
            yield line
        # checkpoint lines and other ranks' progress are left out


def follow_job(cluster: Cluster, out: TextIO = sys.stdout) -> int:
    """Stream the job's logs until every node has stopped; 0 when all exited 0."""
    argv = [*cluster.docker.compose_argv, "-p", cluster.name, "-f", str(cluster.compose_file), "logs", "-f"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    try:
        for line in compact(l.rstrip("\n") for l in proc.stdout):
            print(line, file=out, flush=True)
    finally:
        proc.terminate()
        proc.wait()
    nodes = cluster.nodes()
    failed = [f"{c.node} ({c.status})" for c in nodes if c.exit_code not in (0, None) or c.state != "exited"]
    if failed:
        print(f"job did not finish cleanly: {', '.join(failed)}", file=out)
        return 1
    print("job finished: every node exited 0", file=out)
    return 0
