"""A real cluster: real Docker, real etcd, real torchrun, real training."""

from __future__ import annotations

import subprocess

import pytest

from sim.core import labels
from sim.core.agentlog import parse_node_log
from sim.core.history import TrainerRecord
from sim.core.wait import wait_for
from sim.engines.cluster import Cluster, JobFinished
from sim.engines.render import AWAIT_ETCD
from tests.conftest import SESSION, run_sim, unique_name

pytestmark = pytest.mark.docker
# Short runs: enough steps to cross two checkpoints, paced so they take seconds.
SHORT_JOB = ["--", "--steps", "24", "--step-time", "0.05", "--ckpt-interval", "10"]


def start(name: str, *options: str, script_args=SHORT_JOB) -> subprocess.CompletedProcess:
    result = run_sim("up", "--name", name, "--detach", *options, *script_args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def records(cluster: Cluster, kind: str) -> list[dict]:
    """The trainer's own records of one kind (progress, summary, ...) in every node's log."""
    return [
        r.to_dict()  # the lines as the trainer printed them
        for node in cluster.nodes()
        for r in parse_node_log(node.node, cluster.logs(node.node))
        if isinstance(r, TrainerRecord) and r.kind == kind
    ]


def leftovers(docker, name: str) -> dict[str, list[str]]:
    flt = labels.cluster_filter(name)
    return {kind: docker.ids(kind, flt) for kind in ("container", "network", "volume")}


def assert_trained_to_end(docker, name: str, steps: int, nodes: int, nproc: int) -> Cluster:
    cluster = Cluster(name, docker)
    wait_for(JobFinished(cluster), timeout=240, interval=2)
    for node in cluster.nodes():
        assert node.exit_code == 0, f"{node.node}: {node.status}\n{cluster.logs(node.node, tail=40)}"
        # torchrun's agent reports the whole worker group: every worker exited 0.
        assert "worker group successfully finished" in cluster.logs(node.node)
    summaries = records(cluster, "summary")
    assert [s["final_step"] for s in summaries] == [steps]
    progress = records(cluster, "progress")
    world = nodes * nproc
    last_step = {}
    for r in progress:
        assert r["world_size"] == world
        last_step[r["rank"]] = max(last_step.get(r["rank"], 0), r["step"])
    assert last_step == {rank: steps for rank in range(world)}
    return cluster


def test_etcd_v2_two_nodes_train_to_end(docker, images):
    name = unique_name("t-etcd")
    start(name, "--nodes", "2", "--rdzv-backend", "etcd-v2")
    try:
        # The rendered file is a plain compose project.
        ps = docker.compose(name, None, "ps", "-a", "--format", "{{.Service}}", check=False)
        assert sorted(ps.stdout.split()) == ["etcd", "node0", "node1"], ps.stderr
        assert_trained_to_end(docker, name, steps=24, nodes=2, nproc=2)
    finally:
        run_sim("down", name)


def test_c10d_two_nodes_train_to_end(docker, images):
    name = unique_name("t-c10d")
    start(name, "--nodes", "2", "--rdzv-backend", "c10d")
    try:
        cluster = assert_trained_to_end(docker, name, steps=24, nodes=2, nproc=2)
        assert all(c.role == "node" for c in cluster.containers()), "c10d needs no etcd"
    finally:
        run_sim("down", name)


@pytest.mark.parametrize("backend, options", [("etcd", []), ("static", ["--min-nodes", "2"])])
def test_etcd_v1_and_static_two_nodes_train_to_end(docker, images, backend, options):
    name = unique_name(f"t-{backend}")
    start(name, "--nodes", "2", "--rdzv-backend", backend, *options)
    try:
        cluster = assert_trained_to_end(docker, name, steps=24, nodes=2, nproc=2)
        roles = sorted(c.role for c in cluster.containers())
        assert roles == (["etcd", "node", "node"] if backend == "etcd" else ["node", "node"]), roles
    finally:
        run_sim("down", name)


def test_four_nodes_every_rank_once(docker, images):
    name = unique_name("t-four")
    start(
        name,
        "--nodes",
        "4",
        "--min-nodes",
        "4",
        "--nproc-per-node",
        "2",
        script_args=["--", "--steps", "30", "--step-time", "0.2"],
    )
    try:
        status = run_sim("status", name)
        assert status.returncode == 0, status.stderr
        rows = [line.split() for line in status.stdout.splitlines()[1:]]
        node_rows = [r for r in rows if r[0].startswith("node")]
        assert [r[0] for r in node_rows] == ["node0", "node1", "node2", "node3"]
        assert all(r[1] == "running" and r[2] == "alive" and r[3] == "2" for r in node_rows), status.stdout

        cluster = assert_trained_to_end(docker, name, steps=30, nodes=4, nproc=2)
        starts = [r for r in records(cluster, "start") if r["restart"] == 0]
        ranks = sorted(r["rank"] for r in starts)
        assert ranks == list(range(8)), ranks
        assert {r["world_size"] for r in starts} == {8}
        per_node = {}
        for r in starts:
            per_node.setdefault(r["node"], set()).add(r["local_rank"])
        assert per_node == {f"node{i}": {0, 1} for i in range(4)}
    finally:
        run_sim("down", name)


def test_down_removes_everything_and_keeps_logs(docker, images):
    name = unique_name("t-down")
    start(name, "--nodes", "2")
    cluster = Cluster(name, docker)
    found = leftovers(docker, name)
    assert found["container"] and found["network"] and found["volume"]
    run_dir = cluster.run_dir
    result = run_sim("down", name)
    assert result.returncode == 0, result.stderr
    assert leftovers(docker, name) == {"container": [], "network": [], "volume": []}
    # up returned once the agents started their worker groups: the saved log holds that much.
    assert "Starting worker group" in (run_dir / "logs" / "node0.log").read_text()
    assert not cluster.state_dir.exists()
    again = run_sim("down", name)
    assert again.returncode == 2 and "not found" in again.stderr


# A failure before training starts: torch's agent rejects a rendezvous option before any round
# (a worker that crashes is a job that started, then failed: `up` follows it to a FAIL verdict).
# Options `sim up` lets through (plain words) that torch's agent rejects once it starts: the cluster
# is made, then fails before training. etcd-v2 refuses the protocol, c10d the store type.
BROKEN_AGENT = ("--rdzv-conf", "protocol=ftp")
BROKEN_C10D_AGENT = ("--rdzv-conf", "store_type=bogus")


def test_failed_up_removes_what_it_made(docker, images):
    name = unique_name("t-fail")
    result = run_sim("up", "--name", name, "--detach", "--nodes", "2", *BROKEN_AGENT, "--timeout", "120")
    assert result.returncode != 0
    assert "before training started" in result.stderr and "HTTP or HTTPS" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert leftovers(docker, name) == {"container": [], "network": [], "volume": []}


def test_failed_up_with_keep_keeps_it(docker, images):
    name = unique_name("t-keep")
    result = run_sim(
        "up",
        "--name",
        name,
        "--detach",
        "--nodes",
        "1",
        "--keep",
        *BROKEN_C10D_AGENT,
        "--rdzv-backend",
        "c10d",
        "--timeout",
        "120",
    )
    try:
        assert result.returncode != 0
        assert leftovers(docker, name)["container"], "with --keep the failed cluster stays for debugging"
    finally:
        run_sim("down", name)
    assert leftovers(docker, name) == {"container": [], "network": [], "volume": []}


def test_a_node_without_etcd_gives_up_after_its_limit_and_names_the_endpoint(images):
    """A node of an etcd backend starts its agent only once etcd answers (sim/engines/render.py AWAIT_ETCD);
    with no etcd there it runs nothing and ends with one line naming the endpoint."""
    result = subprocess.run(
        ["docker", "run", "--rm", "--label", f"{labels.SESSION}={SESSION}", images.node]
        + [AWAIT_ETCD, "etcd:2379", "1", "--", "echo", "the agent ran"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "the agent ran" not in result.stdout, result
    assert "etcd at etcd:2379 not healthy after 1 s" in result.stderr, result.stderr
