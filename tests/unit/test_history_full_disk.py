"""A full state disk (issue 37 finding 8): a history line is written whole or not at all, a failed append
says so, a torn line left by a crash swallows nothing, and the collector goes on after a write error and
records what it lost. The real disk is tests/integration/test_full_state_disk.py; here the writes fail on
demand."""

from __future__ import annotations

import errno
import json
import os

import pytest

from sim.core import history as history_module
from sim.core.errors import HistoryWriteError
from sim.core.history import DockerRecord, History
from sim.engines.collector import Collector
from tests.unit.test_collector import FakeCluster

KILL = {"t": 10.0, "type": "docker", "node": "node0", "action": "kill"}


def docker(action: str, t: float) -> DockerRecord:
    return DockerRecord(t=t, node="node0", action=action)


class Disk:
    """os.write as a nearly full disk does it: half of what is asked each time (a short write, no error),
    `room` bytes in all, then ENOSPC."""

    def __init__(self, room: int):
        self.room, self.real = room, os.write

    def write(self, fd: int, data: bytes) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(max(1, len(data) // 2), self.room)  # never all of it at once: a short write
        self.room -= n
        return self.real(fd, data[:n])


def test_a_failed_append_raises_and_leaves_no_torn_line(tmp_path, monkeypatch):
    history = History(tmp_path / "history.jsonl")
    history.append(KILL)
    before = history.path.read_bytes()
    disk = Disk(room=20)  # part of the next line fits
    monkeypatch.setattr(history_module.os, "write", disk.write)
    with pytest.raises(HistoryWriteError, match="record not written .No space left on device"):
        history.append(docker("die", 11.0))
    assert history.path.read_bytes() == before  # cut back to where the line began
    disk.room = 10**6  # space came back
    history.append(docker("start", 12.0))
    contents = history.read()
    assert [r.action for r in contents.records] == ["kill", "start"] and contents.skipped_lines == 0


def test_short_writes_without_an_error_still_write_the_whole_line(tmp_path, monkeypatch):
    history = History(tmp_path / "history.jsonl")
    monkeypatch.setattr(history_module.os, "write", Disk(room=10**6).write)  # half of what is asked, each time
    for i, action in enumerate(("kill", "die", "start", "die")):
        history.append(docker(action, 10.0 + i))  # before, the first short write tore the line, silently
    assert [r.action for r in history.records()] == ["kill", "die", "start", "die"]


def test_a_torn_last_line_from_a_crash_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_bytes(json.dumps(KILL).encode() + b"\n" + b'{"t": 11.0, "type": "dock')
    History(path).append(docker("start", 12.0))
    contents = History(path).read()
    assert [r.action for r in contents.records] == ["kill", "start"] and contents.skipped_lines == 1


def test_fault_and_run_records_are_fsynced(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(history_module.os, "fsync", lambda fd: synced.append(fd))
    history = History(tmp_path / "history.jsonl")
    history.append(KILL)
    assert not synced
    history.append({"type": "fault", "op": "a1", "fault": "kill-node", "target": "node0", "phase": "invoke"})
    history.append({"type": "run", "event": "end", "cluster": "demo"})
    assert len(synced) == 2


class Flaky(History):
    """A history whose disk is full for a while."""

    full = False

    def append(self, record):
        if self.full:
            raise HistoryWriteError(f"{self.path}: record not written (No space left on device)")
        return super().append(record)


def test_the_collector_goes_on_after_a_write_error_and_records_what_it_lost(tmp_path):
    history = Flaky(tmp_path / "history.jsonl")
    collector = Collector(FakeCluster(tmp_path, []), history)
    collector._append(docker("kill", 10.0))
    history.full = True
    collector._append(docker("die", 11.0))
    collector._append(docker("start", 12.0))
    history.full = False  # space came back
    collector._append(docker("die", 13.0))
    records = list(history.records())
    assert [(r.TYPE, getattr(r, "action", None) or r.event) for r in records] == [
        ("docker", "kill"),
        ("run", "records_lost"),
        ("docker", "die"),
    ]
    lost = records[1]
    assert (lost.lost, lost.lost_from, lost.lost_to) == (2, 11.0, 12.0)


def test_the_collectors_threads_survive_a_full_disk(tmp_path):
    """The event thread and the side channel go on through write errors (before, the first OSError ended them)."""
    history = Flaky(tmp_path / "history.jsonl")
    collector = Collector(FakeCluster(tmp_path, []), history)
    history.full = True
    events = iter(
        [{"Type": "container", "Action": a, "id": "c1", "timeNano": int((20 + i) * 1e9),
          "Actor": {"ID": "c1", "Attributes": {"elastic-sim.node": "node0"}}} for i, a in enumerate(("kill", "die"))]
    )  # fmt: skip

    class Stream:
        def __iter__(self):
            for event in events:
                yield event
                history.full = False  # the disk frees after the first

        def close(self):
            pass

    collector._follow = lambda cid: None
    collector._read_events(Stream())
    records = list(history.records())
    assert [getattr(r, "action", None) or r.event for r in records] == ["records_lost", "die"]
