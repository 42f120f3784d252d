"""The nemesis against a fake Docker provider: audit records and the exact calls and
commands each fault makes, without Docker (as Blockade tests its net layer)."""

from __future__ import annotations

import json
import signal

import pytest

from chaos.nemesis import Nemesis
from chaos.partition import isolate, parse_partition_spec
from sim import labels
from sim.cluster import Cluster
from sim.docker import Container, ExecResult
from sim.errors import FaultError, UsageError
from sim.history import History
from sim.procs import PROBE_ARGV, parse_probe

NODES = {"etcd": "10.0.0.2", "node0": "10.0.0.3", "node1": "10.0.0.4", "node2": "10.0.0.5"}
PROBE_OUTPUT = "\n".join(json.dumps(row) for row in [
    {"pid": 1, "ppid": 0, "args": ["/sbin/docker-init", "--", "torchrun", "x"], "env": {}},
    {"pid": 7, "ppid": 1, "args": ["/opt/venv/bin/python3", "/opt/venv/bin/torchrun", "x"], "env": {}},
    {"pid": 40, "ppid": 7, "args": ["/opt/venv/bin/python3", "-u", "train.py"],
     "env": {"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "WORLD_SIZE": "6"}},
    {"pid": 41, "ppid": 7, "args": ["/opt/venv/bin/python3", "-u", "train.py"],
     "env": {"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "6"}},
])


class FakeProvider:
    """The part of the Docker provider the nemesis uses: a cluster of four running containers
    (ids id-NODE), answering execs as a node would; every call is recorded."""

    def __init__(self, paused=()):
        self.calls: list[tuple] = []
        self.paused = set(paused)

    def containers(self, label_filter: str) -> list[Container]:
        assert label_filter == labels.cluster_filter("demo")
        return [Container(id=f"id-{node}", name=f"c-{node}", state="paused" if node in self.paused else "running",
                          labels={labels.NODE: node, labels.ROLE: "etcd" if node == "etcd" else "node",
                                  labels.RUN: "r1"},
                          status="Up", exit_code=None, ips={"demo_cluster": ip}) for node, ip in NODES.items()]

    def exec(self, container, argv, *, user=None, timeout=30, detach=False) -> ExecResult:
        argv = list(argv)
        self.calls.append(("exec", container, argv, user))
        if argv == PROBE_ARGV:
            return ExecResult(0, PROBE_OUTPUT, "")
        if argv[-2:] == ["link", "show"]:
            return ExecResult(0, "2: eth1@if9: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n", "")
        return ExecResult(0, "", "")

    def __getattr__(self, verb):
        if verb not in ("kill", "pause", "unpause", "stop", "start", "restart", "remove"):
            raise AttributeError(verb)
        return lambda *args, **kwargs: self.calls.append((verb, *args, *kwargs.values()))

    def scripts(self, container: str) -> list[str]:
        """The shell scripts run as root in one container, in order."""
        return [argv[-1] for verb, cid, argv, user in (c for c in self.calls if c[0] == "exec")
                if cid == container and argv[:2] == ["sh", "-c"] and user == "root"]


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))


@pytest.fixture
def nemesis(tmp_path):
    fake = FakeProvider()
    cluster = Cluster("demo", fake)
    return Nemesis(cluster, history=History(tmp_path / "history.jsonl"), seed=7), fake


def test_kill_worker_by_rank_signals_that_pid_and_records_it(nemesis):
    nem, fake = nemesis
    result = nem.kill_worker(rank=3, sig=signal.SIGTERM)
    assert result["pid"] == 41 and result["node"] == "node0" and result["signal"] == "SIGTERM"
    assert ("exec", "id-node0", ["kill", "-TERM", "41"], "root") in fake.calls
    records = list(nem.history.records())
    assert [r["phase"] for r in records] == ["invoke", "ok"]
    assert records[0]["t"] <= records[1]["t"] and records[1]["result"]["pid"] == 41


def test_a_failed_fault_is_recorded_as_fail(nemesis):
    nem, fake = nemesis
    with pytest.raises(UsageError, match="node9"):
        nem.kill_node("node9")
    assert [r["phase"] for r in nem.history.records()] == ["invoke", "fail"]
    assert not any(c[0] == "kill" for c in fake.calls), "nothing was injected"


def test_random_target_replays_with_the_same_seed(tmp_path):
    picks = []
    for _ in range(2):
        cluster = Cluster("demo", FakeProvider())
        picks.append([Nemesis(cluster, history=History(tmp_path / "h.jsonl"), seed=42).resolve("random") for _ in range(5)])
    assert picks[0] == picks[1]


def test_partition_rules_are_applied_in_every_namespace_and_healed(nemesis):
    nem, fake = nemesis
    everyone = ["node0", "node1", "node2", "etcd"]
    nem.partition(isolate(["node2"], everyone))
    node2 = fake.scripts("id-node2")[-1]
    assert "iptables -w -F SIM-PARTITION" in node2
    for ip in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
        assert f"iptables -w -A SIM-PARTITION -s {ip} -j DROP" in node2
        assert f"iptables -w -A SIM-PARTITION -d {ip} -j DROP" in node2
    assert "-s 10.0.0.5 -j DROP" in fake.scripts("id-node0")[-1] and "-s 10.0.0.5" in fake.scripts("id-etcd")[-1]
    assert "-s 10.0.0.3" not in fake.scripts("id-node1")[-1], "node1 still talks to node0"
    assert [f["fault"] for f in nem.active()] == ["partition"]
    nem.heal()
    assert nem.active() == []
    assert fake.scripts("id-node2")[-1].rstrip().endswith("iptables -w -F SIM-PARTITION")


def test_two_partitions_apply_as_their_union(nemesis):
    nem, fake = nemesis
    nodes = ["node0", "node1", "node2"]
    first = nem.partition(parse_partition_spec("node0|node1,node2", nodes))
    nem.partition(isolate(["node2"], nodes))
    assert "-d 10.0.0.4" in fake.scripts("id-node2")[-1] and "-d 10.0.0.3" in fake.scripts("id-node2")[-1]
    nem.heal(first["id"])
    node1 = fake.scripts("id-node1")[-1]
    assert "-d 10.0.0.3" not in node1 and "-d 10.0.0.5" in node1


def test_loss_installs_statistic_rules_on_the_node(nemesis):
    nem, fake = nemesis
    nem.link("node1", loss_pct=30)
    script = fake.scripts("id-node1")[-1]
    assert "iptables -w -A SIM-LOSS-IN '!' -i lo -m statistic --mode random --probability 0.3 -j DROP" in script
    assert [f["id"] for f in nem.active()] == ["link-node1"]


def test_pause_twice_is_a_clear_error():
    fake = FakeProvider(paused={"node1"})
    nem = Nemesis(Cluster("demo", fake), history=History("/dev/null"), seed=1)
    with pytest.raises(UsageError, match="already paused"):
        nem.pause("node1")


def test_probe_parsing_finds_agent_workers_and_group_rank():
    procs = parse_probe(PROBE_OUTPUT)
    assert procs.agent_pid == 7 and [w.rank for w in procs.workers] == [2, 3]
    assert procs.group_rank == 1 and procs.worker(local_rank=1).pid == 41
    with pytest.raises(FaultError):
        parse_probe("")


def test_container_faults_are_provider_calls(nemesis):
    nem, fake = nemesis
    nem.kill_node("node1")
    nem.stop_node("node2", grace=5)
    nem.restart_node("node0", grace=2)
    nem.start_node("node2")
    assert [c for c in fake.calls if c[0] != "exec"] == [
        ("kill", "id-node1", "SIGKILL"), ("stop", "id-node2", 5), ("restart", "id-node0", 2), ("start", "id-node2")]


def test_scale_down_stops_the_highest_nodes_and_removes_them(nemesis):
    nem, fake = nemesis
    result = nem.scale(1, abrupt=True)
    assert result == {"op": result["op"], "joined": [], "left": ["node2", "node1"], "abrupt": True}
    assert [c for c in fake.calls if c[0] != "exec"] == [
        ("kill", "id-node2", "SIGKILL"), ("remove", "container", ["id-node2"]),
        ("kill", "id-node1", "SIGKILL"), ("remove", "container", ["id-node1"])]


def test_every_reversible_faults_ok_record_carries_its_id(nemesis):
    nem, fake = nemesis
    nem.pause("node1")
    nem.link("node2", loss_pct=10)
    nem.partition(isolate(["node0"], ["node0", "node1", "node2"]))
    oks = [r for r in nem.history.records() if r["phase"] == "ok"]
    assert [r["result"]["id"] for r in oks] == ["pause-node1", "link-node2", nem.active()[-1]["id"]]
    assert ("pause", "id-node1") in fake.calls
    assert sorted(f["id"] for f in nem.active()) == sorted(r["result"]["id"] for r in oks)


def test_the_fault_store_loses_nothing_to_concurrent_writers(nemesis):
    import threading

    nem, _ = nemesis
    threads = [threading.Thread(target=nem._remember, args=({"id": f"f{i}", "fault": "pause", "target": "x"},))
               for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(f["id"] for f in nem.active()) == sorted(f"f{i}" for i in range(20))
