"""The etcd-v3 password given in `--rdzv-conf` (issue 37 finding 6), on a real `sim up`: it is on no
command line in the node, in no history record and in no saved log line, and the run folder is its
owner's alone; it still reaches the backend (through the agent's environment).

The cluster's etcd runs without auth, so etcd answers the backend's login with "authentication is not
enabled" and `up` fails: the agent read the password and used it. (That the backend logs in with a password from its
environment against an etcd with auth on is rendezvous-etcd-v3/tests/test_security.py.)
"""

from __future__ import annotations

import secrets
import stat

import pytest
import yaml

from sim.core.paths import state_home
from tests.conftest import run_sim, unique_name

pytestmark = pytest.mark.docker

PASSWORD = f"etcd-pa55-{secrets.token_hex(6)}"


def test_the_etcd_v3_password_stays_out_of_argv_history_and_saved_logs(docker, images):
    name = unique_name("t-rdzvpw")
    conf = f"user=root,password={PASSWORD},allow_plain_password=1,join_timeout=60"
    started = run_sim("up", "--name", name, "--nodes", "1", "--rdzv-backend", "etcd-v3", "--rdzv-conf", conf)
    try:
        # It read the password (from its environment) and logged in with it: etcd has no auth on.
        assert started.returncode != 0 and "authentication is not enabled" in started.stderr, started.stderr
        assert PASSWORD not in started.stdout + started.stderr
    finally:
        run_sim("down", name)
    (run_dir,) = (state_home() / "runs").glob(f"{name}-*")  # `up` failed: its state folder is gone, this stays
    node = yaml.safe_load((run_dir / "compose.yaml").read_text())["services"]["node0"]
    assert PASSWORD not in " ".join(node["command"]), "on the node's command line (/proc/PID/cmdline, ps)"
    assert "password_env=SIM_RDZV_PASSWORD" in " ".join(node["command"])
    history = (run_dir / "history.jsonl").read_text()
    assert PASSWORD not in history and '["password", "***"]' in history
    saved = (run_dir / "logs" / "node0.log").read_text()
    assert "rdzv_configs" in saved and PASSWORD not in saved  # torch's INFO line of the conf printed it before
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for path in (run_dir / "logs" / "node0.log", run_dir / "history.jsonl", run_dir / "collector.log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    report = run_sim("report", name)
    assert PASSWORD not in report.stdout + report.stderr
