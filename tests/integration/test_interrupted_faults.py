"""Faults that must not reach past the cluster or outlive an interruption (issue 37, findings 5 and 7), on
one real cluster, from the CLI as a user runs it, the effect seen from outside:

- fill-disk never follows a link that the job (same uid) put where its filler goes;
- a fault interrupted mid-act (SIGTERM to `sim`, or to `chaos run --cluster`) is healed by its intent: the
  node script it started in the node, which outlives our exec call, is ended, and a worker it stopped goes on.

One cluster serves the module: each test leaves no fault in force and waits until the job trains again.
"""

from __future__ import annotations

import signal
import time

import pytest

from sim.core.spec import ClusterSpec
from sim.engines.cluster import Cluster, up
from tests.conftest import run_sim, unique_name
from tests.integration.test_faults import eventually
from tests.integration.test_leaks import SimProcess

pytestmark = pytest.mark.docker

# A checkpoint every 20 s or so: a freeze's watcher waits that long for a write, a wide window to interrupt.
CKPT_EVERY = ("--steps", "1000000", "--step-time", "0.1", "--ckpt-interval", "200")


@pytest.fixture(scope="module")
def cluster(docker, images):
    spec = ClusterSpec(
        name=unique_name("t-intent"),
        nodes=1,
        nproc_per_node=1,
        rdzv_backend="c10d",
        max_restarts=10,
        ckpt_size="16m",
        script_args=CKPT_EVERY,
    )
    try:
        yield up(spec, docker, progress=lambda line: None)
    finally:
        run_sim("down", spec.name)


def processes(cluster: Cluster, node: str = "node0") -> list[tuple[str, str]]:
    """(ps STAT, command line) of each process in the node, read from the host (works on a paused node)."""
    top = cluster.docker.api.top(cluster.container(node).id, ps_args="-o pid,stat,args")
    titles = top["Titles"]
    return [(row[titles.index("STAT")], row[titles.index("COMMAND")]) for row in top["Processes"]]


def worker_states(cluster: Cluster) -> list[str]:
    return [stat for stat, args in processes(cluster) if "train.py" in args and "torchrun" not in args]


def watchers(cluster: Cluster) -> list[str]:
    """freeze-during-checkpoint's node script (nodescripts.KILL_IN_WRITE), found by what it reads."""
    return [args for stat, args in processes(cluster) if args.startswith("python3 -c") and "/fdinfo/" in args]


def faults_in_force(cluster: Cluster) -> str:
    return run_sim("faults", "--name", cluster.name).stdout.strip()


def test_fill_disk_never_follows_a_link_the_job_put_where_its_filler_goes(cluster):
    """Finding 5: the job's user links /ckpt/.sim-filler to a file of the host's (the events folder, a bind
    mount of the run folder). Before, the filler followed it and wrote /ckpt's free space (16 MiB here, up to
    16 GiB) onto the host; now the filler is refused in one line, and the host file is never made."""
    victim = cluster.run_dir / "events" / "filled-through-a-link"
    link = cluster.exec("node0", "ln", "-sfn", f"/sim/events/{victim.name}", "/ckpt/.sim-filler", user="sim")
    assert link.ok, link.stderr
    try:
        refused = run_sim("fill-disk", "node0", "--name", cluster.name)
        assert not victim.exists(), f"{victim.stat().st_size} bytes written on the host through the link"
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "/ckpt/.sim-filler exists already" in refused.stderr and "Traceback" not in refused.stderr
        assert faults_in_force(cluster) == "no faults in force"
    finally:
        cluster.exec("node0", "rm", "-f", "/ckpt/.sim-filler", user="root")
        victim.unlink(missing_ok=True)
    # The fault itself still works, on a file of its own.
    filled = run_sim("fill-disk", "node0", "--name", cluster.name)
    assert filled.returncode == 0, filled.stderr
    assert run_sim("heal", "fill-node0", "--name", cluster.name).returncode == 0
    assert ".sim-filler" not in cluster.exec("node0", "ls", "-a", "/ckpt").stdout


def test_a_freeze_interrupted_before_it_recorded_anything_is_healed_by_heal_all(cluster):
    """Finding 7: `sim freeze-during-checkpoint` gets SIGTERM while its watcher waits in the node. The watcher
    runs on and stops the writer at the next checkpoint. Before, nothing was recorded and `heal --all` sent
    no SIGCONT: the worker stayed stopped for good. Now the intent was recorded first, and heal continues it."""
    eventually(lambda: worker_states(cluster) and not watchers(cluster), 120, what="a worker running")
    freeze = SimProcess("freeze-during-checkpoint", "node0", "--within", "120s", "--name", cluster.name)
    try:
        eventually(lambda: watchers(cluster), 60, interval=0.5, what="the watcher started in the node")
        freeze.signal(signal.SIGTERM)
    finally:
        if freeze.proc.poll() is None:
            freeze.proc.kill()
    eventually(
        lambda: any(s.startswith("T") for s in worker_states(cluster)),
        120,
        interval=0.5,
        what="the watcher, running on in the node, stopped the writer",
    )
    healed = run_sim("heal", "--all", "--name", cluster.name)
    assert healed.returncode == 0, healed.stderr
    assert not any(s.startswith("T") for s in worker_states(cluster)), worker_states(cluster)
    assert not watchers(cluster) and faults_in_force(cluster) == "no faults in force"


def test_chaos_run_on_a_cluster_heals_a_fault_interrupted_mid_call(cluster, tmp_path):
    """Finding 7: `chaos run --cluster` gets SIGTERM while a freeze-during-checkpoint step's watcher waits.
    Before, the run healed only the ids its finished calls returned: the watcher ran on and stopped the
    writer at the next checkpoint, with no record. Now cleanup heals by the intents this run recorded: the
    watcher is ended, and no worker is stopped after the run."""
    eventually(lambda: worker_states(cluster) and not watchers(cluster), 120, what="a worker running")
    scenario = tmp_path / "freeze.yaml"
    scenario.write_text(
        "name: freeze-cut\ndescription: a freeze whose run is stopped while it waits for a write\n"
        "cluster: {nodes: 1, nproc_per_node: 1, rdzv_backend: c10d}\n"
        "steps:\n"
        "  - {fault: freeze-during-checkpoint, target: node0, within: 2m, at: {step: 1}}\n"
        "expect: {outcome: recovers}\ntimeout: 15m\n"
    )
    runner = SimProcess("chaos", "run", str(scenario), "--cluster", cluster.name)
    try:
        runner.wait_for_line("[chaos] freeze-during-checkpoint")
        eventually(lambda: watchers(cluster), 60, interval=0.5, what="the watcher started in the node")
        runner.signal(signal.SIGTERM)
    finally:
        if runner.proc.poll() is None:
            runner.proc.kill()
    assert not watchers(cluster), "the interrupted fault's watcher runs on in the node"
    assert faults_in_force(cluster) == "no faults in force"
    time.sleep(30)  # past the next checkpoint write: nothing stops the writer now
    assert not any(s.startswith("T") for s in worker_states(cluster)), worker_states(cluster)
