"""The nemesis against a fake Docker provider: audit records and the exact calls and
commands each fault makes, without Docker (as Blockade tests its net layer)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.core import labels
from sim.core import labels as labels_mod
from sim.core.capabilities import COMPOSE
from sim.core.errors import FaultError, UsageError
from sim.core.faultkinds import kind_of
from sim.core.faultkinds.clock import CLOCK_SCRIPT
from sim.core.history import History
from sim.core.partition import Partition, isolate, split
from sim.engines.cluster import Cluster
from sim.engines.docker import (
    NO_MEMORY_LIMIT,
    PROVIDER_INTERFACES,
    Container,
    ContainerControl,
    ContainerExec,
    Containers,
    Docker,
    DockerProvider,
    ExecResult,
    Resources,
)
from sim.engines.proctable import PROBE_ARGV, parse_probe
from sim.faults import nodescripts
from sim.faults.catalog import FAULTS
from sim.faults.nemesis import Nemesis

NODES = {"etcd": "10.0.0.2", "node0": "10.0.0.3", "node1": "10.0.0.4", "node2": "10.0.0.5"}
PROBE_OUTPUT = "\n".join(
    json.dumps(row)
    for row in [
        {"pid": 1, "ppid": 0, "args": ["/sbin/docker-init", "--", "torchrun", "x"], "env": {}},
        {"pid": 7, "ppid": 1, "args": ["/opt/venv/bin/python3", "/opt/venv/bin/torchrun", "x"], "env": {}},
        {
            "pid": 40,
            "ppid": 7,
            "args": ["/opt/venv/bin/python3", "-u", "train.py"],
            "env": {"RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "WORLD_SIZE": "6"},
        },
        {
            "pid": 41,
            "ppid": 7,
            "args": ["/opt/venv/bin/python3", "-u", "train.py"],
            "env": {"RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "WORLD_SIZE": "6"},
        },
    ]
)


class FakeProvider:
    """The part of the Docker provider the nemesis uses: a cluster of four running containers
    (ids id-NODE), answering execs as a node would; every call is recorded."""

    capabilities = COMPOSE  # a Compose cluster's engine: every fault works

    def __init__(self, paused=(), answers=None):
        self.calls: list[tuple] = []
        self.paused = set(paused)
        self.states: dict[str, str | None] = {}  # node -> a state other than running/paused; None: removed
        self.answers = answers or {}  # the first word after `python3 -c SCRIPT` or `sh -c` -> its ExecResult
        self.limits = Resources(0, 0, 0)

    def containers(self, label_filter: str) -> list[Container]:
        assert label_filter == labels.cluster_filter("demo")
        return [
            Container(
                id=f"id-{node}",
                name=f"c-{node}",
                state=self.states.get(node) or ("paused" if node in self.paused else "running"),
                labels={labels.NODE: node, labels.ROLE: "etcd" if node == "etcd" else "node", labels.RUN: "r1"},
                status="Up",
                exit_code=None,
                ips={"demo_cluster": ip},
            )
            for node, ip in NODES.items()
            if self.states.get(node, "") is not None
        ]

    def exec(self, container, argv, *, user=None, timeout=30, detach=False) -> ExecResult:
        argv = list(argv)
        self.calls.append(("exec", container, argv, user))
        return self._answer(argv)

    def net_exec(self, container, argv, *, image, labels, timeout=30) -> ExecResult:
        argv = list(argv)
        self.calls.append(("net_exec", container, argv, image))
        assert labels[labels_mod.ROLE] == labels_mod.NETNS_HELPER and labels[labels_mod.CLUSTER] == "demo"
        return self._answer(argv)

    def _answer(self, argv: list[str]) -> ExecResult:
        if argv == PROBE_ARGV:
            return ExecResult(0, PROBE_OUTPUT, "")
        if argv[-2:] == ["link", "show"]:
            return ExecResult(0, "2: eth1@if9: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n", "")
        for script, result in self.answers.items():
            if any(script in arg for arg in argv):
                return result
        return ExecResult(0, "", "")

    def resources(self, container):
        return self.limits

    def update_resources(self, container, **limits):
        self.calls.append(("update", container, limits))

    def limit_writes(self, container, path, bps):
        self.calls.append(("limit_writes", container, path, bps))

    # ContainerControl, whole: each verb is recorded with its arguments.
    def kill(self, container, signal="SIGKILL"):
        self.calls.append(("kill", container, signal))

    def pause(self, container):
        self.calls.append(("pause", container))

    def unpause(self, container):
        self.calls.append(("unpause", container))

    def stop(self, container, grace):
        self.calls.append(("stop", container, grace))

    def start(self, container):
        self.calls.append(("start", container))

    def restart(self, container, grace):
        self.calls.append(("restart", container, grace))

    # The rest of Containers: the nemesis lists containers only; the rest is recorded.
    def ids(self, kind, label_filter):
        return [c.id for c in self.containers(label_filter)] if kind == "container" else []

    def labelled(self, kind, label_filter):
        return []

    def remove(self, kind, ids):
        self.calls.append(("remove", kind, ids))

    def inspect(self, container):
        return {"Id": container, "State": {"Status": "running"}}

    def scripts(self, container: str) -> list[str]:
        """The shell scripts run in one container's network namespace (by the helper), in order."""
        return [
            argv[-1]
            for verb, cid, argv, image in (c for c in self.calls if c[0] == "net_exec")
            if cid == container and argv[:2] == ["sh", "-c"]
        ]


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
    assert ("exec", "id-node0", ["kill", "-TERM", "41"], None) in fake.calls  # the workers' own user: no CAP_KILL
    records = list(nem.history.records())
    assert [r.phase for r in records] == ["invoke", "ok"]
    assert records[0].t <= records[1].t and kind_of("kill-worker").read_result(records[1].result).pid == 41


def test_a_failed_fault_is_recorded_as_fail(nemesis):
    nem, fake = nemesis
    with pytest.raises(UsageError, match="node9"):
        nem.kill_node("node9")
    assert [r.phase for r in nem.history.records()] == ["invoke", "fail"]
    assert not any(c[0] == "kill" for c in fake.calls), "nothing was injected"


def test_random_target_replays_with_the_same_seed(tmp_path):
    picks = []
    for _ in range(2):
        cluster = Cluster("demo", FakeProvider())
        picks.append(
            [Nemesis(cluster, history=History(tmp_path / "h.jsonl"), seed=42).resolve("random") for _ in range(5)]
        )
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
    assert [f.fault for f in nem.active()] == ["partition"]
    nem.heal()
    assert nem.active() == []
    assert fake.scripts("id-node2")[-1].rstrip().endswith("iptables -w -F SIM-PARTITION")


def test_a_partition_whose_rules_fail_is_forgotten_and_the_others_applied_again(nemesis):
    """The partition kind's inject fails (iptables refused in etcd): its intent is forgotten and the partitions
    left in force are applied again (undo_on_failure), so no half of it stays in any node."""
    nem, fake = nemesis
    everyone = ["node0", "node1", "node2", "etcd"]
    first = nem.partition(isolate(["node2"], everyone))
    # Only a node that drops both node1 (10.0.0.4) and node2 (10.0.0.5) runs this: the union with node1 cut.
    both = "-s 10.0.0.4 -j DROP\niptables -w -A SIM-PARTITION -s 10.0.0.5"
    fake.answers[both] = ExecResult(1, "", "iptables: No chain/target/match by that name.")
    with pytest.raises(FaultError, match=r"^etcd: applying partition rules failed: iptables: No chain"):
        nem.partition(isolate(["node1"], everyone))  # node1 is 10.0.0.4
    assert [f.id for f in nem.active()] == [first["id"]]
    for node in everyone:
        script = fake.scripts(f"id-{node}")[-1]
        assert "10.0.0.4 -j DROP" not in script or node == "node2", node  # only the first's rules
    assert "-d 10.0.0.5 -j DROP" in fake.scripts("id-etcd")[-1]
    records = [(r.fault, r.target, r.phase) for r in nem.history.records()]
    assert records[2:] == [
        ("partition", "node1 | node0,node2,etcd", "invoke"),
        ("partition", "node1 | node0,node2,etcd", "fail"),
    ]


def test_heal_is_carried_out_as_a_kind_and_recorded_as_before(nemesis):
    """Heal has an act (sim/core/faultkinds/network.py): the same invoke and ok records as the verb it was."""
    nem, fake = nemesis
    nem.link("node1", loss_pct=10)
    assert nem.heal("link-node1") == {"op": list(nem.history.records())[-1].op, "healed": ["link-node1"]}
    nem.heal()
    heals = [r for r in nem.history.records() if r.fault == "heal"]
    assert [
        (r.target, r.phase, r.args if r.phase == "invoke" else kind_of(r.fault).read_result(r.result).healed)
        for r in heals
    ] == [
        ("link-node1", "invoke", {}),
        ("link-node1", "ok", ("link-node1",)),
        ("all", "invoke", {}),
        ("all", "ok", ()),
    ]
    with pytest.raises(UsageError, match="netem: nothing to degrade"):
        nem.link("node1")


def test_network_commands_run_only_from_the_helper_never_in_the_node_image(nemesis):
    """iptables, tc and ip run in the helper that joins the node's namespace (Cluster.net_exec, our base image):
    the node's own image (a team's, from --image) needs none of them."""
    nem, fake = nemesis
    fake.answers["route"] = ExecResult(0, "10.0.0.3 dev eth1 src 10.0.0.2 uid 0\n    cache\n", "")
    nem.partition(isolate(["node2"], ["node0", "node1", "node2", "etcd"]))
    nem.link("node1", loss_pct=30)
    nem.link("node0", netem={"delay_ms": 100})
    nem.heal()
    helper_calls = [c for c in fake.calls if c[0] == "net_exec"]
    assert {c[1] for c in helper_calls} == {"id-node0", "id-node1", "id-node2", "id-etcd"}
    assert {c[3] for c in helper_calls} == {nem.cluster.helper_image} and "/base:" in nem.cluster.helper_image
    assert ("net_exec", "id-node0", ["ip", "-o", "route", "get", "10.0.0.2"], nem.cluster.helper_image) in fake.calls
    assert any("tc qdisc replace dev eth1 root netem delay 100ms" in s for s in fake.scripts("id-node0"))
    words = ("iptables", "tc ", "ip ")
    assert not [c for c in fake.calls if c[0] == "exec" and any(w in " ".join(c[2]) for w in words)]


def test_two_partitions_apply_as_their_union(nemesis):
    nem, fake = nemesis
    nodes = ["node0", "node1", "node2"]
    first = nem.partition(split([["node0"], ["node1", "node2"]], nodes))
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
    assert [f.id for f in nem.active()] == ["link-node1"]


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
        ("kill", "id-node1", "SIGKILL"),
        ("stop", "id-node2", 5),
        ("restart", "id-node0", 2),
        ("start", "id-node2"),
    ]


def test_scale_down_stops_the_highest_nodes_and_removes_them(nemesis):
    nem, fake = nemesis
    result = nem.scale(1, abrupt=True)
    assert result == {"op": result["op"], "joined": [], "left": ["node2", "node1"], "abrupt": True}
    assert [c for c in fake.calls if c[0] != "exec"] == [
        ("kill", "id-node2", "SIGKILL"),
        ("remove", "container", ["id-node2"]),
        ("kill", "id-node1", "SIGKILL"),
        ("remove", "container", ["id-node1"]),
    ]


def test_every_reversible_faults_ok_record_carries_its_id(nemesis):
    nem, fake = nemesis
    nem.pause("node1")
    nem.link("node2", loss_pct=10)
    nem.partition(isolate(["node0"], ["node0", "node1", "node2"]))
    oks = [r for r in nem.history.records() if r.phase == "ok"]
    assert [r.result.id for r in oks] == ["pause-node1", "link-node2", nem.active()[-1].id]
    assert ("pause", "id-node1") in fake.calls
    assert sorted(f.id for f in nem.active()) == sorted(r.result.id for r in oks)


def test_the_fault_store_loses_nothing_to_concurrent_writers(nemesis):
    import threading

    nem, _ = nemesis
    threads = [
        threading.Thread(target=nem._remember, args=({"id": f"f{i}", "fault": "pause", "target": "x"},))
        for i in range(20)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(f.id for f in nem.active()) == sorted(f"f{i}" for i in range(20))


# ---------------------------------------------------------------- faults inside a node


def test_hang_worker_stops_one_process_and_resume_continues_it(nemesis):
    nem, fake = nemesis
    result = nem.hang_worker("node0", local_rank=1)
    assert (result["id"], result["pid"]) == ("hang-node0-41", 41)
    assert ("exec", "id-node0", ["kill", "-STOP", "41"], None) in fake.calls
    assert [f.id for f in nem.active()] == ["hang-node0-41"]
    nem.heal("hang-node0-41")
    assert ("exec", "id-node0", ["kill", "-CONT", "41"], None) in fake.calls and nem.active() == []
    nem.hang_worker("node0", local_rank=0)
    nem.resume_worker("node0")
    assert [c[2] for c in fake.calls if c[2][:2] == ["kill", "-CONT"]][-2:] == [
        ["kill", "-CONT", "40"],
        ["kill", "-CONT", "41"],
    ]
    assert nem.active() == []


def test_slow_node_sets_a_cpu_quota_and_heal_restores_the_old_one(nemesis):
    nem, fake = nemesis
    fake.limits = Resources(cpu_quota=0, cpu_period=0, memory=0)
    result = nem.slow_node("node1", cpus=0.2)
    assert result["id"] == "slow-node-node1"
    assert fake.calls[-1] == ("update", "id-node1", {"cpu_quota": 20000, "cpu_period": 100000})
    with pytest.raises(UsageError, match="already slowed"):
        nem.slow_node("node1", cpus=0.5)
    nem.heal("slow-node-node1")
    assert [c for c in fake.calls if c[0] == "update"][-1] == (
        "update",
        "id-node1",
        {"cpu_quota": -1, "cpu_period": 100000},
    )


def oom_answers(died: bool) -> dict:
    return {
        "/sys/fs/cgroup/memory.current 2>/dev/null || cat /sys/fs/cgroup/memory/memory.usage_in_bytes": ExecResult(
            0, f"{500 * 2**20}\n", ""
        ),
        nodescripts.HOG: ExecResult(0, json.dumps({"allocated": 2**26, "worker_died": died}), ""),
    }


def test_oom_worker_limits_memory_only_while_the_hog_runs(nemesis):
    nem, fake = nemesis
    fake.answers = oom_answers(died=True)
    result = nem.oom_worker("node0", local_rank=0)
    limit = 500 * 2**20 + 64 * 2**20
    assert (result["pid"], result["limit"], result["limit_kept"]) == (40, limit, False)
    assert ("exec", "id-node0", ["sh", "-c", "echo 1000 > /proc/40/oom_score_adj"], None) in fake.calls
    hog = next(c for c in fake.calls if c[0] == "exec" and nodescripts.HOG in c[2])
    assert hog[2][-3:] == ["40", str(2 * limit), "30.0"]
    updates = [c[2] for c in fake.calls if c[0] == "update"]
    assert updates == [{"memory": limit}, {"memory": NO_MEMORY_LIMIT}]


def test_oom_worker_keeps_a_nodes_own_limit_and_fails_when_the_worker_survives(nemesis):
    nem, fake = nemesis
    fake.limits = Resources(0, 0, 2**30)  # `memory: 1g` in the spec
    fake.answers = oom_answers(died=False)
    with pytest.raises(FaultError, match="worker 40 survived 64 MiB allocated over a 1024 MiB limit"):
        nem.oom_worker("node0", local_rank=0)
    assert not any(c[0] == "update" for c in fake.calls)
    assert [r.phase for r in nem.history.records()] == ["invoke", "fail"]


def test_oom_worker_lowers_a_default_limit_for_the_hog_and_puts_it_back(nemesis, monkeypatch):
    """A node's default limit (no `memory` in the spec) bounds a runaway node, far above its use: the
    hog would have to fill it all, so the fault lowers it for the while and restores it."""
    from sim.core.spec import ClusterSpec

    nem, fake = nemesis
    monkeypatch.setattr(Cluster, "spec", property(lambda self: ClusterSpec(name="demo", nodes=2)))
    fake.limits = Resources(0, 0, 8 * 2**30)
    fake.answers = oom_answers(died=True)
    result = nem.oom_worker("node0", local_rank=0)
    limit = 500 * 2**20 + 64 * 2**20
    assert (result["limit"], result["limit_kept"]) == (limit, False)
    assert [c[2] for c in fake.calls if c[0] == "update"] == [{"memory": limit}, {"memory": 8 * 2**30}]


def test_oom_worker_keeps_a_default_limit_already_below_use_and_headroom(nemesis, monkeypatch):
    from sim.core.spec import ClusterSpec

    nem, fake = nemesis
    monkeypatch.setattr(Cluster, "spec", property(lambda self: ClusterSpec(name="demo", nodes=2)))
    fake.limits = Resources(0, 0, 520 * 2**20)
    fake.answers = oom_answers(died=True)
    result = nem.oom_worker("node0", local_rank=0)
    assert (result["limit"], result["limit_kept"]) == (520 * 2**20, True)
    assert not any(c[0] == "update" for c in fake.calls)


def test_oom_worker_keeps_the_specs_own_memory(nemesis, monkeypatch):
    from sim.core.spec import ClusterSpec

    nem, fake = nemesis
    monkeypatch.setattr(Cluster, "spec", property(lambda self: ClusterSpec(name="demo", nodes=2, memory="4g")))
    fake.limits = Resources(0, 0, 4 * 2**30)
    fake.answers = oom_answers(died=True)
    assert nem.oom_worker("node0", local_rank=0)["limit_kept"]
    assert not any(c[0] == "update" for c in fake.calls)


def test_corrupt_checkpoint_runs_its_script_and_records_the_damage(nemesis):
    nem, fake = nemesis
    fake.answers = {
        nodescripts.CORRUPT: ExecResult(
            0, json.dumps({"file": "/ckpt/ckpt-00000040.pt", "size": 9000, "mode": "truncate", "new_size": 4500}), ""
        )
    }
    result = nem.corrupt_checkpoint("node1", mode="truncate")
    assert (result["file"], result["new_size"], result["node"]) == ("/ckpt/ckpt-00000040.pt", 4500, "node1")
    argv = next(c[2] for c in fake.calls if c[0] == "exec" and nodescripts.CORRUPT in c[2])
    assert argv[3:5] == ["/ckpt", "truncate"] and argv[5].isdigit()


def test_fill_disk_refuses_an_unlimited_disk_and_heal_removes_its_filler(nemesis):
    nem, fake = nemesis
    fake.answers = {nodescripts.FILL: ExecResult(3, "", "/ckpt has 90000 MiB free: not a size-limited disk")}
    with pytest.raises(UsageError, match="not a size-limited disk; give the cluster a size-limited one"):
        nem.fill_disk("node1")
    fake.answers = {
        nodescripts.FILL: ExecResult(0, json.dumps({"file": "/ckpt/.sim-filler", "written": 2**26, "free": 0}), "")
    }
    assert nem.fill_disk("node1")["id"] == "fill-node1"
    nem.heal("fill-node1")
    assert ("exec", "id-node1", ["rm", "-f", "/ckpt/.sim-filler"], None) in fake.calls and nem.active() == []


def test_kill_during_checkpoint_reports_the_write_it_cut_or_that_none_came(nemesis):
    nem, fake = nemesis
    fake.answers = {
        nodescripts.KILL_IN_WRITE: ExecResult(
            0, json.dumps({"pid": 40, "file": "/ckpt/ckpt-00000020.pt.tmp.40", "size_at_kill": 4096}), ""
        )
    }
    result = nem.kill_during_checkpoint("node0", within=5)
    assert (result["pid"], result["signal"]) == (40, "SIGKILL")
    fake.answers = {nodescripts.KILL_IN_WRITE: ExecResult(4, "", "no worker opened a file under /ckpt/ for writing")}
    with pytest.raises(FaultError, match="no worker opened a file"):
        nem.kill_during_checkpoint("node0", within=5)


def test_an_in_write_fault_on_rank0_waits_for_the_restarted_groups_rank0(nemesis, monkeypatch):
    nem, fake = nemesis
    fake.answers = {nodescripts.KILL_IN_WRITE: ExecResult(0, json.dumps({"pid": 40, "file": "/ckpt/c.pt"}), "")}
    looked = []

    def resolve(target, allow_etcd=True):
        looked.append(target)
        if len(looked) < 3:
            raise FaultError("target 'rank0': no running node has a worker group of rank 0 right now")
        return "node1"

    monkeypatch.setattr(nem, "resolve", resolve)
    monkeypatch.setattr("sim.faults.processes.time.sleep", lambda s: None)
    assert nem.kill_during_checkpoint("rank0", within=5)["node"] == "node1" and len(looked) == 3
    looked.clear()
    monkeypatch.setattr(
        "sim.faults.processes.time.monotonic", iter(range(0, 1000, 10)).__next__
    )  # past `within` at once
    with pytest.raises(FaultError, match="no running node has a worker group of rank 0"):
        nem.kill_during_checkpoint("rank0", within=5)


# The node scripts themselves, run here on local files and processes (they are stdlib Python).


def run_script(script: str, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=30, env=env
    )


def test_corrupt_script_damages_the_newest_file_only(tmp_path):
    (tmp_path / "old.pt").write_bytes(b"a" * 100)
    time.sleep(0.01)
    (tmp_path / "new.pt").write_bytes(b"a" * 100)
    (tmp_path / "new.pt.tmp.9").write_bytes(b"a" * 100)  # a write in progress is not a checkpoint yet
    done = json.loads(run_script(nodescripts.CORRUPT, tmp_path, "bitflip", 1).stdout)
    assert done["file"] == str(tmp_path / "new.pt") and len(done["offsets"]) == 8
    assert (tmp_path / "new.pt").read_bytes() != b"a" * 100 and (tmp_path / "old.pt").read_bytes() == b"a" * 100
    run_script(nodescripts.CORRUPT, tmp_path, "truncate", 1)
    assert (tmp_path / "new.pt").stat().st_size == 50
    assert run_script(nodescripts.CORRUPT, tmp_path / "none", "truncate", 1).returncode == nodescripts.WRONG_REQUEST


def test_fill_script_refuses_a_folder_off_the_checkpoint_tmpfs(tmp_path):
    # Here no /ckpt tmpfs is mounted: any folder is off the cluster's own size-limited storage.
    refused = run_script(nodescripts.FILL, tmp_path, 0, 2**40)
    assert refused.returncode == nodescripts.WRONG_REQUEST
    assert "not on the cluster's size-limited checkpoint storage" in refused.stderr
    assert not (tmp_path / ".sim-filler").exists()


def test_kill_in_write_script_kills_the_worker_that_opens_a_file_for_writing(tmp_path):
    worker_env = {**os.environ, "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "t"}
    # The reader's file exists before it starts: creating it there (an open for append, a write) once let a
    # loaded machine's watcher, started before the reader closed it, take the reader for the writer.
    (tmp_path / "a").touch()
    reader = subprocess.Popen(
        [sys.executable, "-c", f"import time; g = open({str(tmp_path / 'a')!r}); time.sleep(30)"],
        env=worker_env,
    )
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; time.sleep(1); f = open({str(tmp_path / 'ckpt.tmp')!r}, 'wb'); time.sleep(30)",
        ],
        env=worker_env,
    )
    try:
        watched = run_script(nodescripts.KILL_IN_WRITE, tmp_path, 10, int(signal.SIGKILL))
        assert watched.returncode == 0, watched.stderr
        assert json.loads(watched.stdout)["pid"] == writer.pid
        assert writer.wait(5) == -signal.SIGKILL and reader.poll() is None, "only the writer is killed"
    finally:
        reader.kill(), writer.kill()
    assert run_script(nodescripts.KILL_IN_WRITE, tmp_path, 0.2, 9).returncode == nodescripts.NEVER_CAME


def _rss_mib(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) // 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)


def test_hog_script_stops_once_the_worker_is_gone():
    # The worker is killed once the hog is seen holding memory (not after a fixed delay: a loaded machine
    # once took longer than 0.2 s to start the hog's interpreter, the worker was gone before its first
    # allocation, and it held nothing). The hog takes at most 8 MiB per 5 ms: 4 GiB is at least 2.5 s away.
    worker = subprocess.Popen(["sleep", "30"])
    hog = subprocess.Popen(
        [sys.executable, "-c", nodescripts.HOG, str(worker.pid), str(2**32), "10"], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 20
    while _rss_mib(hog.pid) < 64 and hog.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    worker.kill()
    out, _ = hog.communicate(timeout=30)
    worker.wait()
    done = json.loads(out)
    assert done["worker_died"] is True and 0 < done["allocated"] < 2**32


def test_oom_worker_looks_for_itself_when_the_hog_was_killed_too(nemesis):
    nem, fake = nemesis
    fake.answers = {**oom_answers(died=True), nodescripts.HOG: ExecResult(137, "", "")}
    # The probe still lists pid 40 (the fake node never changes): the worker survived.
    with pytest.raises(FaultError, match="worker 40 survived 0 MiB"):
        nem.oom_worker("node0", local_rank=0)
    assert [c[2] for c in fake.calls if c[0] == "update"][-1] == {"memory": NO_MEMORY_LIMIT}


def test_hang_collectives_holds_a_worker_through_a_file_and_heal_removes_it(nemesis):
    nem, fake = nemesis
    result = nem.hang_collectives("node0", local_rank=0)
    assert (result["id"], result["file"]) == ("stall-node0-40", "/tmp/elastic-sim-hang-40")
    assert ("exec", "id-node0", ["touch", "/tmp/elastic-sim-hang-40"], None) in fake.calls
    nem.heal("stall-node0-40")
    assert ("exec", "id-node0", ["rm", "-f", "/tmp/elastic-sim-hang-40"], None) in fake.calls and nem.active() == []


def test_the_instrumentation_holds_a_worker_while_the_hang_file_exists(tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images" / "node"))
    import elastic_sim_instrument as instrument

    assert instrument.HANG_FILE == nodescripts.COLLECTIVE_HANG_FILE
    monkeypatch.setattr(instrument, "HANG_FILE", str(tmp_path / "hang-{pid}"))
    probe = instrument.WorkerProbe(lambda event, **fields: True)
    hang_file = Path(instrument.HANG_FILE.format(pid=probe.pid))
    hang_file.touch()
    slept = []
    probe._sleep = lambda s: slept.append(s) if len(slept) < 3 else hang_file.unlink()
    probe.hold_while_hung()
    assert len(slept) == 3 and not hang_file.exists()
    probe.hold_while_hung()  # checked again only after HANG_CHECK_GAP_S


def test_a_hang_file_left_by_an_older_process_with_the_same_pid_holds_nothing(tmp_path, monkeypatch):
    """tour-v3 [etcd-v3] in CI: node2's worker pid 16 stalled (hang-collectives), the job went on without it;
    node2 was stopped and started again, and its new worker got pid 16 too (a fresh pid namespace), found the
    stall's file in /tmp (the container's own, kept across restarts) and held forever. A new process removes
    a hang file named by its pid: the fault only holds a worker it saw running."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images" / "node"))
    import elastic_sim_instrument as instrument

    monkeypatch.setattr(instrument, "HANG_FILE", str(tmp_path / "hang-{pid}"))
    stale = Path(instrument.HANG_FILE.format(pid=os.getpid()))
    stale.touch()
    probe = instrument.WorkerProbe(lambda event, **fields: True)
    assert not stale.exists()
    probe._sleep = lambda s: pytest.fail("held by a stale hang file")
    probe.hold_while_hung()


def answer_slow_and_fill(fake: FakeProvider) -> None:
    """Node limits to slow from, and a fill-disk script that filled /ckpt (the shared volume)."""
    fake.limits = Resources(cpu_quota=0, cpu_period=0, memory=0)
    fake.answers = {
        nodescripts.FILL: ExecResult(0, json.dumps({"file": "/ckpt/.sim-filler", "written": 2**26, "free": 0}), "")
    }


def test_heal_forgets_what_a_stopped_or_removed_node_took_along_and_undoes_what_it_kept(nemesis):
    """A link fault and a held worker die with the container's namespace and processes; a CPU quota stays
    with a stopped container, and a filler on the shared /ckpt volume outlives any container."""
    nem, fake = nemesis
    answer_slow_and_fill(fake)
    nem.link("node2", loss_pct=10)
    nem.slow_node("node1", cpus=0.5)
    nem.fill_disk("node1")
    nem.hang_collectives("node1", local_rank=0)
    fake.states = {"node2": None, "node1": "exited"}  # scaled away; killed
    fake.calls.clear()
    assert sorted(nem.heal()["healed"]) == ["fill-node1", "link-node2", "slow-node-node1", "stall-node1-40"]
    assert nem.active() == []
    assert ("update", "id-node1", {"cpu_quota": -1, "cpu_period": 100000}) in fake.calls
    assert [c for c in fake.calls if c[0] == "exec" and c[2][:2] == ["rm", "-f"]] == [
        ("exec", "id-node0", ["rm", "-f", "/ckpt/.sim-filler"], None)  # the filler, from a node that runs
    ]
    assert not any(c[0] == "exec" and c[1] in ("id-node1", "id-node2") for c in fake.calls)


def test_heal_keeps_in_force_what_a_stopped_node_still_holds_and_heals_the_rest(nemesis):
    nem, fake = nemesis
    fake.answers = {CLOCK_SCRIPT: ExecResult(0, "59.99982\n", "")}
    _skew(nem, "node2", by=60)
    nem.link("node1", loss_pct=10)
    fake.states = {"node2": "exited"}
    with pytest.raises(FaultError) as error:
        nem.heal()
    assert str(error.value) == (
        "healed link-node1; still in force: skew-clock-node2 "
        "(node2 is exited; `sim start node2`, then `sim heal skew-clock-node2`)"
    )
    assert [f.id for f in nem.active()] == ["skew-clock-node2"]
    fake.states = {}
    assert nem.heal("skew-clock-node2")["healed"] == ["skew-clock-node2"] and nem.active() == []


def test_a_partition_outlives_its_cut_off_node_being_killed_and_names_must_exist(nemesis):
    """A partition isolating node2, then node2 killed: other faults and partitions still apply (node2 has no
    address, nothing to drop for it), and its start re-applies the rules with its address."""
    nem, fake = nemesis
    everyone = ["node0", "node1", "node2", "etcd"]
    nem.partition(isolate(["node2"], everyone))
    fake.states = {"node2": "exited"}
    fake.calls.clear()
    nem.partition(isolate(["node1"], ["node0", "node1", "etcd"]))  # once: "no address for node2"
    node0 = fake.scripts("id-node0")[-1]
    assert "-s 10.0.0.4 -j DROP" in node0 and "10.0.0.5" not in node0
    assert not any(c[1] == "id-node2" for c in fake.calls if c[0] in ("exec", "net_exec"))
    fake.states = {}
    nem.start_node("node2")
    assert "-s 10.0.0.5 -j DROP" in fake.scripts("id-node0")[-1]
    with pytest.raises(
        UsageError, match=r"^partition: no node7 in cluster 'demo' \(there: node0, node1, node2, etcd\)"
    ):
        nem.partition(Partition(frozenset({("node7", "node0")})))


def test_faults_that_end_with_a_nodes_processes_are_forgotten_when_it_stops_restarts_or_leaves(nemesis):
    nem, fake = nemesis
    answer_slow_and_fill(fake)
    nem.link("node1", loss_pct=10)
    nem.slow_node("node1", cpus=0.5)
    nem.kill_node("node1")
    assert [f.id for f in nem.active()] == ["slow-node-node1"]  # a stopped container keeps its quota
    nem.pause("node0")
    nem.restart_node("node0")
    assert [f.id for f in nem.active()] == ["slow-node-node1"]
    nem.link("node2", loss_pct=10)
    nem.fill_disk("node2")
    nem.scale(2)  # node2 removed: its link went with it, the filler on the shared /ckpt did not
    assert [f.id for f in nem.active()] == ["slow-node-node1", "fill-node2"]


def test_a_held_fault_that_ended_with_its_node_needs_no_undo_when_its_hold_ends(nemesis):
    from sim.faults.catalog import FAULTS

    nem, fake = nemesis
    held = nem.link("node1", loss_pct=10)
    nem.kill_node("node1")  # the link fault went with node1's network namespace
    fake.calls.clear()
    assert FAULTS["netem"].end_hold(nem, held) == {"id": "link-node1", "ended": "no longer in force"}
    assert fake.calls == [] and not any(r.op and getattr(r, "fault", None) == "heal" for r in nem.history.records())
    held = nem.link("node2", loss_pct=10)
    assert FAULTS["netem"].end_hold(nem, held)["healed"] == ["link-node2"]  # still in force: healed


def _members(protocol) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_fake_provider_implements_the_interfaces_the_nemesis_takes_whole():
    """The nemesis takes containers, their control and exec (sim.engines.docker's small interfaces): the fake is
    each of them whole, not the part one test happened to call."""
    for protocol in (Containers, ContainerControl, ContainerExec):
        missing = {name for name in _members(protocol) if name not in vars(FakeProvider)}
        assert not missing, f"FakeProvider lacks {protocol.__name__}.{sorted(missing)}"


def test_the_full_provider_is_the_small_interfaces_and_nothing_else():
    whole = set().union(*(_members(p) for p in PROVIDER_INTERFACES))
    assert _members(DockerProvider) == set()  # nothing of its own
    assert all(callable(getattr(Docker, name, None)) or name in ("compose_argv", "cli_env") for name in whole)


@pytest.mark.parametrize("directory", ["/sim/events", "/ckpt/../sim/events", "ckpt", "/", "/tmp", "/ckptx"])
def test_fill_disk_goes_only_on_the_checkpoint_storage(nemesis, directory):
    nem, fake = nemesis
    with pytest.raises(UsageError, match=f"--dir '{re.escape(directory)}': fill-disk fills only"):
        nem.fill_disk("node1", directory=directory)
    assert not any(c[0] in ("exec", "net_exec") for c in fake.calls) and not list(nem.history.records())


def test_fill_disk_refuses_a_cluster_without_ckpt_size(nemesis, monkeypatch):
    from sim.core.spec import ClusterSpec

    nem, fake = nemesis
    monkeypatch.setattr(Cluster, "spec", property(lambda self: ClusterSpec(name="demo", nodes=2)))
    with pytest.raises(UsageError, match="no size-limited checkpoint storage; start it with --ckpt-size"):
        nem.fill_disk("node1")
    assert not any(c[0] == "exec" for c in fake.calls)


def test_two_slow_node_at_once_one_refused_and_the_limits_to_restore_are_the_nodes_own(nemesis, tmp_path):
    """The check, the "before" value and the record under the store's one lock (issue 26, finding 6)."""
    nem, fake = nemesis
    fake.limits = Resources(0, 0, 0)
    applied = threading.Event()

    def update(container, **limits):  # the first quota lands while the second command reads "before"
        fake.calls.append(("update", container, limits))
        fake.limits = Resources(limits["cpu_quota"], limits["cpu_period"], 0)
        applied.set()
        time.sleep(0.2)

    fake.update_resources = update
    outcomes = []

    def slow():
        other = Nemesis(nem.cluster, history=History(tmp_path / "h2.jsonl"), seed=1)
        try:
            outcomes.append(other.slow_node("node1", cpus=0.1))
        except UsageError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(type(o).__name__ for o in outcomes) == ["UsageError", "dict"]
    assert "already slowed" in str(next(o for o in outcomes if isinstance(o, UsageError)))
    (fault,) = nem.active()
    assert (fault.cpu_quota, fault.cpu_period) == (0, 0)  # the node's own, not the other's 10000


def test_a_fault_is_in_the_store_before_it_acts_and_a_timed_out_exec_is_info(nemesis):
    from sim.engines.docker import ExecTimeout

    nem, fake = nemesis
    seen = []

    def timing_out(container, argv, **_):
        seen.append([f.id for f in nem.active()])
        raise ExecTimeout("`sh -c ...` in container id-node1 did not finish within 30s")

    fake.exec = timing_out
    with pytest.raises(ExecTimeout):
        _skew(nem, "node1", by=5.0)
    assert seen == [["skew-clock-node1"]]  # recorded before it acted
    assert [f.id for f in nem.active()] == ["skew-clock-node1"]  # outcome unknown: `heal --all` sees it
    assert [r.phase for r in nem.history.records()] == ["invoke", "info"]


def _skew(nem, target: str, *, by: float) -> dict:
    entry = FAULTS["skew-clock"]
    return entry.invoke(nem, entry.make_options({"target": target, "by": by}))


def test_faults_an_older_sim_recorded_as_skew_and_slow_are_still_listed_refused_twice_and_healed(nemesis):
    """Before the in-force names were the kinds' own (issue 38), a running cluster's file said "skew" and
    "slow", with ids skew-node1 and slow-node2: they are read as skew-clock and slow-node, kept by their ids."""
    nem, fake = nemesis
    nem.store.path.parent.mkdir(parents=True, exist_ok=True)
    older = [
        {"id": "skew-node1", "fault": "skew", "target": "node1", "since": 1.0, "detail": "clock +60 s"},
        {
            "id": "slow-node2",
            "fault": "slow",
            "target": "node2",
            "since": 1.0,
            "cpu_quota": 50000,
            "cpu_period": 100000,
        },
    ]
    nem.store.path.write_text(json.dumps(older))
    assert [(f.id, f.fault) for f in nem.active()] == [("skew-node1", "skew-clock"), ("slow-node2", "slow-node")]
    with pytest.raises(UsageError, match="node2: already slowed; `sim heal slow-node2` first"):
        nem.slow_node("node2", cpus=0.1)  # the older record is the same fault: not a second quota over it
    with pytest.raises(UsageError, match="its clock is skewed already"):
        entry = FAULTS["skew-clock"]
        entry.invoke(nem, entry.make_options({"target": "node1", "by": 5}))
    fake.answers = {CLOCK_SCRIPT: ExecResult(0, "0.0001\n", "")}
    assert nem.heal("skew-node1")["healed"] == ["skew-node1"]
    assert [c[2][4] for c in fake.calls if c[0] == "exec" and CLOCK_SCRIPT in c[2]] == ["+0.000"]
    assert nem.heal()["healed"] == ["slow-node2"]
    assert [c for c in fake.calls if c[0] == "update"][-1] == (
        "update",
        "id-node2",
        {"cpu_quota": 50000, "cpu_period": 100000},
    )
    assert nem.active() == []
