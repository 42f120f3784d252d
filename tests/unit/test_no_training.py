"""No PASS without training, and a job that cannot finish: the checker, the diagnosis and the verdict's words,
on hand-written histories (tests/unit/histories.py) and on a captured run (tests/data/runs/)."""

from __future__ import annotations

from pathlib import Path

from sim.core.history import History
from sim.verdict.checkers import RunSpec, cannot_finish, check_all, check_trained
from sim.verdict.diagnoses.registry import diagnose
from sim.verdict.report import format_summary
from sim.verdict.runfolder import judge
from sim.verdict.runmodel import RunModel
from tests.unit.histories import ScriptRun

RUNS = Path(__file__).resolve().parent.parent / "data" / "runs"
GATE_LINE = "Unable to locate sufficient 2 gpus to run this example. Exiting."


def _no_data_run(code=0) -> ScriptRun:
    run = ScriptRun()
    run.exit_before_training(code)
    return run


def _logs(line: str) -> dict[str, str]:
    """Each node's log as `docker logs --timestamps` gives it: torch's lines around the script's one line."""
    return {
        node: (
            f"2023-11-14T22:13:20.5Z I1114 22:13:20.500000 7 torch/distributed/run.py:747] Using nproc_per_node=1.\n"
            f"2023-11-14T22:13:21.0Z elastic-sim: project copied from /opt/sim/user to /opt/sim/project\n"
            f"2023-11-14T22:13:23.1Z {line}\n"
            f"2023-11-14T22:13:24.0Z I1114 22:13:24.000000 7 torch/distributed/elastic/agent/server/api.py:932] "
            "[default] worker group successfully finished. Waiting 300 seconds for other agents to finish.\n"
        )
        for node in ("node0", "node1")
    } | {"etcd": "2023-11-14T22:13:25.0Z 2023-11-14 22:13:25.000000 W | etcdserver: request took too long\n"}


def test_a_job_that_exits_0_before_training_fails_and_says_so():
    run = _no_data_run()
    verdict = run.verdict()
    trained = verdict.result("trained")
    assert not verdict.valid and not verdict.undetermined and verdict.word == "FAIL"
    assert verdict.results[0] is trained and trained.measured and not trained.valid
    assert trained.reasons[0] == (
        "the job ended without training: no optimizer step and no collective call after the process group's "
        "set-up in any worker; every rank exited 0"
    )
    # Everything else the old verdict judged on passes: the job "completed", exit 0 everywhere.
    assert all(r.valid for r in verdict.results if r.name != "trained")


def test_no_training_fails_every_expected_outcome_and_any_named_checkers():
    run = _no_data_run(code=1)
    for expected in ("recovers", "fails", "hangs"):
        assert "trained" in [r.name for r in run.verdict(expected=expected).results if not r.valid], expected
    verdict = check_all(run.model(), run.spec(), only=["completed"])
    assert [r.name for r in verdict.results] == ["trained", "completed", "restart_budget"] and not verdict.valid
    assert verdict.result("trained").reasons[0].endswith("every rank exited 1")


def test_a_live_run_is_not_failed_for_not_having_trained_yet():
    run = ScriptRun()
    run.start_workers(collective=False)
    verdict, _ = judge(run.model(), {}, live=True)
    assert verdict.result("trained") is None and verdict.valid


def test_a_collective_after_set_up_is_training_for_a_script_with_no_optimizer():
    run = ScriptRun(optimizer=False)
    run.start_workers()
    run.train(5)
    run.finish()
    trained = check_trained(run.model(), run.spec())
    assert trained.valid and "collective calls" in trained.reasons[0]


def test_nothing_could_see_training_cannot_tell():
    run = _no_data_run()
    run.records = [r for r in run.records if r["type"] != "worker"]
    verdict = run.verdict(instrumented=False)
    assert verdict.word == "CANNOT TELL" and not verdict.valid
    summary = format_summary(verdict, RunModel(run.records), title="t", profile=None)
    assert summary.startswith("t: CANNOT TELL (expected: the job recovers)\n  cannot tell whether the job trained")


def test_a_progress_regex_that_never_matched_is_a_fail_not_a_cannot_tell():
    run = _no_data_run()
    run.records = [r for r in run.records if r["type"] != "worker"]
    run.records[0]["spec"] = {**run.records[0]["spec"], "instrument": False, "progress_regex": r"step (?P<step>\d+)"}
    verdict = run.verdict()
    assert verdict.word == "FAIL" and verdict.result("trained").measured


def test_the_diagnosis_quotes_the_scripts_last_line_and_its_exit_codes():
    run = _no_data_run()
    (found,) = [d for d in diagnose(run.model(), _logs("no data at /data/train.bin, exiting")) if d.code]
    assert found.code == "ended-without-training"
    assert (
        found.title == "The job ended without training: every rank exited 0 after 'no data at /data/train.bin, exiting'"
    )
    assert found.cause.startswith(
        "The job ended without training: every rank exited 0 after 'no data at /data/train.bin, exiting'"
    )
    assert found.evidence[0].endswith("  no data at /data/train.bin, exiting")
    assert any("worker rank 1 exited 0" in e for e in found.evidence)
    assert "--mount" in found.fix and "gpu" not in found.fix.lower()
    # Without the logs (the cluster still up): the exits still say it.
    (bare,) = diagnose(run.model(), {})
    assert bare.cause.startswith("The job ended without training: every rank exited 0.")


def test_a_script_error_is_named_by_script_error_not_as_ended_without_training():
    run = ScriptRun()
    for _ in range(2):
        run.start_workers(collective=False)
        for worker in run.workers:
            run.add(
                type="agent",
                node=worker["node"],
                event="worker_exception",
                name="KeyError",
                message="'batch_size'",
                frame="/opt/sim/user/train.py:18 in main",
            )
            run.add(type="agent", node=worker["node"], event="worker_failed", exitcode=1, local_rank=0, pid=1)
        run.group_failure()
    for node in run.nodes:
        run.die(node, 1)
    codes = [d.code for d in diagnose(run.model(), {})]
    assert codes[0] == "script-error" and "ended-without-training" not in codes


def test_the_captured_accelerator_gate_run_fails_with_the_gate_quoted():
    """tests/data/runs/ended_without_training: `sim up --script accelerator_gate.py` (2 nodes x 1, torch defaults,
    devices emulated before torch.accelerator was): every rank exited 0 after its gate's line."""
    folder = RUNS / "ended_without_training"
    run = RunModel(History(folder / "history.jsonl").read().records)
    verdict, found = judge(run, {p.stem: p.read_text() for p in sorted(folder.glob("node*.log"))})
    assert verdict.word == "FAIL" and verdict.result("trained").reasons[0].startswith("the job ended without training")
    assert found[0].code == "ended-without-training"
    assert found[0].cause.startswith(f"The job ended without training: every rank exited 0 after '{GATE_LINE}'")
    assert "--nproc-per-node (1 here)" in found[0].fix
    summary = format_summary(verdict, run, title="t", profile=None, diagnoses=found)
    assert summary.startswith("t: FAIL (expected: the job recovers)\n  the job ended without training")


# ---------------------------------------------------------------- a job that cannot finish


def _gave_up_run(pg_ready=False) -> tuple[ScriptRun, float]:
    """node0's worker fails at every start and its agent gives up (exit 1); node1's restarted worker waits,
    (pg_ready) in a collective or (not) in init_process_group, for a peer that is gone."""
    run = ScriptRun()

    def key_error():
        run.add(
            type="agent",
            node="node0",
            event="worker_exception",
            name="KeyError",
            message="'node0'",
            frame="/opt/sim/user/train.py:24 in main",
            source="settings = NODE_SETTINGS[socket.gethostname()]",
        )
        run.add(type="agent", node="node0", event="worker_failed", exitcode=1, local_rank=0, pid=1)

    run.start_workers(collective=False)
    run.wait(3)
    key_error()
    run.wait(1)
    run.group_failure()
    run.start_workers(collective=False)
    if pg_ready:
        run.add(type="worker", event="pg_ready", seconds=0.1, **run.workers[1])
    run.wait(3)
    key_error()
    run.add(type="agent", node="node0", event="group_failed", attempts_left=0, max_restarts=1)
    run.wait(1)
    run.die("node0", 1)
    return run, run.t


def test_an_agent_that_gave_up_and_a_peer_waiting_in_init_cannot_finish():
    run, gave_up = _gave_up_run()
    assert cannot_finish(run.model(), gave_up + 30, hang_s=60) is None  # within the hang window
    stuck = cannot_finish(run.model(), gave_up + 61, hang_s=60)
    assert stuck is not None and stuck.gave_up == (("node0", gave_up, 1),)
    assert stuck.waiting == (
        "node1's worker waits in init_process_group for a peer that is gone; torch's default process-group "
        "timeout would let it wait 30 min (unless the script gave one)",
    )
    assert stuck.words()[0].startswith("the job cannot finish: node0's agent gave up at ")
    in_collective, t = _gave_up_run(pg_ready=True)
    assert "waits in a collective" in cannot_finish(in_collective.model(), t + 61).waiting[0]


def test_a_waiting_workers_start_stamped_before_its_agents_group_started_line_is_its_group_s():
    """An agent line is stamped when Docker reads it, a worker's start by the worker: node1's restarted worker
    can be stamped before its agent's group_started (the team-image flake: 21 ms). It still waits in init."""
    run, gave_up = _gave_up_run()
    started = [r for r in run.records if r.get("node") == "node1" and r.get("event") == "group_started"][-1]
    start = [r for r in run.records if r.get("node") == "node1" and r.get("event") == "start"][-1]
    start["t"] = started["t"] - 0.02
    run.records.append({"t": started["t"] - 1.0, "type": "agent", "node": "node1", "event": "rdzv_joining"})
    stuck = cannot_finish(run.model(), gave_up + 61, hang_s=60)
    assert stuck is not None and stuck.waiting[0].startswith("node1's worker waits in init_process_group for a peer")


def test_no_verdict_while_a_fault_holds_or_the_rest_regroup_or_all_ended():
    run, gave_up = _gave_up_run()
    paused = ScriptRun()
    paused.records = list(run.records)
    paused.t = run.t
    paused.fault("pause", "node1", node="node1", id="pause-node1")
    assert cannot_finish(paused.model(), paused.t + 120) is None  # frozen by a fault: its silence is the fault's
    regrouped, t = _gave_up_run()
    regrouped.wait(30)
    regrouped.start_workers(nodes=["node1"])  # node1 regrouped alone and trains: not stuck
    assert cannot_finish(regrouped.model(), t + 61) is None
    done, t = _gave_up_run()
    done.add(type="agent", node="node1", event="group_finished")  # node1 finished: it waits in torch's exit barrier
    assert cannot_finish(done.model(), t + 120) is None
    run.die("node1", 1)
    assert cannot_finish(run.model(), gave_up + 120) is None  # every node exited: the job ended


def test_the_summary_of_a_job_that_cannot_finish_names_its_first_cause_first():
    run, gave_up = _gave_up_run()
    model = run.model()
    stuck = cannot_finish(model, gave_up + 61)
    verdict = check_all(model, RunSpec.from_run(model))
    diagnosis = diagnose(model, {})
    summary = format_summary(verdict, model, title="t", profile=None, diagnoses=diagnosis, stuck=stuck)
    lines = summary.splitlines()
    assert lines[0] == "t: FAIL (expected: the job recovers)"
    assert lines[1] == "  first cause: The script fails at every start: KeyError: 'node0'"
    assert lines[2].endswith(
        "KeyError: 'node0' at /opt/sim/user/train.py:24 in main: `settings = NODE_SETTINGS[socket.gethostname()]`"
    )
    assert any(line.startswith("  the job cannot finish: node0's agent gave up") for line in lines[3:5])
    assert "  node1's worker waits in init_process_group" in summary


# ---------------------------------------------------------------- the runner's and the vet's words


def test_a_step_that_never_fired_says_what_the_job_was_doing_in_words(tmp_path):
    from sim.scenarios.runner import HistoryState, not_fired_words
    from sim.scenarios.scenario import Step, Trigger

    history = History(tmp_path / "history.jsonl")
    state = HistoryState(history.path)
    step = Step("kill-node", {"target": "node2"}, Trigger("recovered", 3), line=12)
    state.update()
    never = not_fired_words(step, step.trigger, state, 100.0, "the job ended (every node exited) first")
    assert never == (
        "kill-node node2 (line 12) never struck: waiting for training steady at world size 3 (5 steps in a row on "
        "every rank), the job ended (every node exited) first; the job never trained (no optimizer step, collective "
        "or step line was seen)"
    )
    history.append({"t": 40.0, "type": "worker", "node": "node0", "event": "step", "n": 7, "rank": 0, "world_size": 2})
    state.update()
    end = not_fired_words(None, Trigger("recovered", 3), state, 100.0, "it did not come in 90 s, the time allowed")
    assert end.startswith("the job was not steady again after the last fault: waiting for training steady at world")
    assert end.endswith("the job last trained 60 s before at world size 2")
    assert "trigger" not in never + end and "recovered=" not in never + end


def test_the_scorecard_says_a_miss_in_full_and_gives_no_recovery_figure_to_a_fault_that_did_not_recover():
    from sim.vet.gauntlet import FaultScore, VetResult, scorecard

    why = (
        "kill-node node2 never struck: waiting for training steady at world size 3 (5 steps in a row on every rank), "
        "it did not come in 90 s, the time allowed for one fault; the job last trained 60 s before at world size 2"
    )
    hung = FaultScore("hang-collectives", "a hung collective", "failed", "s", "the job was not steady again after it")
    miss = FaultScore("kill-node", "a node lost", "not reached", "s", why)
    text = scorecard(VetResult("t.py", "etcd-v2", 3, 1, (hung, miss), (), 1.0, why))
    lines = text.splitlines()
    assert max(map(len, lines)) <= 118
    hung_row = next(line for line in lines if line.startswith("FAIL a hung collective"))
    assert hung_row.split()[4] == "-"  # no recovery figure
    assert " ".join(" ".join(lines).split()).count("the job last trained 60 s before at world size 2") == 2


def test_a_vet_whose_job_never_trained_stops_with_one_line(tmp_path):
    import json

    import pytest

    from sim.core.errors import JobNeverTrainedError
    from sim.vet.gauntlet import require_training

    run = _no_data_run()
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.records))
    (tmp_path / "logs").mkdir()
    for node, text in _logs("no data at /data/train.bin, exiting").items():
        (tmp_path / "logs" / f"{node}.log").write_text(text)
    with pytest.raises(JobNeverTrainedError) as error:
        require_training(tmp_path)
    assert str(error.value).startswith(
        "the job never trained, so no fault was run: the job ended without training: every rank exited 0 after "
        "'no data at /data/train.bin, exiting'; `python -m sim report "
    )
    assert "\n" not in str(error.value)
