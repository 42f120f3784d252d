"""The report on hand-written histories, judged by the real checkers: a 3-node x 2-worker run that
loses a worker (one restart, same world) and then a whole node (the world shrinks from 6 to 4)."""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from sim.verdict.checkers import CHECKS_FOR, RunSpec, check_all
from sim.verdict.report import ReportFiles, build_report, format_summary, write_report
from sim.verdict.runmodel import RunModel
from sim.verdict.timeline import build_timeline
from tests.unit.histories import HistoryBuilder

STEP_S = 0.1
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def docker(node: str, action: str, **fields) -> dict:
    return {"type": "docker", "node": node, "action": action, **fields}


def elastic_run(kill_worker_target: str = "node1") -> HistoryBuilder:
    """0 s   run starts, round 1 (3 nodes, world 6); training from step 1 at 2.6 s
     5.1 s  kill-worker node1 after step 26: every agent's group fails; round 2 (world 6) at 6.6 s,
            training resumes from checkpoint 20 (6 steps lost), first step at 9.2 s
    11.8 s  kill-node node2 after step 47: node0 and node1 fail; round 3 without node2 at 13.3 s,
            training resumes from checkpoint 40 at world 4 (7 steps lost) and finishes at 60"""
    run = HistoryBuilder(nodes=3, nproc=2, steps=60, ckpt=10)
    run.start_workers()
    run.train(26, step_s=STEP_S)
    run.fault("kill-worker", kill_worker_target, op="op1", node="node1", rank=2)
    run.add(type="agent", node="node1", event="worker_failed", local_rank=0, exitcode=-9, pid=41)
    run.group_failure()
    run.wait(1.0)
    run.start_workers(resumed_from=20)
    run.train(47, step_s=STEP_S)
    run.fault(
        "kill-node",
        "node2",
        op="op2",
        node="node2",
        effects=[docker("node2", "kill", signal="SIGKILL"), docker("node2", "die", exit_code=137)],
    )
    for node in ("node0", "node1"):
        run.add(type="agent", node=node, event="worker_failed", local_rank=0, exitcode=1, pid=77)
    run.group_failure(["node0", "node1"])
    run.wait(1.0)
    run.start_workers(resumed_from=40, nodes=["node0", "node1"])
    run.train(60, step_s=STEP_S)
    run.finish(nodes=["node0", "node1"])
    return run


def at(seconds: float, abs: float = 0.01):
    return pytest.approx(seconds, abs=abs)


@pytest.fixture(scope="module")
def elastic() -> HistoryBuilder:
    return elastic_run()


@pytest.fixture(scope="module")
def report(tmp_path_factory, elastic) -> ReportFiles:
    return write_report(
        elastic.model(),
        elastic.verdict(),
        tmp_path_factory.mktemp("report"),
        title="kill a worker, then a node",
        profile=None,
    )


def test_the_checkers_pass_the_elastic_run(elastic):
    verdict = elastic.verdict()
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    assert [(r.fault, r.recovery_s, r.steps_lost, r.world_before, r.world_after) for r in verdict.recoveries] == [
        ("kill-worker", 3.6, 6, 6, 6),
        ("kill-node", 3.6, 7, 6, 4),
    ]


# ---------------------------------------------------------------- files


def test_files_exist_and_png_is_a_real_picture(report):
    assert report.json.name == "report.json" and report.png.name == "timeline.png"
    assert report.html.name == "timeline.html"
    png = report.png.read_bytes()
    assert png.startswith(PNG_MAGIC)
    assert len(png) > 10_000


def test_json_holds_the_verdicts_figures(report, elastic):
    data = json.loads(report.json.read_text())
    verdict = elastic.verdict()
    assert data["verdict"] == "PASS" and data["expected"] == "recovers"
    assert data["profile"] == "fast"  # from the run record, as none was given
    assert [
        (r["fault"], r["target"], r["recovery_s"], r["steps_lost"], r["world_before"], r["world_after"])
        for r in data["recoveries"]
    ] == [(r.fault, r.target, r.recovery_s, r.steps_lost, r.world_before, r.world_after) for r in verdict.recoveries]
    assert [r["since_start_s"] for r in data["recoveries"]] == [at(5.6), at(12.3)]
    assert [c["name"] for c in data["checks"]] == list(CHECKS_FOR["recovers"])
    recovery = next(c for c in data["checks"] if c["name"] == "recovery")
    assert recovery["valid"] and "recovered in 3.6 s" in recovery["reasons"][0]
    assert data["restarts_per_node"] == {"node0": 2, "node1": 2, "node2": 1}
    assert data["rounds"] == 3
    assert data["training"]["highest_step"] == 60 and data["training"]["step_source"] == "trainer"
    assert data["job_end"] == [] and data["history"] == {"skipped_lines": 0}
    assert data["files"] == {"json": str(report.json), "png": str(report.png), "html": str(report.html)}


def test_html_is_self_contained_with_the_picture_and_both_faults(report):
    page = report.html.read_text()
    assert f"data:image/png;base64,{base64.b64encode(report.png.read_bytes()).decode()}" in page
    assert "kill-worker" in page and "kill-node" in page
    assert "3.6 s" in page and "6 → 4" in page
    assert "http://" not in page and "https://" not in page


def test_html_escapes_text_from_the_run(tmp_path):
    run = elastic_run(kill_worker_target="<script>alert(1)</script> & more")
    verdict = run.verdict()
    assert any("<script>" in reason for check in verdict.results for reason in check.reasons)
    page = write_report(run.model(), verdict, tmp_path, title="a <b>", profile="fast").html.read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "a &lt;b&gt;" in page


# ---------------------------------------------------------------- summary


def test_summary_names_verdict_faults_restarts_profile_and_files(report, elastic):
    text = format_summary(elastic.verdict(), elastic.model(), title="demo", profile="torch-defaults", files=report)
    assert "demo: PASS (expected: the job recovers)" in text
    completed = next(line for line in text.splitlines() if line.split()[:1] == ["completed"])
    assert "ok" in completed and "node2 excused" in completed
    fault_lines = [line for line in text.split("Faults:")[1].splitlines() if "kill-" in line]
    assert len(fault_lines) == 2
    assert "kill-worker" in fault_lines[0] and "3.6 s" in fault_lines[0] and "6 → 6" in fault_lines[0]
    assert "kill-node" in fault_lines[1] and "7" in fault_lines[1].split() and "6 → 4" in fault_lines[1]
    assert "+12.3 s" in fault_lines[1]
    assert "torch counts restarts per agent" in text and "node0 2, node1 2, node2 1" in text
    assert "Rendezvous rounds: 3" in text
    assert "Profile: torch defaults" in text
    assert str(report.png) in text and str(report.html) in text and str(report.json) in text


def stranded_run() -> HistoryBuilder:
    """node1 is killed after step 15 of 30; it needs both nodes (min_nodes 2), so no round follows."""
    run = HistoryBuilder(nodes=2, nproc=2, steps=30, ckpt=10, min_nodes=2)
    run.start_workers()
    run.train(15, step_s=STEP_S)
    run.fault("kill-node", "node1", node="node1", effects=[docker("node1", "die", exit_code=137)])
    run.wait(5.0)
    run.end()
    return run


def test_summary_of_a_failed_check_and_an_unrecovered_fault():
    run = stranded_run()
    verdict = run.verdict()
    failed = next(r for r in verdict.results if not r.valid)
    assert len(failed.reasons) > 1
    text = format_summary(verdict, run.model(), title="demo", profile=None)
    assert "demo: FAIL" in text
    check_line = next(line for line in text.splitlines() if line.split()[:1] == [failed.name])
    assert "FAIL" in check_line and failed.reasons[0] in check_line
    assert failed.reasons[1] not in text  # only the first reason
    fault_line = next(line for line in text.split("Faults:")[1].splitlines() if "kill-node" in line)
    assert fault_line.split()[4:6] == ["never", "-"]  # never recovered: no steps-lost figure
    assert "Profile: fast" in text


# ---------------------------------------------------------------- the timeline as data


def test_timeline_lanes_show_restart_death_and_running(elastic):
    timeline = build_timeline(elastic.model(), elastic.verdict())
    assert list(timeline.lanes) == ["node0", "node1", "node2"]
    node1, node2 = timeline.lanes["node1"], timeline.lanes["node2"]
    assert node1["restarting"][1] == (at(5.6), at(9.2))  # worker failed .. its next progress
    assert node2["dead"] == [(at(12.05), at(timeline.end))]  # killed, never started again
    assert node2["running"][-1][1] == at(11.8)  # last progress before the kill
    assert timeline.end == at(20.3)


def test_timeline_steps_world_faults_and_rounds(elastic):
    timeline = build_timeline(elastic.model(), elastic.verdict())
    steps = [step for _, step in timeline.steps]
    assert max(steps) == 60
    assert any(b < a for a, b in itertools.pairwise(steps))  # the falls back to checkpoints 20 and 40
    assert [size for _, size in timeline.world] == [6, 4]
    assert [(span.label, span.start, span.end, span.outcome) for span in timeline.faults] == [
        ("kill-worker node1", at(5.1), at(9.2), "recovered in 3.6 s, 6 steps lost"),
        ("kill-node node2", at(11.8), at(15.9), "recovered in 3.6 s, 7 steps lost"),
    ]
    assert [label for _, label in timeline.rounds] == ["round 1", "round 2", "round 3"]
    assert max(rate for _, rate in timeline.throughput) == pytest.approx(1 / STEP_S, rel=0.3)


def test_partition_shades_the_nodes_it_names_until_heal_all():
    run = HistoryBuilder(nodes=3, nproc=1, steps=40)
    run.add(type="docker", node="etcd", action="start")
    run.start_workers()
    run.train(10)
    run.fault("partition", "node0 | node1,node2", id="partition-abc")
    run.train(12)
    run.fault("partition", "node2 -/-> etcd", id="partition-def")
    run.train(15)
    run.fault("heal", "all", healed=["partition-abc", "partition-def"])
    run.train(40)
    run.finish()
    timeline = build_timeline(run.model(), run.verdict())
    assert timeline.lanes["node0"]["partitioned"] == [(at(13.0), at(19.0))]  # its ok .. the heal's ok
    assert len(timeline.lanes["node2"]["partitioned"]) == 2
    assert "node10" not in timeline.lanes and list(timeline.lanes)[-1] == "etcd"
    assert timeline.lanes["etcd"]["running"] == [(at(0.0), at(timeline.end))]  # up throughout
    assert [(span.label, span.end) for span in timeline.faults] == [
        ("partition node0 | node1,node2", at(19.0)),
        ("partition node2 -/-> etcd", at(19.0)),
    ]


def test_pause_lasts_until_unpause():
    run = HistoryBuilder(nodes=2, nproc=1, steps=20)
    run.start_workers()
    run.train(5)
    run.fault("pause", "random", node="node1", effects=[docker("node1", "pause")])
    run.wait(3.0)
    run.fault("unpause", "node1", node="node1", effects=[docker("node1", "unpause")])
    run.train(20)
    run.finish()
    timeline = build_timeline(run.model(), run.verdict())
    assert timeline.lanes["node1"]["paused"] == [(at(7.75), at(11.25))]
    assert [(span.label, span.start, span.end) for span in timeline.faults] == [
        ("pause random → node1", at(7.5), at(11.5))
    ]


# ---------------------------------------------------------------- a run meant to fail


def etcd_loss_run() -> HistoryBuilder:
    """2 nodes x 1 worker; etcd is killed (invoke at 5.4 s) and both agents exit 1 within 1.7 s."""
    run = HistoryBuilder(nodes=2, nproc=1, steps=300)
    run.add(type="docker", node="etcd", action="start")
    run.start_workers()
    run.train(29, step_s=STEP_S)
    run.fault("kill-node", "etcd", node="etcd", effects=[docker("etcd", "die", exit_code=137)])
    run.wait(0.9)
    run.die("node0", 1)
    run.wait(0.3)
    run.die("node1", 1)
    run.end()
    return run


def test_a_run_meant_to_fail_shows_how_soon_each_fault_ended_it():
    run = etcd_loss_run()
    verdict = run.verdict(expected="fails", fail_fast_s=30.0)
    assert verdict.valid, verdict.results
    text = format_summary(verdict, run.model(), title="etcd-loss", profile="fast")
    fault_line = next(line for line in text.split("Faults:")[1].splitlines() if "kill-node" in line)
    assert fault_line.split() == ["+5.4", "s", "kill-node", "etcd", "2", "within", "1.7", "s"]
    (span,) = build_timeline(run.model(), verdict).faults
    assert (span.start, span.end) == (at(5.4), at(7.1))  # up to the last exit
    assert span.outcome == "agents ended 1.7 s later"


# ---------------------------------------------------------------- sparse histories

SPARSE_BOUNDS = {"min_nodes": 1, "max_nodes": 2, "nproc_per_node": 1, "max_restarts": 0}


@pytest.mark.parametrize(
    "history",
    [
        [],
        [{"t": 0.0, "type": "run", "event": "start", "spec": {"nodes": 2}, "profile": "fast"}],  # nodes without records
        [
            {"t": 0.0, "type": "run", "event": "start"},
            {"t": 1.0, **docker("node0", "start")},
            {"t": 2.0, "type": "agent", "node": "node0", "event": "rdzv_timeout"},
        ],
        [{"t": 3.0, "type": "trainer", "node": "node0", "kind": "progress", "rank": 0, "step": 1, "world_size": 1}],
    ],
    ids=["empty", "no-records-per-node", "no-progress", "single-progress-line"],
)
def test_sparse_histories_still_produce_every_file(tmp_path, history):
    run = RunModel(history)
    verdict = check_all(run, RunSpec.from_run(run, **SPARSE_BOUNDS))
    assert not verdict.valid  # nothing finished
    files = write_report(run, verdict, tmp_path, title="sparse", profile=None)
    assert files.png.read_bytes().startswith(PNG_MAGIC)
    assert json.loads(files.json.read_text())["verdict"] == "FAIL"
    assert "data:image/png;base64," in files.html.read_text()
    assert "sparse: FAIL" in format_summary(verdict, run, title="sparse", profile=None)


def test_the_verdict_hands_the_report_the_checkers_own_recoveries_and_the_report_is_typed(elastic):
    """The seam is typed: the verdict's recoveries are the recovery checker's FaultRecovery objects (not
    rebuilt from its metrics), the report reads them as fields, and report.json is the report's to_json()."""
    from sim.verdict import FaultRecovery
    from sim.verdict.report import build_report, render_html

    run, verdict = elastic.model(), elastic.verdict()
    assert verdict.recoveries == verdict.result("recovery").metrics.recoveries
    assert all(isinstance(r, FaultRecovery) for r in verdict.recoveries)
    typed = build_report(verdict, run, title="t", profile=None)
    assert [row.recovery for row in typed.recoveries] == list(verdict.recoveries)
    assert typed.training.highest_step == 60 and typed.word == "PASS" and typed.devices is None
    data = typed.to_json()
    assert json.loads(json.dumps(data, default=str))["recoveries"][1]["world_after"] == 4
    assert data["checks"][[c["name"] for c in data["checks"]].index("recovery")]["metrics"]["recoveries"][0][
        "fault"
    ] == ("kill-worker")
    assert "<td>kill-node</td>" in render_html(typed, b"png")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"memory": None, "memory_limit": 3 * 2**30, "pids": 4096},
         "memory 3072 MiB per node, no swap (the default share of this machine; --memory sets it); pids 4096 per node"),
        ({"memory": "2g", "memory_limit": 2 * 2**30, "pids": 2048}, "memory 2048 MiB per node, no swap (--memory)"),
        ({"memory": "none", "memory_limit": None, "pids": 4096}, "no memory limit (--memory none); pids 4096"),
        ({"memory": None}, None),  # a history from before nodes had bounds
    ],
)  # fmt: skip
def test_the_report_states_each_nodes_bounds(spec, words):
    """A node that ran out of memory was bounded by this: the summary, report.json and the page say it."""
    records = [{"t": 1.0, "type": "run", "event": "start", "spec": spec}]
    run = RunModel(records)
    verdict = check_all(run, RunSpec(min_nodes=1, max_nodes=1, nproc_per_node=1, max_restarts=0))
    summary = format_summary(verdict, run, title="bounds", profile=None)
    data = build_report(verdict, run, title="bounds", profile=None).to_json()
    if words is None:
        assert "Node bounds" not in summary and data["node_bounds"] is None
    else:
        assert f"Node bounds: {words}" in summary, summary
        assert data["node_bounds"].startswith(words)
