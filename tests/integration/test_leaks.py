"""Leaks (issue 11): a harness interrupted or killed at any moment leaves nothing of ours once `sim
down NAME`, or the next `up` of the same name, has run; `sim ls` shows what a killed harness left;
the history holds what happened up to the event. Real processes, really killed."""

from __future__ import annotations

import functools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.core import labels
from sim.core.history import FILE_NAME
from sim.engines.cluster import COLLECTOR_PID_FILE, Cluster
from sim.scenarios.runner import default_cluster_name
from tests.conftest import ROOT, run_sim, unique_name

pytestmark = pytest.mark.docker

LONG_JOB = ["--", "--steps", "100000", "--step-time", "0.1"]


class SimProcess:
    """`python -m sim ...` running in the background, its output read line by line."""

    def __init__(self, *args: str, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "sim", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # a signal to it alone, as `kill PID` sends one
            # Ctrl-C as at a terminal, even when the suite itself was started with SIGINT ignored (a background
            # job of a non-interactive shell): Python installs its KeyboardInterrupt handler only over SIG_DFL.
            preexec_fn=functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for_line(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if text in line:
                return
        raise AssertionError(f"no line with {text!r} within {timeout}s; output:\n{''.join(self.seen)[-3000:]}")

    def signal(self, signum: int) -> int:
        self.proc.send_signal(signum)
        return self.proc.wait(timeout=120)


def ours(docker, name: str) -> dict[str, list[str]]:
    flt = labels.cluster_filter(name)
    return {kind: docker.ids(kind, flt) for kind in ("container", "network", "volume")}


def collector_processes(name: str) -> list[int]:
    """Live collector processes following cluster `name` (from /proc: any harness's, not only ours)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"sim.engines.collector" in argv and name.encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


def assert_nothing_left(docker, name: str) -> None:
    deadline = time.monotonic() + 30  # a collector drains, then ends
    while collector_processes(name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ours(docker, name) == {"container": [], "network": [], "volume": []}
    assert collector_processes(name) == []


def wait_for_nodes(docker, name: str, count: int, timeout: float = 120, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [c for c in Cluster(name, docker).containers() if c.state == "running"]
        if len(running) >= count:
            return
        time.sleep(poll)
    raise AssertionError(f"cluster {name}: {count} running containers not seen within {timeout}s")


def history_of(run_dir: Path) -> str:
    return (run_dir / FILE_NAME).read_text()


def ls_line(name: str) -> str:
    result = run_sim("ls")
    assert result.returncode == 0, result.stderr
    return next((line for line in result.stdout.splitlines() if line.startswith(name + " ")), "")


def test_sigkill_of_up_is_shown_by_ls_and_the_next_up_sweeps_it(docker, images):
    name = unique_name("t-killup")
    up = SimProcess("up", "--name", name, "--nodes", "2", *LONG_JOB)
    up.wait_for_line("[up] starting cluster")
    run_dir = Cluster(name, docker).run_dir
    # Once Compose has started the containers, `up` waits for training to start (the agents import
    # torch first: seconds). Stopped at once, it cannot see training start, whatever the machine's
    # speed; then it dies while it waits.
    wait_for_nodes(docker, name, 3, poll=0.1)
    up.proc.send_signal(signal.SIGSTOP)
    up.signal(signal.SIGKILL)
    assert "leftover? the harness that made it" in ls_line(name)
    assert '"event": "start"' in history_of(run_dir)  # the run start record, written before any container
    again = run_sim("up", "--name", name, "--nodes", "1", "--detach", *LONG_JOB)
    try:
        assert again.returncode == 0, again.stderr[-2000:]
        assert f"removing what a killed harness left of '{name}'" in again.stderr
        assert (run_dir / "logs" / "node0.log").exists()  # the swept run's logs were kept
    finally:
        run_sim("down", name)
    assert_nothing_left(docker, name)


@pytest.mark.parametrize("phase", ["starting", "waiting"])
def test_ctrl_c_during_up_removes_what_it_made(docker, images, phase):
    name = unique_name(f"t-int{phase[0]}")
    up = SimProcess("up", "--name", name, "--nodes", "2", *LONG_JOB)
    up.wait_for_line("[up] starting cluster")
    if phase == "waiting":
        wait_for_nodes(docker, name, 3)  # Compose is done: `up` waits for training to start
    code = up.signal(signal.SIGINT)
    assert code != 0
    assert "Traceback" not in "".join(up.seen)
    assert_nothing_left(docker, name)


def test_sigkill_of_the_collector_is_shown_and_down_removes_everything(docker, images):
    name = unique_name("t-killcol")
    result = run_sim("up", "--name", name, "--nodes", "1", "--detach", *LONG_JOB)
    assert result.returncode == 0, result.stderr[-2000:]
    cluster = Cluster(name, docker)
    pid = int((cluster.state_dir / COLLECTOR_PID_FILE).read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid in collector_processes(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "leftover? its history collector is gone" in ls_line(name)
    run_dir = cluster.run_dir
    assert run_sim("down", name).returncode == 0
    assert_nothing_left(docker, name)
    assert '"type": "docker"' in history_of(run_dir)  # what it recorded before it died is kept


def test_sigkill_of_chaos_run_is_shown_and_down_removes_it(docker, images, tmp_path):
    scenario = tmp_path / "long.yaml"
    name = unique_name("t-killchaos")
    scenario.write_text(
        f"name: {name}\ndescription: a long job to kill the runner in\n"
        "cluster: {nodes: 1, nproc_per_node: 1, rdzv_backend: c10d}\n"
        "trainer: {steps: 100000, step_time: 0.1}\n"
        "steps:\n  - fault: kill-worker\n    target: node0\n    at: {step: 99999}\n"
        "expect: {outcome: recovers}\ntimeout: 10m\n"
    )
    cluster_name = default_cluster_name(name, "c10d")
    runner = SimProcess("chaos", "run", str(scenario))
    runner.wait_for_line("[up] training started")
    runner.signal(signal.SIGKILL)
    assert "leftover? the harness that made it" in ls_line(cluster_name)
    assert run_sim("down", cluster_name).returncode == 0
    assert_nothing_left(docker, cluster_name)


@pytest.fixture(scope="module")
def two_clusters(docker, images):
    names = [unique_name("t-twin"), unique_name("t-twin")]
    try:
        for name in names:
            result = run_sim("up", "--name", name, "--nodes", "2", "--detach", *LONG_JOB)
            assert result.returncode == 0, result.stderr[-2000:]
        yield names
    finally:
        for name in names:
            run_sim("down", name)
        for name in names:
            assert_nothing_left(docker, name)


def test_a_fault_on_one_cluster_leaves_the_other_untouched(docker, two_clusters):
    hit, other = two_clusters
    before = {c.node: (c.id, c.state) for c in Cluster(other, docker).containers()}
    assert run_sim("kill", "node1", "--name", hit).returncode == 0
    assert run_sim("pause", "node0", "--name", hit).returncode == 0
    hit_states = {c.node: c.state for c in Cluster(hit, docker).containers()}
    assert hit_states["node0"] == "paused" and hit_states["node1"] != "running"
    after = {c.node: (c.id, c.state) for c in Cluster(other, docker).containers()}
    assert after == before and all(state == "running" for _, state in after.values())
    assert "no faults in force" in run_sim("faults", "--name", other).stdout


def test_two_commands_at_once_on_one_cluster_both_land_in_the_fault_store(docker, two_clusters):
    _, name = two_clusters
    first = SimProcess("netem", "node0", "--loss", "5%", "--name", name)
    second = SimProcess("netem", "node1", "--loss", "5%", "--name", name)
    assert first.proc.wait(timeout=120) == 0 and second.proc.wait(timeout=120) == 0
    listed = run_sim("faults", "--name", name).stdout
    assert "node0" in listed and "node1" in listed, listed
    assert run_sim("heal", "--all", "--name", name).returncode == 0
    assert "no faults in force" in run_sim("faults", "--name", name).stdout


def test_a_failing_plugin_test_leaves_nothing(docker, images, tmp_path):
    """A user's pytest test that fails while its cluster trains: the plugin's teardown removes it."""
    session = unique_name("leaktest")
    (tmp_path / "test_user.py").write_text(
        "def test_fails_while_training(sim_cluster):\n"
        f"    sim_cluster(nodes=1, name={session!r})\n"
        "    assert False, 'the user test fails'\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_user.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, labels.SESSION_ENV: session},
    )
    assert result.returncode == 1 and "the user test fails" in result.stdout, result.stdout[-3000:]
    flt = f"label={labels.SESSION}={session}"
    assert {kind: docker.ids(kind, flt) for kind in ("container", "network", "volume")} == {
        "container": [],
        "network": [],
        "volume": [],
    }
