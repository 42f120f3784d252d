"""The workers' side channel, host side: what instrumented workers write, collected into the history.

Inside a node, elastic_sim_instrument (images/node) appends one JSON line per record to
`$SIM_EVENTS_DIR/$SIM_NODE.jsonl`, a bind mount of the run folder's `events/`, never to the
script's own output. The collector tails those files (EventsTail) and appends each record to the
history as type "worker". It also reads a user's `--progress-regex` on every log line
(ProgressMatcher), for scripts that print their step and loss.

Pure apart from reading the events files: unit-tested without Docker.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

from sim.core.errors import HistoryError, UsageError
from sim.core.history import parse_record

EVENTS_DIR = "events"  # in the run folder
PROGRESS_REGEX_EXAMPLE = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"


NODE_UID = 1000  # the node image's user `sim`
READ_AT_MOST = 4 << 20  # bytes read from one events file per poll
MAX_PARTIAL = 1 << 20  # a line longer than this without its end is dropped


def prepare_events_dir(run_dir: Path, node_uid: int | None = None) -> Path:
    """Make `<run_dir>/events/`, writable by the node's user (`node_uid` there: 1000 for our image, the
    team image's own user for --image) and by no other user here: owned by that uid, 0755 (as root we
    give it away; as that uid it is ours). A harness running as a third user cannot give it away: the
    folder stays its own, in its own group, 2770 (files made in it keep that group), and the nodes join
    that group (events_group; render's group_add), so no other user of the machine may write there."""
    node_uid = NODE_UID if node_uid is None else node_uid
    path = Path(run_dir) / EVENTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, node_uid, node_uid)
        path.chmod(0o755)
    elif os.geteuid() == node_uid:
        path.chmod(0o755)
    else:
        os.chown(path, -1, os.getegid())
        path.chmod(0o2770)
    return path


def events_group(events_dir: Path) -> int | None:
    """The group the nodes must join to write in `events_dir`: its own where it is group-writable (made
    by a harness whose uid is not the nodes'), else None."""
    info = os.stat(events_dir)
    return info.st_gid if info.st_mode & stat.S_IWGRP else None


def worker_record(line: bytes | str, node: str) -> dict | None:
    """One side-channel line as a history record, or None for a line that is not one."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    record["type"] = "worker"
    record.setdefault("node", node)
    return _on_schema(record)


def _on_schema(record: dict) -> dict | None:
    """The record, or None where the history would refuse it (a user's `report(step, loss="x")`):
    the collector's thread drops such a line rather than die on it. History.append stamps a record
    without a time, so one is lent for the check."""
    try:
        parse_record({"t": 0.0, **record})
    except HistoryError:
        return None
    return record


class EventsTail:
    """New records of every `*.jsonl` in the events folder since the last poll: files that
    appear later are picked up, and a line still being written waits for its end."""

    def __init__(self, events_dir: Path):
        self.events_dir = Path(events_dir)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def poll(self) -> list[dict]:
        records: list[dict] = []
        for path in sorted(self.events_dir.glob("*.jsonl")):
            records += self._read_new(path)
        return records

    def _read_new(self, path: Path) -> list[dict]:
        offset = self._offsets.get(path, 0)
        try:
            # A worker writes this folder: no symlink followed (O_NOFOLLOW), only a regular file read
            # (not a FIFO or a device), and at most READ_AT_MOST bytes a poll.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    return []
                size = info.st_size
                if size == offset:
                    return []
                if size < offset:  # replaced by a shorter file: read it from the start
                    offset = 0
                    self._partial.pop(path, None)
                os.lseek(fd, offset, os.SEEK_SET)
                data = os.read(fd, min(size - offset, READ_AT_MOST))
            finally:
                os.close(fd)
        except OSError:
            return []
        self._offsets[path] = offset + len(data)
        lines = (self._partial.pop(path, b"") + data).split(b"\n")
        if lines[-1] and len(lines[-1]) <= MAX_PARTIAL:
            self._partial[path] = lines[-1]
        records = (worker_record(line, path.stem) for line in lines[:-1] if line.strip())
        return [record for record in records if record is not None]


def compile_progress_regex(pattern: str, flag: str = "--progress-regex") -> re.Pattern:
    """The user's progress regex, checked: it compiles and names a `step` group (`loss` optional)."""
    where = f"{flag} '{pattern}'" if flag else f"'{pattern}'"  # as typed: repr would double backslashes
    try:
        regex = re.compile(pattern)
    except re.error as error:
        raise UsageError(f"{where}: not a regular expression ({error}); use e.g. '{PROGRESS_REGEX_EXAMPLE}'") from None
    if "step" not in regex.groupindex:
        raise UsageError(
            f"{where}: has no named group 'step'; mark the step number with (?P<step>\\d+), "
            f"e.g. '{PROGRESS_REGEX_EXAMPLE}'"
        )
    return regex


class ProgressMatcher:
    """Log lines that match the user's regex, as "progress" records of source "log". Such a line
    carries the node it came from but no rank: the worker that printed it is not known."""

    def __init__(self, pattern: str):
        self.regex = compile_progress_regex(pattern)
        self._has_loss = "loss" in self.regex.groupindex

    def match(self, node: str, t: float | None, line: str) -> dict | None:
        found = self.regex.search(line)
        if found is None:
            return None
        try:
            step = int(found.group("step"))
        except (TypeError, ValueError):
            return None  # the group matched something that is not a whole number
        return _on_schema(
            {
                "t": time.time() if t is None else t,
                "type": "worker",
                "node": node,
                "event": "progress",
                "step": step,
                "loss": self._loss(found),
                "source": "log",
            }
        )

    def _loss(self, found: re.Match) -> float | None:
        if not self._has_loss or found.group("loss") is None:
            return None
        try:
            return float(found.group("loss"))
        except ValueError:
            return None
