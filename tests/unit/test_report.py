"""The report on a hand-written history: a 3-node x 2-worker run that loses a worker
(one restart, same world) and then a whole node (the world shrinks from 6 to 4)."""

from __future__ import annotations

import base64
import json

import pytest

from sim.report import ReportFiles, build_timeline, format_summary, write_report
from sim.verdict import CheckResult, FaultRecovery, Verdict

T0 = 1_700_000_000.0
NODES = ("node0", "node1", "node2")
WORKERS_PER_NODE = 2
STEP_S = 0.1
CKPT_INTERVAL = 10
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- history builders

def at(seconds: float, **record) -> dict:
    return {"t": T0 + seconds, **record}


def docker(seconds: float, node: str, action: str, **extra) -> dict:
    return at(seconds, type="docker", node=node, action=action, **extra)


def agent(seconds: float, node: str, event: str, **extra) -> dict:
    return at(seconds, type="agent", node=node, event=event, **extra)


def fault(seconds: float, op: str, name: str, target: str, phase: str, **extra) -> dict:
    return at(seconds, type="fault", op=op, fault=name, target=target, phase=phase, **extra)


def rendezvous(seconds: float, nodes: tuple[str, ...], round_: int, restart: int) -> list[dict]:
    world = len(nodes) * WORKERS_PER_NODE
    return [record for group_rank, node in enumerate(nodes) for record in (
        agent(seconds, node, "rdzv_joined", round=round_, group_rank=group_rank, nodes=len(nodes)),
        agent(seconds + 0.2, node, "rdzv_complete", restart_count=restart, group_rank=group_rank,
              group_world_size=len(nodes), global_world_size=world))]


def training(start_s: float, nodes: tuple[str, ...], first_step: int, last_step: int, restart: int) -> list[dict]:
    """One start of the job: a start line per worker, then a progress line per worker every
    STEP_S, and a checkpoint from rank 0 every CKPT_INTERVAL steps."""
    world = len(nodes) * WORKERS_PER_NODE
    ranks = [(node, group_rank * WORKERS_PER_NODE + local, local)
             for group_rank, node in enumerate(nodes) for local in range(WORKERS_PER_NODE)]

    def trainer(seconds, node, rank, local, kind, **extra):
        return at(seconds, type="trainer", node=node, kind=kind, rank=rank, local_rank=local,
                  world_size=world, restart=restart, run_id="r1", **extra)

    records = [trainer(start_s, node, rank, local, "start", resumed_from=first_step - 1,
                       ckpt_world_size=None, backend="gloo") for node, rank, local in ranks]
    for step in range(first_step, last_step + 1):
        seconds = start_s + 0.5 + (step - first_step) * STEP_S
        records += [trainer(seconds + 0.001 * rank, node, rank, local, "progress", step=step, epoch=0, loss=1 / step)
                    for node, rank, local in ranks]
        if step % CKPT_INTERVAL == 0:
            records.append(trainer(seconds + 0.01, *ranks[0], "checkpoint", step=step,
                                   path=f"/ckpt/ckpt-{step:08d}.pt"))
    return records


def elastic_run() -> list[dict]:
    """  0 s   run starts, containers start, round 1 (3 nodes, world 6)
         2.5 s  training from step 1
         8.1 s  kill-worker node1 after step 56: node1's group fails, the others see the new round
        10.5 s  round 2 (world 6), training resumes from checkpoint 50 (6 steps lost)
        17.1 s  kill-node node2 after step 114: node0 and node1 fail, round 3 without node2
        21.5 s  training resumes from checkpoint 110 at world 4 (4 steps lost) and finishes at 200"""
    records = [at(0.0, type="run", event="start", spec={"name": "demo", "nodes": 3}, profile="fast",
                  target_steps=200, ckpt_interval=CKPT_INTERVAL)]
    records += [docker(0.1, node, action) for node in ("etcd", *NODES) for action in ("create", "start")]
    records += rendezvous(1.5, NODES, 1, 0)
    records += training(2.0, NODES, 1, 56, 0)

    records += [fault(8.05, "op1", "kill-worker", "node1", "invoke", args={"signal": "SIGKILL"}),
                fault(8.1, "op1", "kill-worker", "node1", "ok", result={"node": "node1", "rank": 2})]
    records += [agent(8.2, "node1", "worker_failed", local_rank=0, exitcode=-9, pid=41),
                agent(8.3, "node1", "group_failed", attempts_left=2, max_restarts=3),
                agent(8.6, "node0", "new_nodes", count=1), agent(8.6, "node2", "new_nodes", count=1)]
    records += rendezvous(9.5, NODES, 2, 1)
    records += training(10.0, NODES, 51, 114, 1)

    records += [fault(17.05, "op2", "kill-node", "node2", "invoke", args={}),
                fault(17.1, "op2", "kill-node", "node2", "ok", result={"node": "node2"}),
                docker(17.1, "node2", "kill", signal="SIGKILL"), docker(17.11, "node2", "die", exit_code=137)]
    records += [event for node in ("node0", "node1") for event in (
        agent(18.0, node, "worker_failed", local_rank=0, exitcode=1, pid=77),
        agent(18.1, node, "group_failed", attempts_left=1, max_restarts=3))]
    records += rendezvous(20.5, ("node0", "node1"), 3, 2)
    records += training(21.0, ("node0", "node1"), 111, 200, 2)
    records += [agent(30.0, node, "group_finished") for node in ("node0", "node1")]
    records.append(at(30.5, type="run", event="end"))
    return sorted(records, key=lambda r: r["t"])


def elastic_verdict() -> Verdict:
    return Verdict(
        valid=True, expected="recovers",
        results=(CheckResult("finished", True, ("reached step 200",), {"final_step": 200}),
                 CheckResult("recovery_time", True, ("slowest recovery 4.9 s <= 60 s",), {"max_recovery_s": 4.9}),
                 CheckResult("restarts_within_budget", True, (), {"max_restarts": 3})),
        recoveries=(FaultRecovery("op1", "kill-worker", "node1", T0 + 8.1, T0 + 10.5, 2.4, 6, 6, 6),
                    FaultRecovery("op2", "kill-node", "node2", T0 + 17.1, T0 + 21.5, 4.4, 4, 6, 4)),
        restarts_per_node={"node0": 2, "node1": 2, "node2": 1}, rounds=3)


def empty_verdict() -> Verdict:
    return Verdict(valid=False, expected="recovers", results=(), recoveries=(), restarts_per_node={}, rounds=0)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> ReportFiles:
    return write_report(elastic_run(), elastic_verdict(), tmp_path_factory.mktemp("report"),
                        title="kill a worker, then a node", profile=None)


# ---------------------------------------------------------------- files

def test_files_exist_and_png_is_a_real_picture(report):
    assert report.json.name == "report.json" and report.png.name == "timeline.png"
    assert report.html.name == "timeline.html"
    png = report.png.read_bytes()
    assert png.startswith(PNG_MAGIC)
    assert len(png) > 10_000


def test_json_holds_the_verdicts_figures(report):
    data = json.loads(report.json.read_text())
    verdict = elastic_verdict()
    assert data["verdict"] == "PASS" and data["expected"] == "recovers"
    assert data["profile"] == "fast"  # from the run record, as none was given
    assert [(r["fault"], r["target"], r["recovery_s"], r["steps_lost"], r["world_before"], r["world_after"])
            for r in data["recoveries"]] == [(r.fault, r.target, r.recovery_s, r.steps_lost, r.world_before,
                                              r.world_after) for r in verdict.recoveries]
    assert [r["since_start_s"] for r in data["recoveries"]] == [8.1, 17.1]
    assert [c["name"] for c in data["checks"]] == ["finished", "recovery_time", "restarts_within_budget"]
    assert data["checks"][1]["metrics"] == {"max_recovery_s": 4.9}
    assert data["restarts_per_node"] == {"node0": 2, "node1": 2, "node2": 1}
    assert data["rounds"] == 3
    assert data["files"]["png"] == str(report.png)


def test_html_is_self_contained_with_the_picture_and_both_faults(report):
    page = report.html.read_text()
    assert f"data:image/png;base64,{base64.b64encode(report.png.read_bytes()).decode()}" in page
    assert "kill-worker" in page and "kill-node" in page
    assert "2.4 s" in page and "4.4 s" in page
    assert "http://" not in page and "https://" not in page


def test_html_escapes_text_from_the_run(tmp_path):
    verdict = Verdict(valid=False, expected="recovers", rounds=0, restarts_per_node={"node0": 0},
                      results=(CheckResult("finished", False, ("<script>alert(1)</script> & more",)),),
                      recoveries=(FaultRecovery("op", "partition", "node0 | node1", T0, None, None, None, 2, None),))
    page = write_report([], verdict, tmp_path, title="a <b>", profile="fast").html.read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "a &lt;b&gt;" in page


# ---------------------------------------------------------------- summary

def test_summary_names_verdict_faults_restarts_profile_and_files(report):
    text = format_summary(elastic_verdict(), elastic_run(), title="demo", profile="torch-defaults", files=report)
    assert "demo: PASS (expected: the job recovers)" in text
    assert "finished" in text and "reached step 200" in text
    fault_lines = [line for line in text.splitlines() if "kill-" in line]
    assert len(fault_lines) == 2
    assert "kill-worker" in fault_lines[0] and "2.4 s" in fault_lines[0] and "6 → 6" in fault_lines[0]
    assert "kill-node" in fault_lines[1] and "4.4 s" in fault_lines[1] and "6 → 4" in fault_lines[1]
    assert "+17.1 s" in fault_lines[1]
    assert "torch counts restarts per agent" in text and "node0 2, node1 2, node2 1" in text
    assert "Rendezvous rounds: 3" in text
    assert "Profile: torch defaults" in text
    assert str(report.png) in text and str(report.html) in text and str(report.json) in text


def test_summary_of_a_failed_check_and_an_unrecovered_fault():
    verdict = Verdict(valid=False, expected="recovers", rounds=1, restarts_per_node={},
                      results=(CheckResult("finished", False, ("stopped at step 40", "no summary line")),),
                      recoveries=(FaultRecovery("op", "kill-node", "node1", T0 + 5, None, None, None, 4, None),))
    text = format_summary(verdict, [], title="demo", profile=None)
    assert "demo: FAIL" in text
    check_line = next(line for line in text.splitlines() if "finished" in line)
    assert "FAIL" in check_line and "stopped at step 40" in check_line
    assert "no summary line" not in text  # only the first reason
    assert "never" in text and "4 → ?" in text
    assert "Profile: unknown" in text


# ---------------------------------------------------------------- the timeline as data

def test_timeline_lanes_show_restart_death_and_running():
    timeline = build_timeline(elastic_run(), elastic_verdict())
    assert list(timeline.lanes) == ["node0", "node1", "node2", "etcd"]
    node1, node2 = timeline.lanes["node1"], timeline.lanes["node2"]
    assert node1["restarting"][1] == pytest.approx((8.2, 10.502))  # worker failed .. its next progress
    assert node2["dead"] == [(pytest.approx(17.1), pytest.approx(30.5))]  # killed, never started again
    assert node2["running"][-1][1] == pytest.approx(16.8, abs=0.01)  # last progress before the kill
    assert timeline.lanes["etcd"]["running"] == [(pytest.approx(0.1), pytest.approx(30.5))]  # up throughout
    assert not timeline.lanes["etcd"]["restarting"]


def test_timeline_steps_world_faults_and_rounds():
    timeline = build_timeline(elastic_run(), elastic_verdict())
    steps = [step for _, step in timeline.steps]
    assert max(steps) == 200
    assert any(b < a for a, b in zip(steps, steps[1:]))  # the falls back to checkpoints 50 and 110
    assert [size for _, size in timeline.world] == [6, 4]
    assert [(span.label, round(span.start, 2), round(span.end, 2)) for span in timeline.faults] == [
        ("kill-worker node1", 8.05, 10.5), ("kill-node node2", 17.05, 21.5)]
    assert [label for _, label in timeline.rounds] == ["round 1", "round 2", "round 3"]
    assert max(rate for _, rate in timeline.throughput) == pytest.approx(1 / STEP_S, rel=0.3)


def test_partition_shades_the_nodes_it_names_until_heal_all():
    history = [at(0, type="run", event="start", spec={"nodes": 3}),
               fault(1, "p", "partition", "node0 | node1,node2", "invoke"),
               fault(1.1, "p", "partition", "node0 | node1,node2", "ok", result={"id": "partition-abc"}),
               fault(2, "q", "partition", "node2 -/-> etcd", "ok", result={"id": "partition-def"}),
               fault(5, "h", "heal", "all", "ok", result={"healed": ["partition-abc", "partition-def"]}),
               at(6, type="run", event="end")]
    timeline = build_timeline(history, empty_verdict())
    assert timeline.lanes["node0"]["partitioned"] == [(pytest.approx(1.1), pytest.approx(5))]
    assert len(timeline.lanes["node2"]["partitioned"]) == 2
    assert "node10" not in timeline.lanes
    assert [(span.label, span.end) for span in timeline.faults] == [
        ("partition node0 | node1,node2", pytest.approx(5)), ("partition node2 -/-> etcd", pytest.approx(5))]


def test_pause_lasts_until_unpause():
    history = [at(0, type="run", event="start"),
               fault(1, "p", "pause", "random", "ok", result={"node": "node1"}),
               docker(1, "node1", "pause"), docker(4, "node1", "unpause"),
               fault(4, "u", "unpause", "node1", "ok", result={"node": "node1"})]
    timeline = build_timeline(history, empty_verdict())
    assert timeline.lanes["node1"]["paused"] == [(pytest.approx(1), pytest.approx(4))]
    assert [(span.label, span.end) for span in timeline.faults] == [("pause random → node1", pytest.approx(4))]


# ---------------------------------------------------------------- a run meant to fail

def etcd_loss_run() -> list[dict]:
    """2 nodes x 1 worker; etcd is killed at 5 s and both agents exit 1 a second later."""
    history = [at(0, type="run", event="start", profile="fast", target_steps=300, ckpt_interval=10,
                  spec={"nodes": 2, "nproc_per_node": 1, "max_restarts": 3}),
               docker(0.1, "etcd", "start"), docker(0.2, "node0", "start"), docker(0.2, "node1", "start")]
    for step in range(1, 30):
        history += [at(2 + step * STEP_S, type="trainer", node=f"node{rank}", kind="progress", rank=rank,
                       world_size=2, restart=0, step=step, loss=1.0) for rank in (0, 1)]
    history += [fault(5.0, "k", "kill-node", "etcd", "invoke"), docker(5.05, "etcd", "die", exit_code=137),
                fault(5.1, "k", "kill-node", "etcd", "ok", result={"node": "etcd"}),
                docker(6.0, "node0", "die", exit_code=1), docker(6.3, "node1", "die", exit_code=1),
                at(7.0, type="run", event="end")]
    return history


def test_a_run_meant_to_fail_shows_how_soon_each_fault_ended_it():
    from sim.checkers import RunSpec, check_all
    history = etcd_loss_run()
    verdict = check_all(history, RunSpec.from_history(history, expected="fails", fail_fast_s=30.0))
    assert verdict.valid, verdict.results
    text = format_summary(verdict, history, title="etcd-loss", profile="fast")
    fault_line = next(line for line in text.splitlines() if "kill-node" in line)
    assert fault_line.split() == ["+5.0", "s", "kill-node", "etcd", "2", "within", "1.3", "s"]
    (span,) = build_timeline(history, verdict).faults
    assert (span.start, span.end) == (pytest.approx(5.0), pytest.approx(6.3))  # up to the last exit
    assert span.outcome == "agents ended 1.3 s later"


# ---------------------------------------------------------------- sparse histories

@pytest.mark.parametrize("history", [
    [],
    [at(0, type="run", event="start", spec={"nodes": 2}, profile="fast")],  # nodes with no records at all
    [at(0, type="run", event="start"), docker(1, "node0", "start"), agent(2, "node0", "rdzv_timeout")],
    [at(3, type="trainer", node="node0", kind="progress", rank=0, step=1, world_size=1)],  # one line, no run record
], ids=["empty", "no-records-per-node", "no-progress", "single-progress-line"])
def test_sparse_histories_still_produce_every_file(tmp_path, history):
    files = write_report(history, empty_verdict(), tmp_path, title="sparse", profile=None)
    assert files.png.read_bytes().startswith(PNG_MAGIC)
    assert json.loads(files.json.read_text())["verdict"] == "FAIL"
    assert "data:image/png;base64," in files.html.read_text()
    assert "sparse: FAIL" in format_summary(empty_verdict(), history, title="sparse", profile=None)
