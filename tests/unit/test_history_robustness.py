"""A damaged history never gives a traceback in `sim report` (issue 11 item 3): torn, corrupt or truncated
files, missing records, lines that are not records, wrong types and container clocks skewed from the host's.
The report says what it could not judge instead."""

from __future__ import annotations

import json

import pytest

from sim.cli.main import main
from tests.unit.histories import HistoryBuilder


def _good_run() -> list[dict]:
    run = HistoryBuilder(nodes=2, nproc=1, steps=20, ckpt=5)
    run.start_workers()
    run.train(until=10)
    run.fault("kill-worker", "node1", effects=[{"type": "docker", "node": "node1", "action": "die", "exit_code": 137}])
    run.group_failure()
    run.start_workers(resumed_from=10)
    run.train(until=20)
    run.finish()
    return run.records


def _lines(records) -> list[bytes]:
    return [json.dumps(r).encode() for r in records]


def _skewed(records, node: str, seconds: float) -> list[dict]:
    """The node's own records stamped by a clock `seconds` off the host's."""
    return [{**r, "t": r["t"] + seconds} if r.get("node") == node and r.get("type") != "docker" else r for r in records]


def _retyped(records, **fields) -> list[dict]:
    return [{**r, **{k: v for k, v in fields.items() if k in r}} for r in records]


GOOD = _good_run()
CASES = {
    "empty file": [],
    "only blank lines": [b"", b"   ", b""],
    "torn last line": _lines(GOOD)[:-1] + [_lines(GOOD)[-1][:17]],
    "truncated mid-run": _lines(GOOD)[: len(GOOD) // 2],
    "binary garbage": [b"\x00\xff\xfe" * 50] + _lines(GOOD),
    "not UTF-8 inside a record": _lines(GOOD)[:5] + [b'{"type": "trainer", "node": "node0\xff"}'] + _lines(GOOD)[5:],
    "no run start": _lines(GOOD[1:]),
    "no run end": _lines(GOOD[:-1]),
    "only the run start": _lines(GOOD[:1]),
    "fault invoke without ok": _lines([r for r in GOOD if (r.get("type"), r.get("phase")) != ("fault", "ok")]),
    "fault ok without invoke": _lines([r for r in GOOD if (r.get("type"), r.get("phase")) != ("fault", "invoke")]),
    "non-dict lines": [b"[1, 2]", b'"text"', b"3", b"null", b"true"] + _lines(GOOD),
    "nan and infinity": [line.replace(b'"t": 1700000005.0', b'"t": NaN') for line in _lines(GOOD)]
    + [b'{"type": "trainer", "t": Infinity, "step": -Infinity}'],
    "huge step numbers": _lines(_retyped(GOOD, step=10**400, final_step=10**400)),
    "huge world size": _lines(_retyped(GOOD, world_size=10**30)),
    "huge node count in the spec": _lines([{**GOOD[0], "spec": {**GOOD[0]["spec"], "nodes": 10**30}}, *GOOD[1:]]),
    "wrong types": _lines(_retyped(GOOD, t="yesterday", step="ten", node=7, loss=[1], exit_code="x", rank=None)),
    "records of no known type": [b'{"type": "martian", "t": 1}', b'{"no_type": true}'] + _lines(GOOD),
    "deeply nested JSON": _lines(GOOD) + [b'{"type": "trainer", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"],
    "clock of a node ahead by an hour": _lines(_skewed(GOOD, "node1", 3600)),
    "clock of a node a million years ahead": _lines(_skewed(GOOD, "node1", 3.2e13)),
    "clock of a node behind by an hour": _lines(_skewed(GOOD, "node0", -3600)),
    "records out of order": _lines(list(reversed(GOOD))),
    "duplicated records": _lines(GOOD + GOOD),
}


KNOWN: dict = {}  # cases expected to fail (none: each one found was fixed)


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch, tmp_path):
    # A run without an end asks Docker whether it still runs: no engine here, so it is judged as ended.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))


@pytest.mark.filterwarnings("error::UserWarning")  # matplotlib's complaints about the picture's layout too
@pytest.mark.parametrize("case", [pytest.param(case, marks=KNOWN.get(case, ())) for case in CASES])
def test_sim_report_never_gives_a_traceback(case, tmp_path, capsys):
    run_dir = tmp_path / "runs" / "sim-20261130-000000-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "history.jsonl").write_bytes(b"\n".join(CASES[case]) + b"\n")
    code = main(["report", str(run_dir)])  # any exception but a SimError escapes main: the test fails
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and "Traceback" not in out + err
    assert out.strip() or len(err.strip().splitlines()) == 1, (out, err)


@pytest.mark.parametrize("case", ["torn last line", "binary garbage", "non-dict lines", "wrong types"])
def test_the_report_says_what_it_could_not_read(case, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "history.jsonl").write_bytes(b"\n".join(CASES[case]) + b"\n")
    main(["report", str(run_dir)])
    out, err = capsys.readouterr()
    assert any(words in out + err for words in ("skipped", "could not", "not measurable", "no run start")), (out, err)
