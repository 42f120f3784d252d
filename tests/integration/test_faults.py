"""Every fault on one real cluster, its effect observed from outside.

One cluster serves the module (sound: each test undoes its fault and waits
until the job trains again). Training-dependent faults come first, network
probes next, etcd last (torch's etcd-v2 agents exit when etcd goes away).
"""

from __future__ import annotations

import json
import time

import pytest

from sim.core.history import FILE_NAME, History
from sim.core.wait import Condition, wait_for
from sim.engines.cluster import Cluster
from sim.faults.nemesis import Nemesis
from tests.conftest import run_sim, unique_name
from tests.integration.netprobe import start_tcp_server, tcp_connects, udp_delivery

pytestmark = pytest.mark.docker
FAST = "last_call_timeout=1,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3"


def eventually(predicate, timeout: float = 60, interval: float = 1.0, what: str = "condition") -> None:
    wait_for(Condition(what, predicate), timeout=timeout, interval=interval)


def process_states(cluster: Cluster, node: str) -> list[str]:
    """Each process's ps STAT in a node, read from the host (a paused node cannot run an exec)."""
    top = cluster.docker.api.top(cluster.container(node).id, ps_args="-o pid,stat")
    return [row[top["Titles"].index("STAT")] for row in top["Processes"]]


@pytest.fixture(scope="module")
def cluster(docker, images):
    name = unique_name("t-faults")
    result = run_sim(
        "up",
        "--name",
        name,
        "--detach",
        "--nodes",
        "3",
        "--max-nodes",
        "4",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "50",
        "--rdzv-conf",
        FAST,
        # torch 2.13's shared rendezvous TCP store makes a node that joins a running
        # job wait forever for the round's MASTER_ADDR (rank 0 publishes it only in
        # its first round): torch's own opt-out, so scale-up can be shown working.
        "--env",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        "--",
        "--steps",
        "1000000",
        "--step-time",
        "0.1",
        "--pg-timeout",
        "15",
        "--ckpt-interval",
        "5",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    yield Cluster(name, docker)
    run_sim("down", name)


def sim(cluster, *args) -> dict:
    result = run_sim(*args, "--name", cluster.name)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[0])


def training(cluster: Cluster, nodes=("node0", "node1", "node2"), per_node: int = 2):
    """Every listed node runs a full worker group (the job has regrouped)."""
    nemesis = Nemesis(cluster)

    def check():
        try:
            return all(len(nemesis.processes(n).workers) == per_node for n in nodes)
        except Exception:
            return False

    return eventually(check, timeout=120, what=f"{nodes} training with {per_node} workers each")


def fault_records(cluster: Cluster, op: str) -> list[dict]:
    return [r for r in History(cluster.run_dir / FILE_NAME).records() if getattr(r, "op", None) == op]


def test_kill_worker_by_global_rank(cluster):
    training(cluster)
    result = sim(cluster, "kill-worker", "--rank", "3")
    node, pid = result["node"], result["pid"]
    phases = [r.phase for r in fault_records(cluster, result["op"])]
    assert phases == ["invoke", "ok"]
    nemesis = Nemesis(cluster)
    # The signalled process is gone, and torchrun noticed.
    eventually(lambda: all(w.pid != pid for w in nemesis.processes(node).workers), 30, what=f"pid {pid} gone")
    eventually(
        lambda: "Worker group FAILED" in cluster.logs(node) or "failed (exitcode: -9)" in cluster.logs(node),
        60,
        what="torchrun logged the worker failure",
    )
    training(cluster)


def test_kill_worker_with_another_signal(cluster):
    training(cluster)
    result = sim(cluster, "kill-worker", "node1", "--local-rank", "0", "--signal", "SEGV")
    assert result["signal"] == "SIGSEGV" and result["node"] == "node1"
    eventually(
        lambda: "Signal 11 (SIGSEGV)" in cluster.logs("node1") or "exitcode: -11" in cluster.logs("node1"),
        60,
        what="torchrun logged SIGSEGV",
    )
    training(cluster)


def test_scale_up_node_joins_the_job(cluster):
    training(cluster)
    result = sim(cluster, "scale", "--nodes", "4")
    assert result["joined"] == ["node3"]
    training(cluster, nodes=("node0", "node1", "node2", "node3"))
    eventually(lambda: '"world_size": 8' in cluster.logs("node3"), 120, what="node3's workers train in a world of 8")
    result = sim(cluster, "scale", "--nodes", "3", "--abrupt")
    assert result["left"] == ["node3"]
    assert [c.node for c in cluster.nodes()] == ["node0", "node1", "node2"]
    training(cluster)


def test_node_kill_then_start_rejoins_with_same_hostname(cluster):
    training(cluster)
    sim(cluster, "kill", "node2")
    info = cluster.container("node2")
    assert info.state == "exited" and info.exit_code == 137
    sim(cluster, "start", "node2")
    assert cluster.exec("node2", "hostname").stdout.strip() == "node2"
    training(cluster)


def test_agent_sigterm_takes_torchruns_graceful_path(cluster):
    training(cluster)
    result = sim(cluster, "kill-agent", "node2", "--signal", "TERM")
    assert result["pid"] and result["signal"] == "SIGTERM"
    eventually(lambda: cluster.container("node2").state == "exited", 60, what="node2's agent exited")
    assert "SIGTERM" in cluster.logs("node2")
    sim(cluster, "restart", "node2")
    training(cluster)


def test_preemption_with_grace(cluster):
    training(cluster)
    result = sim(cluster, "stop", "node2", "--grace", "5s")
    assert result["took"] < 5 + 10
    assert cluster.container("node2").state == "exited"
    sim(cluster, "start", "node2")
    training(cluster)


def test_pause_freezes_every_process_and_unpause_resumes(cluster):
    training(cluster)
    sim(cluster, "pause", "node1")
    states = process_states(cluster, "node1")
    assert states and all(stat[0] in "DT" for stat in states), states  # frozen by the cgroup freezer
    lines_before = cluster.logs("node1").count("\n")
    time.sleep(2)
    assert cluster.logs("node1").count("\n") == lines_before, "a frozen node prints nothing"
    assert any(f.fault == "pause" for f in Nemesis(cluster).active())
    sim(cluster, "unpause", "node1")
    states = process_states(cluster, "node1")
    assert any(stat[0] in "SR" for stat in states), states


def probe_servers(cluster):
    """A TCP probe server on every node (a second start finds the port taken and exits)."""
    for node in ("node0", "node1", "node2"):
        start_tcp_server(cluster, node)
    for src, dst in (("node0", "node1"), ("node1", "node2"), ("node2", "node0")):
        eventually(lambda src=src, dst=dst: tcp_connects(cluster, src, dst), 20, what=f"probe server on {dst}")


def test_partition_cuts_tcp_between_groups_and_heal_restores(cluster):
    probe_servers(cluster)
    result = sim(cluster, "partition", "node0|node1,node2")
    assert not tcp_connects(cluster, "node0", "node1")
    assert not tcp_connects(cluster, "node2", "node0")
    assert tcp_connects(cluster, "node1", "node2")
    sim(cluster, "heal", result["id"])
    assert tcp_connects(cluster, "node0", "node1") and tcp_connects(cluster, "node2", "node0")


def test_cut_from_etcd_only_keeps_peers(cluster):
    probe_servers(cluster)
    sim(cluster, "partition", "--from-etcd", "node2")
    # etcd's own client port is the probe here.
    probe = cluster.exec(
        "node2", "python3", "-c", "import socket; socket.create_connection(('etcd', 2379), timeout=2); print('ok')"
    )
    assert "ok" not in probe.stdout
    assert tcp_connects(cluster, "node2", "node0")
    sim(cluster, "heal", "--all")
    probe = cluster.exec(
        "node2", "python3", "-c", "import socket; socket.create_connection(('etcd', 2379), timeout=2); print('ok')"
    )
    assert "ok" in probe.stdout


def test_one_way_cut_drops_one_direction_only(cluster):
    result = sim(cluster, "partition", "--one-way", "node0", "node1")
    assert udp_delivery(cluster, "node0", "node1", count=200) == 0.0
    assert udp_delivery(cluster, "node1", "node0", count=200) > 0.95
    sim(cluster, "heal", result["id"])
    assert udp_delivery(cluster, "node0", "node1", count=200) > 0.95


def test_packet_loss_is_measured_near_the_setting(cluster):
    sim(cluster, "netem", "node1", "--loss", "30%")
    delivered = udp_delivery(cluster, "node0", "node1", count=1000)
    # 1000 samples at p=0.7: the standard deviation is 1.4 points; the band is wide on purpose.
    assert 0.60 <= delivered <= 0.80, delivered
    sim(cluster, "heal", "--all")
    assert udp_delivery(cluster, "node0", "node1", count=300) > 0.95


def test_bandwidth_limit_slows_a_transfer(cluster):
    sim(cluster, "netem", "node1", "--rate", "1mbit")
    qdisc = cluster.net_exec("node1", "tc", "qdisc", "show").stdout
    assert "tbf" in qdisc and "1Mbit" in qdisc
    send = (
        "import socket, time; s = socket.create_connection(('node0', 39998)); t = time.time(); "
        "s.sendall(b'x' * 250000); s.close(); print(time.time() - t)"
    )
    sink = (
        "import socket; s = socket.socket(); s.bind(('0.0.0.0', 39998)); s.listen(1); c, _ = s.accept()\n"
        "while c.recv(65536): pass"
    )
    cluster.docker.exec(cluster.container("node0").id, ["python3", "-c", sink], detach=True)
    time.sleep(1)
    took = float(cluster.exec("node1", "python3", "-c", send, timeout=60).stdout.strip() or 0)
    assert took > 1.0, f"250 kB at 1 Mbit/s should take about 2 s, took {took:.2f} s"
    sim(cluster, "heal", "--all")
    assert "tbf" not in cluster.net_exec("node1", "tc", "qdisc", "show").stdout


def test_netem_missing_is_one_clear_line(cluster):
    result = run_sim("netem", "node1", "--delay", "100ms", "--name", cluster.name)
    if result.returncode == 0:  # a kernel with netem: then the qdisc must really be there
        assert "netem" in cluster.net_exec("node1", "tc", "qdisc", "show").stdout
        sim(cluster, "heal", "--all")
        return
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no netem qdisc" in result.stderr


def test_bad_fault_input_changes_nothing(cluster):
    for argv, mentions in (
        (["kill", "node9"], "node9"),
        (["pause", "node1", "--for", "3x"], "3x"),
        (["partition", "node0,node0|node1,node2"], "node0"),
        (["bogus-fault"], "bogus-fault"),
    ):
        result = run_sim(*argv, "--name", cluster.name)
        assert result.returncode == 2, (argv, result.stderr)
        assert result.stderr.strip().count("\n") == 0 and mentions in result.stderr, result.stderr
    assert all(c.state == "running" for c in cluster.containers())
    assert Nemesis(cluster).active() == []


def test_etcd_restart_keeps_data_and_wipe_empties_it(cluster):
    put = (
        "import urllib.request as u; r = u.Request('http://127.0.0.1:2379/v2/keys/simprobe', data=b'value=1', "
        "method='PUT', headers={'Content-Type': 'application/x-www-form-urlencoded'}); print(u.urlopen(r).status)"
    )
    get = (
        "import urllib.request as u, urllib.error as e\ntry: print(u.urlopen('http://127.0.0.1:2379/v2/keys/simprobe').status)\n"
        "except e.HTTPError as x: print(x.code)"
    )
    assert cluster.exec("etcd", "python3", "-c", put).stdout.strip() in ("200", "201")
    sim(cluster, "etcd", "restart")
    eventually(lambda: cluster.exec("etcd", "python3", "-c", get).stdout.strip() == "200", 30, what="key kept")
    sim(cluster, "etcd", "wipe")
    eventually(lambda: cluster.exec("etcd", "python3", "-c", get).stdout.strip() == "404", 30, what="key wiped")


def test_etcd_kill_and_pause(cluster):
    sim(cluster, "etcd", "pause")
    assert cluster.container("etcd").state == "paused"
    sim(cluster, "etcd", "unpause")
    sim(cluster, "etcd", "kill")
    assert cluster.container("etcd").state == "exited"
    sim(cluster, "etcd", "start")
    assert cluster.container("etcd").state == "running"
