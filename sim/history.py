"""The run's history: one append-only JSONL file, one clock (wall time).

Like Jepsen's history, it is data: every fault is an operation recorded as
`invoke` then `ok`/`fail`/`info`; later issues add trainer, agent and Docker
events. Checkers read it; nothing rewrites it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Iterator

FILE_NAME = "history.jsonl"


class History:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, record: dict) -> dict:
        record = {"t": time.time(), **record}
        line = json.dumps(record, sort_keys=False, default=str) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            # O_APPEND: concurrent writers (two CLI calls) never interleave a line.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        return record

    def records(self) -> Iterator[dict]:
        """Every whole record. A line that is not one (the half-written last line of a live run,
        a torn write) is skipped: the checkers judge what was recorded."""
        if not self.path.exists():
            return iter(())
        return (record for record in map(_record, self.path.read_text(errors="replace").splitlines())
                if record is not None)


class HistoryTail:
    """Reads only what was appended since the last poll (the file grows by many
    lines a second during training; re-reading it whole would not scale)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        return [json.loads(line) for line in lines if line.strip()]


def _record(line: str) -> dict | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("t"), (int, float)) else None
