"""The side channel, host side: events folder, tailing the workers' files, the progress regex, and
the spec / CLI / scenario / compose plumbing that carries them."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from sim.cli.main import build_parser
from sim.core.errors import UsageError
from sim.core.history import History
from sim.core.sidechannel import EventsTail, ProgressMatcher, compile_progress_regex, prepare_events_dir, worker_record
from sim.core.spec import ClusterSpec, spec_from_options
from sim.engines.collector import Collector
from sim.engines.render import render
from sim.scenarios.scenario import parse_scenario, scenario_spec_options

# Lines as elastic_sim_instrument writes them (captured from tests/unit/test_instrument.py's run).
START = (
    '{"t":1796046212.64,"type":"worker","node":"node0","event":"start","rank":0,"local_rank":0,'
    '"world_size":2,"restart":0,"pid":71,"run_id":"demo-r1"}'
)
STEP = (
    '{"t":1796046223.08,"type":"worker","node":"node0","event":"step","rank":0,"local_rank":0,'
    '"world_size":2,"restart":0,"pid":71,"run_id":"demo-r1","n":1,"step":101}'
)
IMAGES = {"node_image": "elastic-sim/node:abc", "etcd_image": "elastic-sim/etcd:def", "run_id": "r1"}
REGEX = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"


def test_events_dir_is_writable_by_the_nodes_user(tmp_path):
    path = prepare_events_dir(tmp_path / "run")
    assert path == tmp_path / "run" / "events"
    info = path.stat()
    if os.geteuid() in (0, 1000):  # the node's user owns it, no other user may write it
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (1000, 0o755)
    else:  # its own, in its own group, which the nodes join (test_shared_host)
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), os.getegid(), 0o2770)
    assert prepare_events_dir(tmp_path / "run") == path  # again on a scale-up: no harm


def test_events_dir_is_given_to_a_team_images_user(tmp_path):
    # A team image running as root (uid 0) or as its own uid: the nodes hold no capability, so a root node
    # could not write into a folder uid 1000 owns (CAP_DAC_OVERRIDE dropped): its records were lost.
    from sim.engines.cluster import node_gids, node_uid

    class Images:
        def image_inspect(self, tag):
            team = {"elastic-sim.node-uid": "0", "elastic-sim.node-gids": "0,27"}
            return {"team": {"Config": {"Labels": team}}, "ours": {"Config": {}}}.get(tag)

    assert (node_uid(Images(), "team"), node_uid(Images(), "ours"), node_uid(Images(), "gone")) == (0, None, None)
    assert (node_gids(Images(), "team"), node_gids(Images(), "ours")) == ((0, 27), None)
    path = prepare_events_dir(tmp_path / "run", node_uid=4242)
    if os.geteuid() == 0:
        assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (4242, 0o755)
    else:  # not ours to give away: our group's, which the nodes join
        assert stat.S_IMODE(path.stat().st_mode) == 0o2770


def test_the_events_tail_follows_no_symlink_and_reads_a_bounded_amount(tmp_path):
    from sim.core import sidechannel

    events = prepare_events_dir(tmp_path / "run")
    secret = tmp_path / "secret.jsonl"
    secret.write_text(STEP + "\n")
    (events / "planted.jsonl").symlink_to(secret)  # a worker plants a link to a host file
    os.mkfifo(events / "fifo.jsonl")  # and a FIFO that would block a reader
    tail = EventsTail(events)
    assert tail.poll() == []
    (events / "node0.jsonl").write_text((STEP + "\n") * 3 + "x" * (sidechannel.MAX_PARTIAL + 10))
    got = tail.poll()
    assert len(got) == 3 and all(r["step"] == 101 for r in got)
    assert tail._partial == {}  # an endless line is not kept


def test_worker_record_parses_and_refuses():
    assert worker_record(STEP, "node0")["step"] == 101
    no_type = json.dumps({"event": "exit", "code": 0})
    assert worker_record(no_type, "node3") == {"event": "exit", "code": 0, "type": "worker", "node": "node3"}
    for bad in ("not json", "[1]", '{"event": "dance"}', b"\xff\xfe"):
        assert worker_record(bad, "node0") is None


def test_a_record_the_history_would_refuse_is_dropped_not_raised(tmp_path):
    """A user's `report(step, loss="x")`: the collector's thread must not die on History.append."""
    bad_loss = json.dumps({"t": 1.0, "event": "progress", "source": "api", "rank": 0, "step": 3, "loss": "x"})
    assert worker_record(bad_loss, "node0") is None
    assert worker_record(json.dumps({"event": "step", "n": "one"}), "node0") is None
    events = prepare_events_dir(tmp_path)
    (events / "node0.jsonl").write_text(bad_loss + "\n" + STEP + "\n")
    history = History(tmp_path / "history.jsonl")
    collector = Collector(FakeCluster(tmp_path, ClusterSpec()), history)
    done = threading.Event()
    done.set()
    collector._tail_side_channel(done)
    assert [(r.event, r.step) for r in history.records()] == [("step", 101)]


def test_tail_waits_for_a_partial_line_and_finds_new_files(tmp_path):
    tail = EventsTail(tmp_path)
    assert tail.poll() == []  # nothing yet (the folder may even be empty for a while)
    node0 = tmp_path / "node0.jsonl"
    node0.write_text(START + "\n" + STEP[:40])
    assert [r["event"] for r in tail.poll()] == ["start"]
    assert tail.poll() == []
    with open(node0, "a") as f:
        f.write(STEP[40:] + "\n")
    (tmp_path / "node1.jsonl").write_text(START.replace("node0", "node1") + "\ngarbage\n")
    (tmp_path / "notes.txt").write_text(START + "\n")
    assert [(r["node"], r["event"]) for r in tail.poll()] == [("node0", "step"), ("node1", "start")]
    assert tail.poll() == []


def test_progress_regex_must_compile_and_name_a_step():
    assert compile_progress_regex(REGEX).groupindex.keys() == {"step", "loss"}
    with pytest.raises(UsageError, match=r"^--progress-regex 'step \(': not a regular expression .*use e\.g\."):
        compile_progress_regex("step (")
    with pytest.raises(UsageError, match=r"^--progress-regex 'step \(\\d\+\)': has no named group 'step'"):
        compile_progress_regex(r"step (\d+)")
    with pytest.raises(UsageError) as error:
        ClusterSpec(progress_regex="loss (?P<loss>.*)")
    assert "\n" not in str(error.value)


def test_progress_matcher_reads_step_and_loss():
    matcher = ProgressMatcher(REGEX)
    assert matcher.match("node1", 5.0, "epoch 0 step 12 loss 0.375") == {
        "t": 5.0,
        "type": "worker",
        "node": "node1",
        "event": "progress",
        "step": 12,
        "loss": 0.375,
        "source": "log",
    }
    assert matcher.match("node1", 5.0, "Starting worker group") is None
    assert matcher.match("node1", None, "step 3 loss 1.5")["t"] > 0  # a line without a timestamp
    assert ProgressMatcher(r"it=(?P<step>\d+)").match("node0", 1.0, "it=7")["loss"] is None
    assert ProgressMatcher(r"it=(?P<step>\w+)").match("node0", 1.0, "it=seven") is None
    optional_loss = ProgressMatcher(r"it=(?P<step>\d+)(?: loss=(?P<loss>\S+))?")
    assert optional_loss.match("node0", 1.0, "it=7 loss=nan?")["loss"] is None


def test_spec_fields_round_trip_and_default_for_old_specs():
    spec = ClusterSpec(instrument=False, progress_regex=REGEX)
    assert ClusterSpec.from_json(spec.to_json()) == spec
    old = json.loads(ClusterSpec().to_json())
    del old["instrument"], old["progress_regex"]
    assert ClusterSpec.from_json(json.dumps(old)).instrument is True
    with pytest.raises(UsageError, match="instrument 'no': must be true or false"):
        ClusterSpec(instrument="no")


def test_up_flags():
    parser = build_parser()
    args = parser.parse_args(["up", "--no-instrument", "--progress-regex", REGEX])
    spec = spec_from_options(vars(args), None)
    assert (spec.instrument, spec.progress_regex) == (False, REGEX)
    assert spec_from_options(vars(parser.parse_args(["up"])), None).instrument is True


def test_scenario_keys(tmp_path):
    text = "name: a\ndescription: b\ncluster:\n  progress: '%s'\n  instrument: false\nexpect: {outcome: recovers}\n"
    spec = spec_from_options(scenario_spec_options(parse_scenario(text % REGEX, "s.yaml"), "etcd-v2"), None)
    assert (spec.progress_regex, spec.instrument) == (REGEX, False)
    with pytest.raises(UsageError, match=r"^s\.yaml:4: cluster\.progress: 'it=\(\\d\+\)': has no named group 'step'"):
        parse_scenario(text % r"it=(\d+)", "s.yaml")


def test_nodes_get_the_events_mount_and_switch(tmp_path):
    events = prepare_events_dir(tmp_path)
    node = render(ClusterSpec(name="demo", nodes=2), events_dir=events, **IMAGES)["services"]["node1"]
    assert {"type": "bind", "source": str(events), "target": "/sim/events"} in node["volumes"]
    assert (node["environment"]["SIM_EVENTS_DIR"], node["environment"]["SIM_INSTRUMENT"]) == ("/sim/events", "1")
    off = render(ClusterSpec(name="demo", nodes=1, instrument=False), events_dir=events, **IMAGES)
    assert off["services"]["node0"]["environment"]["SIM_INSTRUMENT"] == "0"
    bare = render(ClusterSpec(name="demo", nodes=1), **IMAGES)["services"]["node0"]
    assert "SIM_EVENTS_DIR" not in bare["environment"]
    assert not any(isinstance(v, dict) and v["target"] == "/sim/events" for v in bare["volumes"])


class FakeCluster:
    """What the collector asks of a cluster before it touches Docker."""

    def __init__(self, run_dir: Path, spec: ClusterSpec):
        self.run_dir, self.spec = run_dir, spec
        self.docker = type("FakeDocker", (), {"docker_bin": "docker"})()


def test_collector_appends_side_channel_records_as_worker_records(tmp_path):
    events = prepare_events_dir(tmp_path)
    (events / "node0.jsonl").write_text(START + "\n" + STEP + "\n")
    history = History(tmp_path / "history.jsonl")
    collector = Collector(FakeCluster(tmp_path, ClusterSpec(progress_regex=REGEX)), history)
    done = threading.Event()
    done.set()  # one last poll, as at the end of a run
    collector._tail_side_channel(done)
    records = list(history.records())
    assert [(r.TYPE, r.event, r.t) for r in records] == [
        ("worker", "start", 1796046212.64),
        ("worker", "step", 1796046223.08),
    ]
    assert collector.progress.match("node0", 1.0, "step 4 loss 2")["step"] == 4


def test_history_reads_typed_records_and_counts_torn_lines(tmp_path):
    from sim.core.errors import HistoryError
    from sim.core.history import SCHEMA_VERSION, AgentRecord, RunRecord, parse_record

    history = History(tmp_path / "history.jsonl")
    start = history.append({"type": "run", "event": "start", "cluster": "c"})
    assert isinstance(start, RunRecord) and start.schema == SCHEMA_VERSION
    history.append(
        {
            "t": 2.0,
            "type": "agent",
            "node": "node0",
            "event": "group_failed",
            "attempts_left": 2,
            "max_restarts": 3,
            "newer_field": 1,
        }
    )
    with open(history.path, "a") as f:
        f.write('{"t": 3.0, "type": "agent", "node": "no\nnot json\n{"t": 4.0, "type": "nonsense"}\n')
    contents = history.read()
    assert contents.skipped_lines == 3
    agent = contents.records[1]
    assert isinstance(agent, AgentRecord) and agent.restarts_used() == 2 and agent.extra == {"newer_field": 1}
    assert agent.node == "node0" and agent.round is None and agent.to_dict()["newer_field"] == 1
    # A history written before the schema version is version 1; nothing off-schema is written.
    assert parse_record({"t": 1.0, "type": "run", "event": "start"}).schema == 1
    with pytest.raises(HistoryError, match="step 'x' is not int"):
        history.append({"type": "worker", "event": "step", "step": "x"})
    assert len(history.read().records) == 2
