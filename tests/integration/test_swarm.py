"""`sim up --engine swarm` on this machine's engine: a real one-host swarm, real etcd, torchrun, faults.

The swarm is made by `up` when the engine is in none, and left by `down`; a swarm that was there
before is kept (docs/SWARM.md)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sim.core import labels
from sim.core.agentlog import parse_node_log
from sim.core.history import AgentRecord
from sim.core.wait import Condition, wait_for
from sim.engines.cluster import Cluster, JobFinished
from sim.engines.engine import choose_engine
from sim.engines.swarm import GWBRIDGE, swarm_state
from sim.faults.nemesis import Nemesis
from tests.conftest import run_sim, unique_name

# In `make test-full`: a swarm's init and leave must not run beside Compose clusters (docs/SWARM.md),
# and pytest runs one test at a time.
pytestmark = [pytest.mark.docker, pytest.mark.full]
JOB = ["--", "--steps", "300", "--step-time", "0.2", "--ckpt-interval", "10"]
# A node that joins a running job waits forever on torch 2.13's shared rendezvous store (README,
# "Known torch behaviour"): the restarted node1 must be able to join.
NO_SHARED_STORE = ["--env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]


def services(name: str) -> list[str]:
    out = subprocess.run(
        [
            "docker",
            "service",
            "ls",
            "--filter",
            f"label={labels.CLUSTER}={name}",
            "--format",
            "{{.Name}} {{.Replicas}}",
        ],
        capture_output=True,
        text=True,
    )
    return sorted(line for line in out.stdout.split("\n") if line) if out.returncode == 0 else []


def has_gwbridge(docker) -> bool:
    return bool(docker.api.networks(names=[GWBRIDGE]))


def test_swarm_cluster_survives_worker_and_node_crash_and_restart_and_down_leaves_nothing(docker, images):
    before, gwbridge_before = swarm_state(docker)[0], has_gwbridge(docker)
    name = unique_name("sw-t")
    result = run_sim(
        "up",
        "--engine",
        "swarm",
        "--name",
        name,
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--detach",
        *NO_SHARED_STORE,
        *JOB,
    )
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert swarm_state(docker)[0] == "active"
        assert services(name) == [f"{name}_etcd 1/1", f"{name}_node0 1/1", f"{name}_node1 1/1"]
        (network,) = docker.api.networks(filters={"label": f"{labels.CLUSTER}={name}"})
        assert network["Driver"] == "overlay" and network["Attachable"]

        killed = run_sim("kill-worker", "--name", name, "node1")
        assert killed.returncode == 0, killed.stderr
        cluster = Cluster(name, docker)
        restarted = Condition("node1's agent restarts its workers", lambda: _groups_started(cluster, "node1") >= 2)
        wait_for(restarted, timeout=120, interval=2)

        crashed = run_sim("kill", "--name", name, "node1")
        assert crashed.returncode == 0, crashed.stderr
        time.sleep(10)
        # Restart policy none: Swarm leaves the crashed node down; the fault stays ours.
        assert f"{name}_node1 0/1" in services(name)
        assert [c.state for c in cluster.nodes() if c.node == "node1"] == ["exited"]

        logs = run_sim("logs", "--name", name, "node0")
        assert logs.returncode == 0 and f"{name}_node0.1." in logs.stdout + logs.stderr, logs.stderr[-2000:]

        # Started through Swarm: a new task that its DNS names, so node0 can reach it again.
        Nemesis(choose_engine(docker, name=name).cluster(name)).start_node("node1")
        assert f"{name}_node1 1/1" in services(name)
        assert cluster.exec("node0", "getent", "hosts", "node1").ok
        assert [c.state for c in cluster.nodes() if c.node == "node1"] == ["running"]

        wait_for(JobFinished(cluster), timeout=400, interval=3)
        for node in cluster.nodes():
            assert node.exit_code == 0, cluster.logs(node.node, tail=40)
        summary = [r for r in parse_node_log("node0", cluster.logs("node0")) if getattr(r, "kind", None) == "summary"]
        assert [s.final_step for s in summary] == [300]
    finally:
        down = run_sim("down", name)
    assert down.returncode == 0, down.stderr
    flt = labels.cluster_filter(name)
    assert {kind: docker.ids(kind, flt) for kind in ("container", "network", "volume")} == {
        "container": [],
        "network": [],
        "volume": [],
    }
    assert swarm_state(docker)[0] == before  # left if `up` made it, kept if it was there
    assert not services(name)
    assert has_gwbridge(docker) == gwbridge_before


def _groups_started(cluster: Cluster, node: str) -> int:
    records = parse_node_log(node, cluster.logs(node))
    return sum(isinstance(r, AgentRecord) and r.event == "group_started" for r in records)


def test_four_nodes_train_on_a_swarm_and_down_leaves_nothing(docker, images):
    before = swarm_state(docker)[0]
    name = unique_name("sw-4")
    result = run_sim("up", "--engine", "swarm", "--name", name, "--nodes", "4", "--nproc-per-node", "1", "--detach")
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert len(services(name)) == 5  # etcd and four nodes, one task each
        status = run_sim("status", name)
        assert status.returncode == 0, status.stderr
        assert all(f"node{i}" in status.stdout for i in range(4)), status.stdout
        cluster = choose_engine(docker, name=name).cluster(name)
        wait_for(JobFinished(cluster), timeout=400, interval=3)
        assert [node.exit_code for node in cluster.nodes()] == [0, 0, 0, 0]
    finally:
        down = run_sim("down", name)
    assert down.returncode == 0, down.stderr
    assert not services(name) and swarm_state(docker)[0] == before
    assert docker.ids("container", labels.cluster_filter(name)) == []


def test_up_replace_on_a_swarm_removes_the_cluster_that_holds_the_name(docker, images):
    """`--replace` as on Compose: the old cluster's services go with it (a service left would start its tasks again)."""
    name = unique_name("sw-re")
    first = run_sim("up", "--engine", "swarm", "--name", name, "--nodes", "2", "--nproc-per-node", "1", "--detach")
    try:
        assert first.returncode == 0, first.stderr[-3000:]
        again = run_sim("up", "--engine", "swarm", "--name", name, "--nodes", "3", "--nproc-per-node", "1", "--detach")
        assert again.returncode != 0 and "already exists" in again.stderr, again.stderr[-2000:]
        replaced = run_sim(
            "up", "--engine", "swarm", "--name", name, "--nodes", "3", "--nproc-per-node", "1", "--detach", "--replace"
        )
        assert replaced.returncode == 0, replaced.stderr[-3000:]
        assert "--replace: removing the cluster" in replaced.stderr
        assert len(services(name)) == 4  # etcd and the new three nodes: none of the old cluster's services
    finally:
        down = run_sim("down", name)
    assert down.returncode == 0, down.stderr
    assert not services(name) and docker.ids("container", labels.cluster_filter(name)) == []


@pytest.mark.parametrize("scenario", ["worker-crash", "node-crash", "partition-one", "scale-up"])
def test_catalog_scenarios_pass_on_a_swarm(docker, images, scenario):
    """The same scenario file, its cluster deployed as a stack: faults reach each task's container."""
    before = swarm_state(docker)[0]
    run = run_sim("chaos", "run", scenario, "--backend", "etcd-v2", "--engine", "swarm", timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert f"PASS {scenario} [etcd-v2]" in run.stdout
    assert swarm_state(docker)[0] == before  # the run's own swarm is left again


def test_vet_runs_its_gauntlet_on_a_swarm(docker, images, tmp_path):
    """`sim vet --engine swarm`: the job deployed as a stack, faults reach the tasks' containers, the
    scorecard as on Compose; the job-ending fault's own cluster runs after the gauntlet, not beside it
    (each run initialises the one-host swarm and leaves it)."""
    before = swarm_state(docker)[0]
    script = str(Path(__file__).resolve().parents[1] / "scripts" / "fixed_name_ckpt.py")
    args = ["--engine", "swarm", "--rdzv-backend", "etcd-v2", "--faults", "kill-worker,kill-node,etcd-restart"]
    args += ["--out", str(tmp_path)]
    result = run_sim(
        "vet", script, *args, "--name", unique_name("vet-sw"), "--", "--steps", "100000", "--pg-timeout", "10",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    data = json.loads((tmp_path / "vet.json").read_text())
    assert [(f["kind"], f["outcome"]) for f in data["faults"]] == [
        ("kill-worker", "survived"),
        ("kill-node", "survived"),
        ("etcd-restart", "survived"),
    ], result.stdout
    assert swarm_state(docker)[0] == before
