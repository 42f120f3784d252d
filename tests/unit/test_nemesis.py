"""The nemesis with an injected command runner: audit records and the exact
commands each fault runs, without Docker (as Blockade tests its net layer)."""

from __future__ import annotations

import json
import signal

import pytest

from chaos.nemesis import Nemesis
from chaos.partition import isolate, parse_partition_spec
from sim.procs import parse_probe
from sim.cluster import Cluster
from sim.docker import Completed, Docker
from sim.errors import FaultError, UsageError
from sim.history import History

NODES = {"etcd": "10.0.0.2", "node0": "10.0.0.3", "node1": "10.0.0.4", "node2": "10.0.0.5"}
PROBE_OUTPUT = "\n".join(json.dumps(row) for row in [
    {"pid": 1, "ppid": 0, "args": ["/sbin/docker-init", "--", "torchrun", "x"], "env": {}},
    {"pid": 7, "ppid": 1, "args": ["/opt/venv/bin/python3", "/opt/venv/bin/torchrun", "x"], "env": {}},
    {"pid": 40, "ppid": 7, "args": ["/opt/venv/bin/python3", "-u", "train.py"],
     "env": {"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "WORLD_SIZE": "6"}},
    {"pid": 41, "ppid": 7, "args": ["/opt/venv/bin/python3", "-u", "train.py"],
     "env": {"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "6"}},
])


class FakeDocker:
    """Answers the few docker commands the nemesis runs; records every argv."""

    def __init__(self, paused=()):
        self.calls: list[list[str]] = []
        self.paused = set(paused)

    def __call__(self, argv, *, input=None, timeout=None) -> Completed:
        argv = list(argv)
        self.calls.append(argv)
        out = ""
        if argv[1] == "ps":
            out = "\n".join("\t".join([f"id-{n}", f"c-{n}", n, "etcd" if n == "etcd" else "node",
                                       "paused" if n in self.paused else "running", "Up", "r1"]) for n in NODES)
        elif argv[1] == "inspect":
            out = json.dumps([{"NetworkSettings": {"Networks": {"c_cluster": {"IPAddress": NODES[i[3:]]}}}}
                              for i in argv[2:]])
        elif argv[1] == "exec" and "python3" in argv and "-c" in argv:
            out = PROBE_OUTPUT
        elif argv[1] == "exec" and argv[-2:] == ["link", "show"]:
            out = "2: eth1@if9: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n"
        return Completed(tuple(argv), 0, out, "")

    def scripts(self, container: str) -> list[str]:
        return [c[-1] for c in self.calls if c[1] == "exec" and container in c and c[-3:-1] == ["sh", "-c"]]


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))


@pytest.fixture
def nemesis(tmp_path):
    fake = FakeDocker()
    cluster = Cluster("demo", Docker(runner=fake))
    return Nemesis(cluster, history=History(tmp_path / "history.jsonl"), seed=7), fake


def test_kill_worker_by_rank_signals_that_pid_and_records_it(nemesis):
    nem, fake = nemesis
    result = nem.kill_worker(rank=3, sig=signal.SIGTERM)
    assert result["pid"] == 41 and result["node"] == "node0" and result["signal"] == "SIGTERM"
    assert ["docker", "exec", "-u", "root", "id-node0", "kill", "-TERM", "41"] in fake.calls
    records = list(nem.history.records())
    assert [r["phase"] for r in records] == ["invoke", "ok"]
    assert records[0]["t"] <= records[1]["t"] and records[1]["result"]["pid"] == 41


def test_a_failed_fault_is_recorded_as_fail(nemesis):
    nem, fake = nemesis
    with pytest.raises(UsageError, match="node9"):
        nem.kill_node("node9")
    assert [r["phase"] for r in nem.history.records()] == ["invoke", "fail"]
    assert not any(c[1] == "kill" for c in fake.calls), "nothing was injected"


def test_random_target_replays_with_the_same_seed(tmp_path):
    picks = []
    for _ in range(2):
        cluster = Cluster("demo", Docker(runner=FakeDocker()))
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
    fake = FakeDocker(paused={"node1"})
    nem = Nemesis(Cluster("demo", Docker(runner=fake)), history=History("/dev/null"), seed=1)
    with pytest.raises(UsageError, match="already paused"):
        nem.pause("node1")


def test_probe_parsing_finds_agent_workers_and_group_rank():
    procs = parse_probe(PROBE_OUTPUT)
    assert procs.agent_pid == 7 and [w.rank for w in procs.workers] == [2, 3]
    assert procs.group_rank == 1 and procs.worker(local_rank=1).pid == 41
    with pytest.raises(FaultError):
        parse_probe("")
