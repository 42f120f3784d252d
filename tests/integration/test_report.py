"""A real run through two faults, then its report: verdict, recovery times, picture."""

from __future__ import annotations

import json

import pytest

from sim.core.history import FILE_NAME, FaultRecord, History, TrainerRecord
from sim.core.wait import wait_for
from sim.engines.cluster import Cluster, JobFinished
from sim.faults.nemesis import Nemesis
from sim.verdict.runfolder import report_run
from tests.conftest import run_sim, unique_name
from tests.integration.test_faults import FAST, eventually

pytestmark = pytest.mark.docker


def max_step(history: History, after: float = 0.0) -> int:
    return max(
        (
            r.step
            for r in history.records()
            if isinstance(r, TrainerRecord) and r.kind == "progress" and r.step is not None and r.t > after
        ),
        default=0,
    )


def test_worker_kill_then_node_kill_report(docker, images):
    name = unique_name("t-report")
    result = run_sim(
        "up",
        "--name",
        name,
        "--detach",
        "--nodes",
        "3",
        "--max-restarts",
        "10",
        "--rdzv-conf",
        FAST,
        "--env",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        "--",
        "--steps",
        "150",
        "--step-time",
        "0.1",
        "--ckpt-interval",
        "10",
        "--pg-timeout",
        "15",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cluster = Cluster(name, docker)
    run_dir = cluster.run_dir
    history = History(run_dir / FILE_NAME)
    nemesis = Nemesis(cluster, history=history, seed=1)
    try:
        # Triggers are history conditions, not sleeps.
        eventually(lambda: max_step(history) >= 25, 120, what="step 25")
        first = nemesis.kill_worker(rank=1)
        fault_t = max(r.t for r in history.records() if isinstance(r, FaultRecord) and r.op == first["op"])
        eventually(lambda: max_step(history, after=fault_t) >= 70, 180, what="step 70 after the worker kill")
        nemesis.kill_node("node2")
        wait_for(JobFinished(cluster), timeout=300, interval=2)
    finally:
        run_sim("down", name)

    verdict, summary = report_run(run_dir)
    assert verdict.valid, summary
    assert [r.fault for r in verdict.recoveries] == ["kill-worker", "kill-node"], summary
    for recovery in verdict.recoveries:
        assert recovery.recovery_s is not None and recovery.recovery_s > 0, summary
        assert recovery.steps_lost is not None and 0 <= recovery.steps_lost <= 10, summary
    assert verdict.recoveries[1].world_before == 6 and verdict.recoveries[1].world_after == 4, summary

    report = json.loads((run_dir / "report" / "report.json").read_text())
    figures = [(r["fault"], r["recovery_s"], r["steps_lost"]) for r in report["recoveries"]]
    assert figures == [(r.fault, r.recovery_s, r.steps_lost) for r in verdict.recoveries]
    png = run_dir / "report" / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    html = (run_dir / "report" / "timeline.html").read_text()
    assert "data:image/png;base64," in html and "kill-worker" in html and "kill-node" in html
    assert "kill-worker" in summary and "kill-node" in summary
    assert "Node bounds: memory " in summary and "pids 4096 per node" in report["node_bounds"], summary

    cli = run_sim("report", str(run_dir))
    assert cli.returncode == 0, cli.stdout + cli.stderr
