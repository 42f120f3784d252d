"""Compound faults, really run (issue 36, item 4): the seed-style job (tests/scripts/seedjob/, etcd-v2, torch's
defaults but a 10 s last call, 3 nodes of 2 workers, --nnodes 1:4). A worker kill; the regroup's round waits the
last call because 3 < 4 nodes; node0 is killed inside that round, after it joined and before the round completed
(`at: {joining: 3, after: 3s}`: 3 s after the three agents entered the rendezvous, well inside the 10 s last call and
the 15 s keep-alive window); node1 and node2 then wait in the store for node0's part of the rank assignment; then a
scale-up. The verdict must name the node lost between join and rank assignment and the last-call wait, attribute the
second fault to the first one's regroup, and must not say "waiting for nodes" (3 nodes were live, the minimum is 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.core.history import History
from sim.verdict.report import format_summary
from sim.verdict.runfolder import judge
from sim.verdict.runmodel import RunModel
from tests.integration.test_environment import SEEDJOB, STEP_LOSS, write_samples

pytestmark = pytest.mark.docker


def test_node_lost_inside_a_regroup_is_named_and_attributed(sim_scenario, docker, images, tmp_path):
    data = tmp_path / "data"
    write_samples(data)
    scenario = tmp_path / "compound.yaml"
    scenario.write_text(f"""\
name: compound-lost-before-ranks
description: a worker kill, node0 lost inside the regroup's round before rank assignment, then a scale-up
cluster:
  nodes: 3
  min_nodes: 1
  max_nodes: 4
  nproc_per_node: 2
  max_restarts: 3
  rdzv_backend: etcd-v2
  rdzv_conf: {{last_call_timeout: 10}}
  project_dir: {SEEDJOB}
  script: {SEEDJOB / "train.py"}
  requirements: {SEEDJOB / "requirements.txt"}
  mounts: ["{data}:/data"]
  progress: '{STEP_LOSS}'
profile: torch-defaults
seed: 3
steps:
  - fault: kill-worker
    target: node1
    at: {{step: 25}}
  - fault: kill-node
    target: node0
    at: {{joining: 3, after: 3s}}
  - fault: scale
    nodes: 4
    at: {{after: 20s}}
expect:
  outcome: hangs  # node1 and node2 wait 300 s in the store: the harness stops after a minute of it
  hang_s: 60
# Generous: the start may wait for other clusters on a shared engine, and a loaded machine trains slowly.
timeout: 12m
""")
    (result,) = sim_scenario(str(scenario))
    assert result.unfired is None, result.unfired
    run_dir = Path(result.run_dir)
    run = RunModel(History(run_dir / "history.jsonl").read().records)
    logs = {p.stem: p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("node*.log"))}
    # Judged as `sim up` judges a job, which must recover: what the report got wrong.
    verdict, found = judge(run, logs, expected="recovers")
    summary = format_summary(verdict, run, title=run_dir.name, profile="torch-defaults", diagnoses=found)
    assert not verdict.valid, summary
    by_code = {d.code: d for d in found}
    assert "waiting-for-nodes" not in by_code, summary  # 3 live >= 1 (--min-nodes): its premise is false

    lost = by_code["lost-before-ranks"]
    assert lost.title.startswith("node0 lost between joining round"), lost.title
    assert "node1, node2 wait in the store" in lost.title
    assert "EtcdStore" in lost.cause and "300 s" in lost.cause
    assert any("node0 entered the rendezvous" in line for line in lost.evidence)
    assert any("fault kill-node on node0" in line for line in lost.evidence)
    assert sum("in a world of 3 nodes, node0 counted" in line for line in lost.evidence) == 2

    wait = by_code["last-call-wait"]
    assert "--nnodes 1:4" in wait.cause and "last_call_timeout=10" in wait.cause
    assert any("after kill-worker node1: the first agent entered the rendezvous" in line for line in wait.evidence)

    worker, node, scale = verdict.recoveries
    assert (worker.fault, node.fault, scale.fault) == ("kill-worker", "kill-node", "scale")
    assert worker.recovery_s is None and worker.regroup_cut_by == "kill-node node0"
    assert node.struck_during == "kill-worker node1" and node.recovery_s is None
    recovery = verdict.result("recovery")
    assert any(
        "kill-worker node1" in reason and "kill-node node0 struck during its regroup" in reason
        for reason in recovery.reasons
    ), recovery.reasons
    assert "struck during kill-worker node1's regroup" in summary, summary
