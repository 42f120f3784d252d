"""The checkers and the report on scripts that are not ours: hand-written histories of what the
instrumentation, a progress regex and torch's agents record for a plain third-party script."""

from sim.core.history import parse_record
from sim.engines.cluster import _training_started
from sim.verdict.report import format_summary
from sim.verdict.runmodel import RunModel
from sim.verdict.timeline import build_timeline
from tests.unit.histories import HistoryBuilder, ScriptRun


def _by_name(verdict):
    return {r.name: r for r in verdict.results}


def test_plain_sgd_script_recovers_timed_by_optimizer_steps():
    run = ScriptRun()
    run.start_workers()
    run.train(20)
    run.kill_worker("node1")
    run.start_workers()
    run.train(15)
    run.finish()
    verdict = run.verdict()
    results = _by_name(verdict)
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    (recovery,) = verdict.recoveries
    # ok at +1.3 s after invoke; 4 s to the new group, 2 s to its workers, 1 s to init, 1 s to the first step.
    assert recovery.recovery_s == 8.0 and recovery.world_after == 2 and recovery.steps_lost is None
    assert recovery.throughput_before == 1.0 and recovery.throughput_after == 1.0
    assert results["completed"].measured and results["completed"].valid
    # SGD keeps no step count: a resume cannot be told from a fresh start, and the checker says so.
    assert not results["progress"].measured and "counted per worker process" in results["progress"].reasons[0]
    assert not results["loss_continuity"].measured and "--progress-regex" in results["loss_continuity"].reasons[0]
    assert results["recovery"].measured and "recovered in 8.0 s" in results["recovery"].reasons[0]
    assert verdict.restarts_per_node == {"node0": 1, "node1": 1}


def test_adam_script_gives_steps_lost_from_the_optimizer_state():
    run = ScriptRun(absolute_steps=True)
    run.start_workers()
    run.train(20)
    run.kill_worker("node0")
    run.start_workers(resumed_from=10)  # the script's own checkpoint was at step 10
    run.train(30)
    run.finish()
    verdict = run.verdict()
    (recovery,) = verdict.recoveries
    assert recovery.steps_lost == 10
    progress = _by_name(verdict)["progress"]
    assert progress.measured and progress.valid
    assert progress.metrics.step_source == "optimizer"
    assert progress.metrics.step_efficiency == round(30 / 40, 4)


def test_progress_regex_lines_judge_loss_and_steps():
    run = ScriptRun(log_progress=True, losses=lambda step: 1.0 / step)
    run.start_workers()
    run.train(20)
    run.kill_worker("node1")
    run.start_workers(resumed_from=10)
    run.losses = lambda step: 5.0  # a resume that lost its optimizer state: the loss jumps
    run.train(30)
    run.finish()
    verdict = run.verdict()
    results = _by_name(verdict)
    assert results["progress"].metrics.step_source == "script"
    assert verdict.recoveries[0].steps_lost == 10
    assert results["loss_continuity"].measured and not results["loss_continuity"].valid
    assert "loss jumped" in results["loss_continuity"].reasons[0]


def test_collectives_only_script_is_timed_by_collective_calls():
    run = ScriptRun(optimizer=False)
    run.start_workers()
    run.train(20)
    run.kill_worker("node1")
    run.start_workers()
    run.train(10)
    run.finish()
    verdict = run.verdict()
    assert verdict.valid
    (recovery,) = verdict.recoveries
    # The first collective of the new group (its broadcast) marks the recovery: 7 s after the ok.
    assert recovery.recovery_s == 7.0
    assert not _by_name(verdict)["progress"].measured


def test_nothing_seen_is_not_measurable_and_the_verdict_cannot_tell():
    """--no-instrument and no progress regex: nothing could see training, so the verdict is CANNOT TELL (never a
    PASS, and no check fails for it)."""
    run = ScriptRun()
    run.start_workers()
    run.records = [r for r in run.records if r["type"] != "worker"]  # --no-instrument, no regex
    run.wait(20)
    run.kill_worker("node1")
    run.start_workers()
    run.records = [r for r in run.records if r["type"] != "worker"]
    run.wait(10)
    run.finish()
    run.records = [r for r in run.records if r["type"] != "worker"]
    verdict = run.verdict(instrumented=False)
    results = _by_name(verdict)
    assert not verdict.valid and verdict.undetermined and verdict.word == "CANNOT TELL"
    assert not results["trained"].measured and results["trained"].reasons[0].startswith("cannot tell")
    assert all(r.valid for r in verdict.results if r.name != "trained")
    for name in ("progress", "loss_continuity", "hang", "recovery"):
        assert not results[name].measured, name
        assert results[name].reasons[0].startswith("not measurable here:"), name
    assert results["completed"].measured and results["completed"].valid
    summary = format_summary(verdict, RunModel(run.records), title="t", profile=None)
    assert "n/a" in summary and "not measurable: progress" in summary
    # Lanes come from the agents' events: running from "Starting worker group" to the failure.
    lanes = build_timeline(RunModel(run.records), verdict).lanes
    assert lanes["node0"]["running"] and lanes["node0"]["restarting"]


def test_a_job_that_never_finishes_says_so_without_trainer_words():
    run = ScriptRun()
    run.start_workers()
    run.train(10)
    run.add(type="run", event="end")
    completed = _by_name(run.verdict())["completed"]
    assert not completed.valid
    assert "no agent reported its worker group finished" in completed.reasons[0]


def test_a_zombie_of_an_old_round_is_not_a_step_backwards():
    """freeze-long: node1 frozen; node0 and node2 regroup at world 2; node1's old worker, woken,
    prints step 27 while the new group is at 59. It is a zombie of round 1, not a regression."""
    run = HistoryBuilder(nodes=3, nproc=1, steps=80, ckpt=10)
    run.start_workers()
    run.train(27)
    stale = run.workers[1]  # node1's worker, about to freeze
    run.fault("pause", "node1")
    run.wait(5)
    run.group_failure(nodes=["node0", "node2"])
    run.start_workers(resumed_from=20, nodes=["node0", "node2"])
    run.train(59)
    run.fault("unpause", "node1")
    node, local, rank, world = stale
    run.trainer(node, local, rank, world, "progress", step=27, epoch=0, loss=0.5)  # the zombie's line
    run.train(80)
    run.finish()
    verdict = run.verdict()
    results = {r.name: r for r in verdict.results}
    assert results["progress"].valid, results["progress"].reasons
    assert results["progress"].metrics.zombie_records == 1
    model = RunModel(run.records)
    assert [(z.node, z.step) for z in model.zombies] == [("node1", 27)]
    lanes = build_timeline(RunModel(run.records), verdict).lanes
    assert lanes["node1"]["zombie"]


def test_training_started_from_the_agents_own_event_or_any_worker_record():
    assert (
        _training_started(parse_record({"t": 1.0, "type": "agent", "event": "group_started", "node": "node1"}))
        == "node1 started its worker group"
    )
    assert _training_started(parse_record({"t": 1.0, "type": "worker", "event": "start", "node": "node0"}))
    assert _training_started(parse_record({"t": 1.0, "type": "trainer", "kind": "progress", "node": "node0"}))
    assert _training_started(parse_record({"t": 1.0, "type": "agent", "event": "rdzv_joined", "node": "node0"})) is None
    assert _training_started(parse_record({"t": 1.0, "type": "docker", "action": "start", "node": "node0"})) is None
