"""A plain third-party DDP script, unchanged, in real containers: its optimizer steps reach the run's
history through the workers' side channel, and its own output stays its own."""

from __future__ import annotations

import textwrap

import pytest

from sim.core.history import FILE_NAME, History
from sim.core.wait import Condition, wait_for
from sim.engines.cluster import JobFinished
from tests.conftest import unique_name

pytestmark = pytest.mark.docker

STEPS = 30
# Knows nothing of elastic-sim: plain text output, SGD (no step in its state), torch.save.
PLAIN_DDP = textwrap.dedent(f"""
    import time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, {STEPS} + 1):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {{step}} loss {{loss.item():.4f}}", flush=True)
        time.sleep(0.05)
    if rank == 0:
        torch.save(model.module.state_dict(), "/tmp/model.pt")
    dist.destroy_process_group()
    print(f"rank {{rank}} done", flush=True)
""")


def worker_records(history: History) -> list[dict]:
    return [r.to_dict() for r in history.records() if r.TYPE == "worker"]  # as the side channel wrote them


def test_plain_ddp_script_is_recorded_without_touching_its_output(sim_cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_DDP)
    tmp_path.chmod(0o755)  # mounted into the nodes, where the workers run as another user
    cluster = sim_cluster(
        name=unique_name("t-instrument"),
        nodes=2,
        nproc_per_node=1,
        rdzv_backend="c10d",
        script=str(script),
        progress_regex=r"step (?P<step>\d+) loss (?P<loss>[\d.]+)",
    )
    wait_for(JobFinished(cluster), timeout=240, interval=2)
    for node in cluster.nodes():
        assert node.exit_code == 0, f"{node.node}: {node.status}\n{cluster.logs(node.node, tail=40)}"

    history = History(cluster.run_dir / FILE_NAME)
    # The collector polls the side channel 4 times a second; the checks below say what is missing.
    both_exited = Condition(
        "both workers' exit records", lambda: sum(r["event"] == "exit" for r in worker_records(history)) >= 2
    )
    wait_for(both_exited, timeout=30, interval=0.5, raise_errors=False)
    records = worker_records(history)
    by_rank = {rank: [r for r in records if r.get("rank") == rank] for rank in (0, 1)}
    node_of = {rank: mine[0]["node"] for rank, mine in by_rank.items() if mine}
    assert sorted(node_of.values()) == ["node0", "node1"], node_of
    for rank, mine in by_rank.items():
        events = [r["event"] for r in mine]
        assert events[0] == "start" and events[-1] == "exit", (rank, events)
        assert mine[-1]["code"] == 0
        steps = [r for r in mine if r["event"] == "step"]
        assert steps[0]["n"] == 1 and steps[-1]["n"] == STEPS, (rank, steps)
        assert all(r.get("step") is None for r in steps)  # SGD keeps no step count
        assert {(r["node"], r["world_size"], r["local_rank"], r["restart"]) for r in mine} == {(node_of[rank], 2, 0, 0)}
    # --progress-regex on rank 0's printed lines.
    logged = [(r["node"], r["step"], r["source"]) for r in records if r["event"] == "progress"]
    assert logged == [(node_of[0], 10, "log"), (node_of[0], 20, "log"), (node_of[0], 30, "log")]

    for rank, node in node_of.items():
        log = cluster.logs(node)
        # The script's own lines are there; nothing of the instrumentation is.
        assert f"rank {rank} done" in log
        assert "elastic_sim" not in log and '"event"' not in log and "Traceback" not in log, log[-3000:]
