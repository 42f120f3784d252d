"""slow-disk on a real cluster, from the CLI: a checkpoint save (torch.save, flushed and fsynced, as a careful
or a torch.distributed.checkpoint save is) on the throttled node is held to the rate, the limit sits in that
node's block-I/O cgroup only, `sim faults` lists it, and heal lifts it. The effect is a lower bound (the throttle
never lets more through, however idle the machine), so no timing of an unthrottled save is asserted."""

from __future__ import annotations

import json

import pytest

from sim.core.history import FILE_NAME, History
from sim.core.spec import ClusterSpec
from sim.engines.cluster import Cluster, up
from tests.conftest import run_sim, unique_name

pytestmark = pytest.mark.docker

RATE = 2**20  # 1 MiB/s
SAVE = 8 * 2**20  # an 8 MiB checkpoint: at least 8 s under the throttle
SAVE_CODE = f"""import os, time, torch
t = time.monotonic()
with open("/ckpt/slow-disk-probe.pt", "wb") as f:
    torch.save({{"w": torch.ones({SAVE // 4}, dtype=torch.float32)}}, f)
    f.flush()
    os.fsync(f.fileno())
print(time.monotonic() - t)
"""
LIMITS = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device"


@pytest.fixture(scope="module")
def cluster(docker, images):
    spec = ClusterSpec(name=unique_name("t-slowdisk"), nodes=2, nproc_per_node=1)
    try:
        yield up(spec, docker, progress=lambda line: None)
    finally:
        run_sim("down", spec.name)


def sim(cluster: Cluster, *args: str) -> dict:
    result = run_sim(*args, "--name", cluster.name)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[0]) if result.stdout.strip().startswith("{") else {}


def save_s(cluster: Cluster, node: str) -> float:
    done = cluster.exec(node, "python3", "-c", SAVE_CODE, timeout=180)
    assert done.ok, done.stderr
    return float(done.stdout.strip().splitlines()[-1])


def limits(cluster: Cluster, node: str) -> str:
    return cluster.exec(node, "cat", LIMITS).stdout.strip()


def test_slow_disk_holds_a_nodes_checkpoint_save_to_the_rate_until_healed(cluster):
    before = save_s(cluster, "node1")
    result = sim(cluster, "slow-disk", "node1", "--write-rate", "1m")
    assert result["id"] == "slow-disk-node1" and result["write_rate"] == RATE
    assert limits(cluster, "node1").endswith(f" {RATE}") and limits(cluster, "node0") == ""
    listed = run_sim("faults", "--name", cluster.name)
    assert "slow-disk-node1" in listed.stdout, listed.stdout + listed.stderr
    throttled = save_s(cluster, "node1")
    # 8 MiB at 1 MiB/s: 8 s at least (the first slice may pass before the throttle has a debt: 6 s allowed).
    assert throttled >= 6.0, (before, throttled)
    sim(cluster, "heal", "slow-disk-node1")
    assert limits(cluster, "node1") == ""
    records = [r for r in History(cluster.run_dir / FILE_NAME).records() if r.TYPE == "fault"]
    assert [(r.fault, r.phase) for r in records if r.fault == "slow-disk"] == [
        ("slow-disk", "invoke"),
        ("slow-disk", "ok"),
    ]
