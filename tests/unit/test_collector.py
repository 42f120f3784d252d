"""The collector's end: the cluster removed, or the Docker engine gone (a record and a line, no traceback)."""

import threading

from sim.cli.logs import FollowView
from sim.core.errors import DockerUnavailableError
from sim.core.history import History
from sim.core.spec import ClusterSpec
from sim.engines import collector as collector_module
from sim.engines.collector import ENGINE_LOST_S, Collector, _ClusterGone
from sim.verdict.diagnoses.registry import diagnose

UNREACHABLE = "docker ps: Docker engine not reachable (Connection refused); start it"


class EngineGone(Exception):
    pass


class FakeCluster:
    """A cluster whose engine answers `answers` (a list of container lists, or errors to raise), then fails."""

    name = "demo"
    label_filter = "label=elastic-sim.cluster=demo"

    def __init__(self, run_dir, answers):
        self.run_dir, self.spec, self.answers = run_dir, ClusterSpec(), list(answers)

    def containers(self):
        answer = self.answers.pop(0) if self.answers else DockerUnavailableError(UNREACHABLE)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_an_engine_that_stops_answering_ends_the_watch_after_a_while(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(collector_module.time, "monotonic", lambda: now[0])
    answers = [["node0"], DockerUnavailableError(UNREACHABLE), ["node0"]]
    gone = _ClusterGone(FakeCluster(None, answers), threading.Event())
    assert not gone.check().ready
    now[0] += 1
    assert not gone.check().ready  # one unanswered call: a busy engine, perhaps
    assert gone.engine_lost is None
    now[0] += ENGINE_LOST_S
    assert not gone.check().ready  # it answered again: the count starts over
    now[0] += 1
    assert not gone.check().ready
    now[0] += ENGINE_LOST_S + 1
    check = gone.check()
    assert check.ready and check.detail == "the Docker engine stopped answering"
    assert gone.engine_lost == UNREACHABLE and gone.engine_lost_at > 0


class FakeEvents:
    def __iter__(self):
        raise ConnectionError("the engine closed the stream")  # requests' errors are OSErrors

    def close(self):
        pass


def test_the_collector_records_the_engines_loss_and_ends_without_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(collector_module, "LIVENESS_POLL_S", 0.01)
    monkeypatch.setattr(collector_module, "ENGINE_LOST_S", 0.05)
    cluster = FakeCluster(tmp_path, [[]])  # the first listing (before following): no container yet
    cluster.docker = type("FakeDocker", (), {"events": lambda self, flt: FakeEvents()})()
    history = History(tmp_path / "history.jsonl")
    Collector(cluster, history).run()
    (record,) = [r for r in history.records() if r.TYPE == "run"]
    assert record.event == "engine_lost" and record.why == UNREACHABLE
    assert capsys.readouterr().err == f"collector: {UNREACHABLE}; stopped following cluster 'demo'\n"
    assert "the Docker engine stopped answering; nothing more was recorded" in FollowView().line(record)


def test_engine_lost_is_the_first_diagnosis():
    history = [
        {"t": 10.0, "type": "run", "event": "start", "spec": {"nodes": 2}},
        {"t": 20.0, "type": "trainer", "kind": "progress", "node": "node0", "rank": 0, "step": 5, "world_size": 2},
        {"t": 31.0, "type": "docker", "node": "node0", "action": "die", "exit_code": 137},
        {"t": 30.5, "type": "run", "event": "engine_lost", "cluster": "demo", "why": UNREACHABLE},
    ]
    found = diagnose(history, {})
    assert found[0].code == "engine-lost"
    assert "stopped answering at 00:00:30.5; the last progress before it at 00:00:20.0" in found[0].cause
    assert found[0].evidence == (f"host 00:00:30.5  {UNREACHABLE}",)
    assert "journalctl -u docker" in found[0].fix
    assert "engine-lost" not in [d.code for d in diagnose(history[:3], {})]


def test_a_network_faults_helper_container_is_not_one_of_the_clusters_containers(tmp_path):
    """The helper that applies a network fault (Cluster.net_exec) carries the cluster's labels, for `down`'s
    sweep; its start and exit are no node's: not in the listing, not in the history."""
    from sim.core import labels
    from sim.engines.cluster import Cluster
    from sim.engines.docker import Container

    helper = {labels.CLUSTER: "demo", labels.ROLE: labels.NETNS_HELPER, labels.RUN: "r1"}
    node = {labels.CLUSTER: "demo", labels.ROLE: "node", labels.NODE: "node1", labels.RUN: "r1"}
    rows = [Container(id=f"id-{i}", name=f"c{i}", labels=tags, state="running", status="Up", exit_code=None,
                      ips={})
            for i, tags in enumerate((node, helper))]  # fmt: skip
    docker = type("FakeDocker", (), {"containers": lambda self, flt: rows})()
    assert [c.node for c in Cluster("demo", docker).containers()] == ["node1"]
    collector = Collector(FakeCluster(tmp_path, []), History(tmp_path / "history.jsonl"))
    event = {"Type": "container", "Action": "die", "id": "id-1", "timeNano": 1e18, "Actor": {"Attributes": helper}}
    assert collector._docker_record(event) is None
    died = {**event, "id": "id-0", "Actor": {"Attributes": {**node, "exitCode": "137"}}}
    assert collector._docker_record(died).node == "node1"
