"""A real Swarm of two engines on this machine: each a dockerd in a network namespace of its own
(scripts/netns-engine.sh), with its own data root, socket, hostname and address, so Swarm sees two
hosts. `sim` drives the first (the manager) through DOCKER_HOST and reaches the second through
`sim swarm add-host`; 4 nodes are spread over both, and faults strike the second engine's nodes.

This machine's own engine takes no part: a swarm's init and leave there would break name resolution
in the Compose clusters beside it (docs/SWARM.md), so the test is safe in any suite. In
`make test-full`: it loads the images into two engines and runs one job through three faults."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sim.core.errors import ClusterError
from sim.core.history import AgentRecord, History, TrainerRecord
from sim.core.wait import Condition, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.full]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "netns-engine.sh"
HOSTS = {"a": ("sim-host-a", "10.213.0.1"), "b": ("sim-host-b", "10.213.0.2")}
# The fast profile's rendezvous settings (sim/scenarios/scenario.py's), so each recovery takes seconds.
FAST = ["--rdzv-conf", "last_call_timeout=2,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3"]
JOB = ["--", "--steps", "100000", "--step-time", "0.1", "--ckpt-interval", "20", "--pg-timeout", "15"]


def engine(*args: str) -> str:
    out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def on(socket: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": socket})


@pytest.fixture(scope="module")
def two_engines(images):
    """Two engines in a swarm of their own (A the manager), each with the session's images loaded."""
    if os.geteuid() != 0:
        pytest.fail("the two-engine Swarm test makes network namespaces and starts dockerd: run it as root")
    names = {key: f"es{key}{secrets.token_hex(2)}" for key in HOSTS}
    sockets = {}
    try:
        for key, (hostname, address) in HOSTS.items():
            sockets[key] = engine("start", names[key], hostname, f"{address}/24")
            engine("load", names[key], images.base, images.runtime, images.etcd, images.node)
        init = on(sockets["a"], "swarm", "init", "--advertise-addr", HOSTS["a"][1])
        assert init.returncode == 0, init.stderr
        token = on(sockets["a"], "swarm", "join-token", "-q", "worker").stdout.strip()
        joined = on(sockets["b"], "swarm", "join", "--token", token, f"{HOSTS['a'][1]}:2377")
        assert joined.returncode == 0, joined.stderr
        yield sockets
    finally:
        for name in names.values():
            engine("stop", name)


def sim(sockets: dict, home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKER_HOST": sockets["a"], "SIM_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "sim", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def history(home: Path, name: str) -> list:
    (run,) = (home / "runs").glob(f"{name}-*")
    return list(History(run / "history.jsonl").records())


def recovered_at_world(home: Path, name: str, world: int, after: float) -> Condition:
    """10 steps at `world` taken after an agent joined a round newer than `after` (torch's own
    "rendezvous complete" line): steps of the old round still in flight do not count."""

    def ok() -> bool:
        records = history(home, name)
        joined = [r.t for r in records if isinstance(r, AgentRecord) and r.event == "rdzv_joined" and r.t > after]
        steps = [r for r in records if isinstance(r, TrainerRecord) and r.kind == "progress"]
        return bool(joined) and sum(r.world_size == world and r.t > joined[0] for r in steps) >= 10

    return Condition(f"10 steps at world {world} in a round after {after:.0f}", ok)


def await_recovery(sockets: dict, home: Path, name: str, world: int, after: float, timeout: float) -> None:
    """Wait for `recovered_at_world`; on a timeout, fail with what the cluster and its history show."""
    try:
        wait_for(recovered_at_world(home, name, world, after), timeout=timeout, interval=2)
    except ClusterError as error:
        status = sim(sockets, home, "status", name)
        rounds = [(r.node, r.round) for r in history(home, name) if isinstance(r, AgentRecord) and r.t > after]
        pytest.fail(f"{error}\n{status.stdout}{status.stderr}\nagents' rounds since: {rounds}")


def placement(socket: str, name: str) -> dict[str, str]:
    out = on(socket, "service", "ps", "--filter", "desired-state=running", "--format", "{{.Name}} {{.Node}}",
             *[f"{name}_node{i}" for i in range(4)])  # fmt: skip
    return {
        line.split()[0].split(".")[0].removeprefix(f"{name}_"): line.split()[1]
        for line in out.stdout.split("\n")
        if line
    }


def ours_left(socket: str, name: str) -> dict[str, list[str]]:
    flt = f"label=elastic-sim.cluster={name}"
    return {
        kind: on(socket, kind, "ls", "-aq" if kind == "container" else "-q", "--filter", flt).stdout.split()
        for kind in ("container", "network", "volume")
    }


def test_four_nodes_over_two_engines_survive_faults_on_the_second_and_down_leaves_nothing(two_engines, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # The shared checkpoint folder: both engines see this machine's file system at the same path.
    ckpt = Path(tempfile.mkdtemp(prefix="sim-shared-ckpt-", dir="/var/tmp"))
    os.chown(ckpt, 1000, 1000)
    name = f"sw2-{secrets.token_hex(2)}"
    added = sim(two_engines, home, "swarm", "add-host", HOSTS["b"][0], "--docker-host", two_engines["b"])
    assert added.returncode == 0, added.stderr
    figures = {}
    try:
        t0 = time.time()
        up = sim(two_engines, home, "up", "--engine", "swarm", "--name", name, "--nodes", "4", "--nproc-per-node", "1",
                 "--placement", "spread", "--ckpt-dir", str(ckpt), "--detach",
                 "--env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", *FAST, *JOB)  # fmt: skip
        assert up.returncode == 0, (up.stdout + up.stderr)[-3000:]
        # Spread: node i on host i mod 2, so node1 and node3 run on the second engine.
        assert placement(two_engines["a"], name) == {
            "node0": "sim-host-a", "node1": "sim-host-b", "node2": "sim-host-a", "node3": "sim-host-b",
        }  # fmt: skip
        await_recovery(two_engines, home, name, 4, 0, timeout=300)
        figures["first step at world 4 s"] = round(time.time() - t0, 1)

        for fault, args, world in (
            ("kill-worker", ["kill-worker", "--name", name, "node1"], 4),  # a worker on the second engine
            ("kill-node", ["kill", "--name", name, "node3"], 3),  # a node of the second engine
            ("partition", ["partition", "--name", name, "--isolate", "node1", "--for", "15s"], None),
        ):
            struck = time.time()
            done = sim(two_engines, home, *args)
            assert done.returncode == 0, f"{fault}: {done.stderr[-2000:]}"
            if fault == "partition":
                # The helper joined node1's network namespace on node1's engine: its rules name node1's peers.
                lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
                (rules,) = [line["rules"] for line in lines if "rules" in line]  # then, after --for, "healed"
                assert "node1" in rules and rules["node1"], done.stdout
                # Training goes on without node1 (world 2), then node1 comes back once healed (world 3).
                await_recovery(two_engines, home, name, 2, struck, timeout=240)
                await_recovery(two_engines, home, name, 3, struck + 15, timeout=300)
            else:
                await_recovery(two_engines, home, name, world, struck, timeout=300)

        logs = sim(two_engines, home, "logs", "--name", name)
        assert logs.returncode == 0, logs.stderr[-2000:]
        assert "@sim-host-a" in logs.stdout and "@sim-host-b" in logs.stdout, logs.stdout[-2000:]

        report = sim(two_engines, home, "report", name, timeout=300)
        assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
        (run,) = (home / "runs").glob(f"{name}-*")
        data = json.loads((run / "report" / "report.json").read_text())
        recoveries = {r["fault"]: r["recovery_s"] for r in data["recoveries"]}
        assert recoveries["kill-worker"] and recoveries["kill-node"], data["recoveries"]
        # The second engine's Docker events are in the history: node3's container died there.
        died = [r for r in History(run / "history.jsonl").records() if r.TYPE == "docker" and r.node == "node3"]
        assert any(r.action == "die" for r in died), died
        figures |= {f"{fault} recovery s": s for fault, s in recoveries.items()}
    finally:
        down = sim(two_engines, home, "down", name)
        removed = sim(two_engines, home, "swarm", "remove-host", HOSTS["b"][0])
        shutil.rmtree(ckpt, ignore_errors=True)
        print(f"two-engine swarm figures: {figures}")
    assert down.returncode == 0, down.stderr
    assert removed.returncode == 0, removed.stderr
    for key in ("a", "b"):
        left = ours_left(two_engines[key], name)
        assert left == {"container": [], "network": [], "volume": []}, (key, left)
    assert on(two_engines["a"], "service", "ls", "-q").stdout.split() == []  # the manager lists the swarm's
