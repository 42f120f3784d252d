"""Shared fixtures. Every Docker resource a test session makes carries the
session's label (SIM_SESSION); the session sweeps it at the end, also after a
failure, so `docker ps -a` shows nothing of ours afterwards."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.core import labels  # noqa: E402
from sim.core.errors import SimError  # noqa: E402
from sim.engines.docker import RESOURCE_KINDS, Docker  # noqa: E402

SESSION = os.environ.setdefault(labels.SESSION_ENV, f"pytest-{secrets.token_hex(4)}")
# Under pytest-xdist (make test: -n 2) each worker process labels and sweeps its own resources:
# a worker that finishes first must not sweep clusters the other one is still using.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER and not SESSION.endswith(f"-{WORKER}"):
    SESSION = os.environ[labels.SESSION_ENV] = f"{SESSION}-{WORKER}"
# Run directories (histories, logs, reports) go to a home of the session's own unless the
# caller chose one; it is removed after a green session and kept as evidence after a red one.
OWN_HOME = "SIM_HOME" not in os.environ
if OWN_HOME:
    os.environ["SIM_HOME"] = tempfile.mkdtemp(prefix="elastic-sim-test-home-")


def sweep_session(docker: Docker) -> None:
    flt = f"label={labels.SESSION}={SESSION}"
    for kind in RESOURCE_KINDS:  # containers first: they hold the networks and volumes
        try:
            docker.remove(kind, docker.ids(kind, flt))
        except SimError as error:
            print(f"sweep of session {SESSION}: {error}", file=sys.stderr)


def _interrupt_on_sigterm(signum, frame):
    # A CI timeout or `kill` sends SIGTERM: turn it into the Ctrl-C path so
    # pytest still runs every fixture's teardown.
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


@pytest.fixture(scope="session")
def docker(sim_docker) -> Docker:
    """The plugin's engine check (fails in CI without Docker), plus this session's sweep."""
    # The exit-time sweep catches what a killed run's teardown missed.
    atexit.register(sweep_session, sim_docker)
    yield sim_docker
    sweep_session(sim_docker)


@pytest.fixture(scope="session")
def images(docker):
    """Node and etcd images, built once per session (cached by content anyway)."""
    from sim.engines.images import ImageBuilder

    return ImageBuilder(docker).ensure().images


def pytest_terminal_summary(terminalreporter, exitstatus):
    if not OWN_HOME:
        return
    home = Path(os.environ["SIM_HOME"])
    if exitstatus != 0 and home.is_dir() and any(home.iterdir()):
        terminalreporter.write_line(f"run histories, logs and reports of this session: {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)


def run_sim(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: a separate process."""
    return subprocess.run(
        [sys.executable, "-m", "sim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def unique_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"
