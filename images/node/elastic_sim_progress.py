"""Tell elastic-sim where training is, in one line; a no-op anywhere else.

    import elastic_sim_progress
    elastic_sim_progress.report(step, loss=loss.item())

Inside an elastic-sim node, in a torchrun worker, `report` appends a "progress" record to the
node's side channel (a file the harness collects into the run's history), never to the script's
stdout. Outside the simulator it returns at once, so a script may keep the call everywhere.
Without it, elastic-sim still sees optimizer steps and collectives (elastic_sim_instrument).

This file is also the side channel's writer for elastic_sim_instrument: one place builds records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

try:  # in a node: the kernel's clock, also where the skew-clock fault has moved the node's
    from elastic_sim_clock import wall_clock
except ImportError:  # outside the simulator (the module ships on its own)
    from time import time as wall_clock

_channel_fd: int | None = None  # opened on the first record
_identity: dict | None = None  # this worker's fields, read once from torchrun's environment
_broken = False  # a failed write turns the channel off for good: the script must never notice


def report(step: int, loss: float | None = None) -> None:
    """Record that this process reached `step` (and its loss). Never raises."""
    try:
        if not in_simulated_worker():
            return
        write_record("progress", step=int(step), loss=None if loss is None else float(loss), source="api")
    except Exception:
        pass


def in_simulated_worker(env: Mapping[str, str] = os.environ) -> bool:
    """A torchrun worker (the agent sets LOCAL_RANK and TORCHELASTIC_RUN_ID for its workers only)
    in a node that has a side channel (SIM_EVENTS_DIR, set by elastic-sim's compose file)."""
    return "LOCAL_RANK" in env and "TORCHELASTIC_RUN_ID" in env and bool(env.get("SIM_EVENTS_DIR"))


def worker_identity(env: Mapping[str, str] = os.environ) -> dict:
    """The fields every record of this process carries, from torchrun's worker environment."""
    return {
        "node": env.get("SIM_NODE") or os.uname().nodename,
        "rank": _int(env.get("RANK")),
        "local_rank": _int(env.get("LOCAL_RANK")),
        "world_size": _int(env.get("WORLD_SIZE")),
        "restart": _int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "run_id": env.get("TORCHELASTIC_RUN_ID"),
    }


def build_record(event: str, identity: dict, t: float, pid: int, **fields) -> dict:
    """The record as the contract orders it: when, what, who, then the event's own fields."""
    return {
        "t": t,
        "type": "worker",
        "node": identity["node"],
        "event": event,
        "rank": identity["rank"],
        "local_rank": identity["local_rank"],
        "world_size": identity["world_size"],
        "restart": identity["restart"],
        "pid": pid,
        "run_id": identity["run_id"],
        **fields,
    }


def write_record(event: str, **fields) -> bool:
    """Append one record as one whole-line O_APPEND write (the node's workers share the file, and
    one write(2) of a line never interleaves with another's). False, and off for good, on failure."""
    global _channel_fd, _identity, _broken
    if _broken:
        return False
    try:
        if _channel_fd is None:
            _identity = worker_identity()
            path = os.path.join(os.environ["SIM_EVENTS_DIR"], f"{_identity['node']}.jsonl")
            _channel_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        record = build_record(event, _identity, wall_clock(), os.getpid(), **fields)
        os.write(_channel_fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        return True
    except Exception:
        _broken = True
        return False


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
