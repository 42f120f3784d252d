"""A real ``torchrun --rdzv-backend etcd-v3`` with two agents against a real etcd v3 (no v2 API)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("e2e_train.py")
pytestmark = pytest.mark.slow


def _agents(etcd_server, key_prefix, tmp_path, fail_first_attempt):
    env = {**os.environ, "E2E_OUT": str(tmp_path), "E2E_FAIL_FIRST_ATTEMPT": "1" if fail_first_attempt else "0",
           "LOGLEVEL": "INFO", "OMP_NUM_THREADS": "1"}  # fmt: skip
    if fail_first_attempt:
        # torch's shared agent TCPStore breaks a plain gloo script's next round after a worker crash, with every
        # backend (etcd-v2 and c10d too: "Gloo connectFullMesh failed ... Connection refused"). Without it, the
        # workers find their master through the etcd store, which this test then exercises as well.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
        "--rdzv-backend", "etcd-v3", "--rdzv-endpoint", etcd_server.endpoint, "--rdzv-id", "e2e",
        "--rdzv-conf", f"key_prefix={key_prefix},last_call_timeout=1,read_timeout=10",
        "--monitor-interval", "0.2",
        str(SCRIPT),
    ]  # fmt: skip
    return [
        subprocess.Popen(argv, env=env, stdout=open(tmp_path / f"agent{i}.log", "wb"), stderr=subprocess.STDOUT)
        for i in range(2)
    ]


def _kill_workers(tmp_path):
    """Workers run in sessions of their own (torch's choice); a killed agent leaves them: end those of this test."""
    for pid_file in tmp_path.glob("pid*"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.mark.parametrize("fail_first_attempt", [False, True], ids=["clean", "worker-crash-then-restart"])
def test_torchrun_two_agents_finish(etcd_server, key_prefix, tmp_path, fail_first_attempt):
    agents = _agents(etcd_server, key_prefix, tmp_path, fail_first_attempt)
    try:
        codes = [agent.wait(timeout=180) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
        _kill_workers(tmp_path)
    logs = "\n".join((tmp_path / f"agent{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], logs
    lines = [(tmp_path / f"rank{rank}").read_text() for rank in range(2)]
    # torch counts restarts per agent: the agent whose worker crashed counts one; the other one counts one only
    # if it saw its own worker fail (the peer's all-reduce broke) before it saw the new round, else its workers
    # restart with TORCHELASTIC_RESTART_COUNT still 0.
    restarts = sorted(int(line.rsplit("restart=", 1)[1]) for line in lines)
    assert all(line.startswith("world=2 sum=1 restart=") for line in lines), lines
    assert restarts in ([[0, 1], [1, 1]] if fail_first_attempt else [[0, 0]]), lines
    assert "etcd-v3" in logs
