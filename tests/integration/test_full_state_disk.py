"""A full state disk (issue 37 finding 8), for real: the state home (SIM_HOME) on a small tmpfs of its own,
a real cluster and its real collector. While the disk is full, Docker events happen and are lost; once
space comes back, the collector goes on recording, says how many records it lost and when, and the history
holds no torn line."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from sim.core.history import FILE_NAME, History
from tests.conftest import run_sim, unique_name
from tests.integration.test_faults import eventually

pytestmark = pytest.mark.docker


@pytest.fixture
def small_home(tmp_path):
    """A 2 MiB tmpfs (root only: the CI runs as root, as the harness's tests of Docker do)."""
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(home)], check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def fill(folder: Path) -> Path:
    """Fill the filesystem of `folder` to the last byte."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    with open(filler, "ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0")
    return filler


def history_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / FILE_NAME).read_text().splitlines()]


def test_the_collector_survives_a_full_state_disk_and_records_what_it_lost(docker, images, small_home):
    env = {"SIM_HOME": str(small_home)}
    name = unique_name("t-full")
    started = run_sim(
        "up", "--name", name, "--nodes", "1", "--rdzv-backend", "c10d", "--detach",
        "--", "--steps", "1000000", "--step-time", "0.2", env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    (run_dir,) = (small_home / "runs").glob(f"{name}-*")
    history = History(run_dir / FILE_NAME)
    container = f"{name}-node0"
    try:
        cid = docker.api.inspect_container(container)["Id"]
        eventually(lambda: any(r.TYPE == "trainer" for r in history.records()), 180, what="the job trains")
        filler = fill(small_home)
        full_at = time.time()
        docker.api.pause(cid)  # pause, unpause: two Docker events the collector cannot write now
        docker.api.unpause(cid)
        time.sleep(3)
        filler.unlink()  # space is back
        back_at = time.time()
        docker.api.pause(cid)  # the collector still follows the engine: these are recorded
        docker.api.unpause(cid)

        def recorded_after_space_came_back() -> bool:
            return any(r.TYPE == "docker" and r.action == "unpause" and r.t > back_at for r in history.records())

        eventually(recorded_after_space_came_back, 60, what="Docker events recorded once space came back")
        contents = history.read()
        assert contents.skipped_lines == 0, "a torn line in the history"
        lost = [r for r in contents.records if r.TYPE == "run" and r.event == "records_lost"]
        assert lost and lost[0].lost >= 2, lost  # pause and unpause at least (trainer lines too)
        # Lost while the disk was full (a log line read late carries its older time).
        assert full_at - 60 <= lost[0].lost_from <= lost[0].lost_to <= back_at + 5, lost[0]
        # Every line is whole JSON: none swallowed the next.
        assert all("type" in line for line in history_lines(run_dir))
    finally:
        run_sim("down", name, env=env)
