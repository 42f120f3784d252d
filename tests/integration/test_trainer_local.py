"""trainer/train.py under real torchrun on this host: SIGKILL a worker, the job resumes.

No Docker: one torchrun agent with two CPU workers (gloo). torchrun restarts the
worker group, the new workers resume from the last checkpoint, and the job ends
at --steps by itself.
"""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

TRAIN_PY = Path(__file__).resolve().parents[2] / "trainer" / "train.py"
TARGET_STEPS, KILL_AT_STEP, CKPT_INTERVAL = 30, 15, 10
DEADLINE_S = 120  # a hung rendezvous fails the test instead of hanging CI


def process_tree(pid):
    """pid and all its descendants, from Linux /proc."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid"
    tree, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        tree.append(current)
        frontier += [child for child, parent in parent_of.items() if parent == current]
    return tree


def kill_tree(pid):
    # torchrun starts each worker in a session of its own: killing the agent
    # alone would leave workers holding stdout open until their gloo timeout.
    for member in process_tree(pid):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("shared_store", [True, False], ids=["agent-store", "own-store"])
def test_killed_worker_is_restarted_and_the_job_resumes_from_the_last_checkpoint(tmp_path, shared_store):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    if not shared_store:  # workers' rank 0 hosts a fresh store each start
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        str(TRAIN_PY),
        "--steps",
        str(TARGET_STEPS),
        "--ckpt-interval",
        str(CKPT_INTERVAL),
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--step-time",
        "0.1",
        "--dataset-size",
        "1024",
    ]
    agent_log = open(tmp_path / "torchrun.log", "w")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=agent_log, text=True, env=env)
    watchdog = threading.Timer(DEADLINE_S, kill_tree, (proc.pid,))
    watchdog.start()
    lines, killed_pid = [], None
    try:
        for raw in proc.stdout:
            line = json.loads(raw)  # every stdout line must be one JSON object
            lines.append(line)
            if killed_pid is None and line["sim"] == "progress" and line["step"] == KILL_AT_STEP:
                killed_pid = next(start["pid"] for start in lines if start["sim"] == "start" and start["rank"] == 1)
                os.kill(killed_pid, signal.SIGKILL)
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            kill_tree(proc.pid)
        agent_log.close()
    log = (tmp_path / "torchrun.log").read_text()
    assert returncode == 0, log[-4000:]
    assert killed_pid is not None

    starts = [line for line in lines if line["sim"] == "start"]
    progress = [line for line in lines if line["sim"] == "progress"]
    checkpoints_before_kill = [line["step"] for line in lines if line["sim"] == "checkpoint" and line["restart"] == 0]
    resumed = [start for start in starts if start["restart"] == 1]
    assert sorted(start["rank"] for start in resumed) == [0, 1]
    resumed_from = resumed[0]["resumed_from"]
    assert resumed_from > 0 and all(start["resumed_from"] == resumed_from for start in resumed)
    assert resumed_from == max(checkpoints_before_kill)
    assert all(start["ckpt_world_size"] == 2 for start in resumed)

    summary = [line for line in lines if line["sim"] == "summary"]
    assert len(summary) == 1 and summary[0]["final_step"] == TARGET_STEPS and summary[0]["restart"] == 1
    assert summary[0]["steps_run_this_start"] == TARGET_STEPS - resumed_from
    assert max(line["step"] for line in progress) == TARGET_STEPS

    for rank in (0, 1):
        after = [line["step"] for line in progress if line["rank"] == rank and line["restart"] == 1]
        assert after == list(range(resumed_from + 1, TARGET_STEPS + 1))
    # Same data order, same restored weights and optimizer state: the replayed
    # steps repeat the first run's losses, so the loss curve has no jump.
    first_run = {line["step"]: line["loss"] for line in progress if line["rank"] == 0 and line["restart"] == 0}
    replayed = {line["step"]: line["loss"] for line in progress if line["rank"] == 0 and line["restart"] == 1}
    for step in range(resumed_from + 1, KILL_AT_STEP + 1):
        assert replayed[step] == pytest.approx(first_run[step], rel=1e-5), step

    # torchrun's own account (ERROR level, printed without LOGLEVEL set).
    assert f"failed (exitcode: -9) local_rank: 1 (pid: {killed_pid})" in log
