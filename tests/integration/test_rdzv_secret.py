"""The etcd-v3 password given in `--rdzv-conf` (issue 37 finding 6), on a real `sim up`: it is on no
command line in the node, in no history record and in no saved log line, and the run folder is its
owner's alone; it still reaches the backend (through the agent's environment).

The cluster's etcd runs without auth, so etcd answers the backend's login with "authentication is not
enabled": the agent read the password and used it. (That the backend logs in with a password from its
environment against an etcd with auth on is rendezvous-etcd-v3/tests/test_security.py.)
"""

from __future__ import annotations

import secrets
import stat
import time

import pytest

from sim.engines.cluster import Cluster
from tests.conftest import run_sim, unique_name

pytestmark = pytest.mark.docker

PASSWORD = f"etcd-pa55-{secrets.token_hex(6)}"


def test_the_etcd_v3_password_stays_out_of_argv_history_and_saved_logs(docker, images):
    name = unique_name("t-rdzvpw")
    conf = f"user=root,password={PASSWORD},allow_plain_password=1,join_timeout=60"
    started = run_sim(
        "up", "--name", name, "--nodes", "1", "--rdzv-backend", "etcd-v3", "--rdzv-conf", conf, "--detach",
    )  # fmt: skip
    cluster = Cluster(name, docker)
    try:
        assert PASSWORD not in started.stdout + started.stderr
        node = docker.api.inspect_container(f"{name}-node0")
        argv = " ".join(node["Config"]["Cmd"] or []) + " ".join(node["Config"]["Entrypoint"] or [])
        assert PASSWORD not in argv, "the password is on the node's command line (/proc/PID/cmdline, ps)"
        assert "password_env=SIM_RDZV_PASSWORD" in argv
        deadline, log = time.monotonic() + 180, ""
        while "authentication is not enabled" not in log and time.monotonic() < deadline:
            time.sleep(1)
            log = docker.api.logs(node["Id"]).decode(errors="replace")
        assert "authentication is not enabled" in log, log[-3000:]  # it read the password, and logged in with it
        assert "rdzv_configs" in log  # torch's INFO line of the conf, which printed the password before
        run_dir = cluster.run_dir
    finally:
        run_sim("down", name)
    history = (run_dir / "history.jsonl").read_text()
    assert PASSWORD not in history and '"password", "***"' in history
    saved = run_dir / "logs" / "node0.log"
    assert "rdzv_configs" in saved.read_text() and PASSWORD not in saved.read_text()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for path in (saved, run_dir / "history.jsonl", run_dir / "collector.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    report = run_sim("report", name)
    assert PASSWORD not in report.stdout + report.stderr
