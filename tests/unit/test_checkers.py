"""Checkers on hand-written histories: for each checker a run that passes and one that must fail."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from sim.core.history import History
from sim.verdict import CheckpointIntegrityMetrics, FaultRecovery, SingleGroupMetrics
from sim.verdict.checkers import (
    RunSpec,
    check_all,
    check_checkpoint_integrity,
    check_completed,
    check_fails_cleanly,
    check_hang,
    check_loss_continuity,
    check_progress,
    check_ranks,
    check_recovery,
    check_restart_budget,
    check_single_group,
    check_stale_checkpoint,
    check_stalled,
    check_world_size,
)
from sim.verdict.diagnoses.registry import diagnose
from sim.verdict.runmodel import RunModel
from tests.unit.histories import T0, HistoryBuilder, ScriptRun, smooth_loss


def clean_run(steps=30):
    run = HistoryBuilder(steps=steps)
    run.start_workers()
    run.train(steps)
    run.finish()
    return run


def worker_kill_run():
    """node1's worker (rank 2) killed after step 24; the job resumes from checkpoint 20."""
    run = HistoryBuilder(steps=30, ckpt=10)
    run.start_workers()
    run.train(24)
    run.wait(0.25)
    run.fault("kill-worker", "node1", take_s=0.5, node="node1", rank=2, local_rank=0, pid=123, signal="SIGKILL")
    run.add(type="agent", node="node1", event="worker_failed", local_rank=0, exitcode=-9, pid=123)
    run.group_failure()
    run.wait(4.0)
    run.start_workers(resumed_from=20)
    run.train(30)
    run.finish()
    return run


def docker(node, action, **fields):
    return {"type": "docker", "node": node, "action": action, **fields}


def without(records, predicate):
    return [r for r in records if not predicate(r)]


def is_progress(record, rank=None, steps=None):
    return (
        record.get("type") == "trainer"
        and record.get("kind") == "progress"
        and (rank is None or record["rank"] == rank)
        and (steps is None or record["step"] in steps)
    )


def assert_reason(result, *fragments):
    text = " | ".join(result.reasons)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in reasons: {text}"


# ---------------------------------------------------------------- RunSpec


def test_spec_from_history_reads_the_run_start_record():
    spec = clean_run().spec()
    assert (spec.min_nodes, spec.max_nodes, spec.nproc_per_node, spec.max_restarts) == (1, 2, 2, 3)
    assert (spec.target_steps, spec.ckpt_interval, spec.expected) == (30, 10, "recovers")
    assert (spec.min_world, spec.max_world) == (2, 4)


def test_spec_overrides_win_and_bounds_are_validated():
    history = clean_run().records
    assert RunSpec.from_run(RunModel(history), max_recovery_s=30.0, expected="fails").max_recovery_s == 30.0
    for bad, named in [
        ({"hang_s": 0}, "hang_s 0"),
        ({"expected": "maybe"}, "expected 'maybe'"),
        ({"min_nodes": 3}, "max_nodes 2 < min_nodes 3"),
        ({"max_restarts": -1}, "max_restarts -1"),
        ({"loss_jump_tolerance": float("nan")}, "loss_jump_tolerance nan"),
        ({"ckpt_interval": 0}, "ckpt_interval 0"),
    ]:
        with pytest.raises(ValueError, match=named):
            RunSpec.from_run(RunModel(history), **bad)


def test_spec_without_a_run_start_record_needs_overrides():
    with pytest.raises(ValueError, match="min_nodes, max_nodes, nproc_per_node, max_restarts"):
        RunSpec.from_run(RunModel([]))
    spec = RunSpec.from_run(RunModel([]), min_nodes=1, max_nodes=2, nproc_per_node=1, max_restarts=0)
    assert spec.max_world == 2


def test_max_nodes_left_unset_in_the_cluster_spec_means_nodes():
    run = HistoryBuilder(nodes=3, max_nodes=None)
    assert run.spec().max_nodes == 3


# ---------------------------------------------------------------- all together


def test_clean_run_passes_every_check():
    run = clean_run()
    verdict = run.verdict()
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    assert [r.name for r in verdict.results] == [
        "trained",
        "completed",
        "restart_budget",
        "world_size",
        "ranks",
        "progress",
        "loss_continuity",
        "checkpoint_integrity",
        "stale_checkpoint",
        "single_group",
        "hang",
        "recovery",
    ]
    assert verdict.restarts_per_node == {"node0": 0, "node1": 0}
    assert verdict.rounds == 1
    assert verdict.recoveries == ()


def test_worker_kill_recovers_with_exact_figures():
    run = worker_kill_run()
    verdict = run.verdict()
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    (recovery,) = verdict.recoveries
    t_ok = T0 + 2.5 + 24 + 0.25 + 0.5
    # ok, then 4 s until the new rendezvous, 2.5 s until the workers start, 1 s to the first step.
    assert recovery == FaultRecovery(
        op=recovery.op,
        fault="kill-worker",
        target="node1",
        t_fault=t_ok,
        t_recovered=t_ok + 7.5,
        recovery_s=7.5,
        steps_lost=4,
        world_before=4,
        world_after=4,
        throughput_before=1.0,
        throughput_after=1.0,
    )
    assert verdict.restarts_per_node == {"node0": 1, "node1": 1}
    assert verdict.rounds == 2


def test_records_in_any_order_give_the_same_verdict():
    run = worker_kill_run()
    shuffled = list(run.records)
    random.Random(7).shuffle(shuffled)
    assert check_all(RunModel(shuffled), run.spec()) == run.verdict()


def test_a_failing_run_is_judged_by_the_fails_checks():
    run = HistoryBuilder(max_restarts=0)
    run.start_workers()
    run.train(12)
    run.fault("kill-worker", "node1", node="node1", rank=2)
    run.wait(1.0)
    run.die("node1", 1)
    run.wait(2.0)
    run.die("node0", 1)
    run.end()
    verdict = check_all(RunModel(run.records), run.spec(expected="fails"))
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    assert [r.name for r in verdict.results] == ["trained", "fails_cleanly", "restart_budget", "world_size", "ranks"]


# ---------------------------------------------------------------- completed


def test_completed_passes_and_excuses_a_node_scaled_away():
    run = HistoryBuilder(nodes=3, steps=30)
    run.start_workers()
    run.train(15)
    run.fault(
        "scale",
        "nodes=2",
        take_s=3.0,
        joined=[],
        left=["node2"],
        abrupt=False,
        effects=[docker("node2", "kill", signal="15"), docker("node2", "die", exit_code=143)],
    )
    run.group_failure(["node0", "node1"])
    run.wait(3.0)
    run.start_workers(resumed_from=10, nodes=["node0", "node1"])
    run.train(30)
    run.finish(nodes=["node0", "node1"])
    result = check_completed(RunModel(run.records), run.spec())
    assert result.valid, result.reasons
    assert_reason(result, "node2 excused: taken out by scale nodes=2")
    assert run.verdict().valid


def test_completed_fails_when_an_agent_has_no_exit_0():
    run = HistoryBuilder()
    run.start_workers()
    run.train(30)
    run.finish(nodes=["node0"], end=False)
    run.wait(20.0)
    teardown(run)  # node1's agent never exited: `down` killed it
    result = check_completed(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "node1: no agent exit recorded")

    records = [{**r, "exit_code": 1} if r.get("action") == "die" and r["node"] == "node0" else r for r in run.records]
    assert_reason(check_completed(RunModel(records), run.spec()), "node0's agent exited 1 at")


def test_completed_fails_when_the_job_stops_short():
    run = HistoryBuilder(steps=30)
    run.start_workers()
    run.train(17)
    run.wait(1.0)
    run.die("node0", 0)
    run.die("node1", 0)
    run.end()
    result = check_completed(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "never reached step 30: highest step 17")


# ---------------------------------------------------------------- restart_budget


def test_restart_budget_counts_per_agent():
    run = worker_kill_run()
    result = check_restart_budget(RunModel(run.records), run.spec())
    assert result.valid
    assert result.metrics.per_node == {"node0": 1, "node1": 1}
    assert_reason(result, "per agent, not per job: 2 in all across 2 nodes")


def test_restart_budget_fails_beyond_max_restarts():
    run = HistoryBuilder(max_restarts=5, steps=30)  # the agents ran with 5; the spec allows 3
    run.start_workers()
    for _ in range(4):
        run.train(run.step + 3)
        run.fault("kill-worker", "node1", node="node1")
        run.group_failure()
        run.wait(2.0)
        run.start_workers(resumed_from=run.step)
    run.train(30)
    run.finish()
    result = check_restart_budget(RunModel(run.records), run.spec(max_restarts=3))
    assert not result.valid
    assert_reason(result, "node0 used 4 restarts > max 3", "node1 used 4 restarts > max 3")


# ---------------------------------------------------------------- world_size and ranks


def test_world_size_fails_outside_the_allowed_range():
    run = HistoryBuilder(nodes=3, max_nodes=2)
    run.start_workers()
    run.train(5)
    assert check_world_size(RunModel(clean_run().records), clean_run().spec()).valid
    result = check_world_size(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "reported world size 6 at", "outside [2, 4] (1..2 nodes x 2 workers)")


def test_ranks_pass_for_each_cohort_and_fail_on_duplicates():
    good = worker_kill_run()
    result = check_ranks(RunModel(good.records), good.spec())
    assert result.valid and result.metrics.cohorts == 2

    # A trainer that takes LOCAL_RANK for its rank: ranks 0, 1, 0, 1 in a world of 4.
    records = [{**r, "rank": r["local_rank"]} if r.get("kind") == "start" else r for r in good.records]
    result = check_ranks(RunModel(records), good.spec())
    assert not result.valid
    assert_reason(result, "rank 0 started 2 times", "ranks 2, 3 never started")


def test_a_slow_agents_rendezvous_lines_after_a_faster_nodes_worker_start_keep_one_cohort():
    """Seen in CI: node1's agent logged "Rendezvous complete" 4 ms after node0's worker started and
    before its own worker did. One round, one cohort: a rendezvous line splits only when it comes
    from a node already started in the cohort after its agent spawned that round (or names a higher round)."""
    run = HistoryBuilder(nodes=3, nproc=1)
    run.start_workers()
    starts = [r for r in run.records if r.get("kind") == "start"]
    for i, start in enumerate(starts):
        start["t"] += 0.02 * i  # node0 first, then node1, node2
    late = next(r for r in run.records if r.get("event") == "rdzv_complete" and r["node"] == "node1")
    late["t"] = starts[0]["t"] + 0.004
    run.records.sort(key=lambda r: r["t"])
    run.train(12)
    run.fault("kill-worker", "node1", node="node1")
    run.wait(1.0)
    run.start_workers(resumed_from=10)
    run.train(30)
    run.finish()
    model = RunModel(run.records)
    assert [sorted(c.nodes) for c in model.cohorts] == [["node0", "node1", "node2"]] * 2
    assert not model.zombies
    assert check_ranks(model, run.spec()).valid


def test_a_nodes_own_rendezvous_line_stamped_after_its_worker_start_keeps_one_cohort():
    """The team-image flake (tests/data/runs/agent_line_stamped_late): Docker stamps an agent's lines when it
    reads them, the worker stamps its own start; node0's "Rendezvous complete" (printed 12:24:45.942) was
    stamped 45.9945, 21 ms after its worker's start. The old model took it for a new round of node0: round 0
    split into {node0} and {node1}, node0's whole round 0 judged a zombie, `ranks` FAIL ("rank 1 never
    started") and `stale_checkpoint` FAIL (its saves "of a superseded round")."""
    run = captured("agent_line_stamped_late")
    assert [sorted(c.nodes) for c in run.cohorts] == [["node0", "node1"]] * 2
    assert not run.zombies
    spec = RunSpec.from_run(run)
    assert check_ranks(run, spec).valid
    assert check_stale_checkpoint(run, spec).valid
    assert check_all(run, spec).valid


def _agent(t, node, event, **fields):
    return {"t": t, "type": "agent", "node": node, "event": event, **fields}


def _worker_start(t, node, rank, restart=0):
    return {"t": t, "type": "worker", "node": node, "event": "start", "rank": rank, "local_rank": 0,
            "world_size": 2, "restart": restart, "pid": 10 + restart}  # fmt: skip


@pytest.mark.parametrize("agent_lag_s", [0.0, 0.05])
@pytest.mark.parametrize("ended_by", ["agent", "restart"])
def test_a_started_nodes_next_round_still_splits_the_cohort_however_late_its_agent_lines(agent_lag_s, ended_by):
    """node0's worker of round 0 died before any step (its agent saw it fail; or its container restarted);
    node0's agent regrouped (round numbers unknown, as some backends log none) and node1's first worker started
    in the new round: two cohorts, whether node0's own round-0 lines were stamped before or (read late) after
    its worker's start."""
    t, lag = T0, agent_lag_s
    if ended_by == "agent":
        ended = [
            _agent(t + 1.0, "node0", "worker_failed", exitcode=-9, local_rank=0, pid=10),
            _agent(t + 1.0, "node0", "group_failed", attempts_left=2, max_restarts=3),
        ]
    else:
        ended = [
            {"t": t + 0.5, "type": "docker", "action": "die", "node": "node0", "exit_code": 137},
            {"t": t + 0.9, "type": "docker", "action": "start", "node": "node0"},
        ]
    records = [
        {"t": t - 1, "type": "run", "event": "start", "cluster": "c", "spec": {"nodes": 2, "nproc_per_node": 1}},
        _agent(t - 0.5, "node0", "rdzv_joined", group_rank=0, nodes=2),
        _agent(t - 0.1 + lag, "node0", "rdzv_complete", group_rank=0, restart_count=0),
        _agent(t - 0.1 + lag + 0.001, "node0", "group_started"),
        _worker_start(t, "node0", 0),
        *ended,
        _agent(t + 1.1, "node0", "rdzv_joining"),
        _agent(t + 2.0, "node0", "rdzv_joined", group_rank=0, nodes=2),
        _agent(t + 2.0, "node1", "rdzv_joined", group_rank=1, nodes=2),
        _agent(t + 2.1, "node0", "rdzv_complete", group_rank=0, restart_count=1),
        _agent(t + 2.1, "node1", "rdzv_complete", group_rank=1, restart_count=0),
        _worker_start(t + 2.2, "node1", 1),
        _worker_start(t + 2.3, "node0", 0, restart=1),
    ]
    model = RunModel(records)
    assert [sorted(c.nodes) for c in model.cohorts] == [["node0"], ["node0", "node1"]]


def test_a_round_number_read_late_from_a_started_nodes_agent_is_that_nodes_own_round():
    """Round 1: node0's worker started first; node1's join of round 1, then node0's own (its agent's line read
    late), came before node1's worker start. Neither is a newer round than node0's: one cohort per round."""
    t = T0
    records = [
        {"t": t - 1, "type": "run", "event": "start", "cluster": "c", "spec": {"nodes": 2, "nproc_per_node": 1}},
        _agent(t - 0.5, "node0", "rdzv_joined", round=0, group_rank=0, nodes=2),
        _agent(t - 0.5, "node1", "rdzv_joined", round=0, group_rank=1, nodes=2),
        _worker_start(t, "node0", 0),
        _worker_start(t, "node1", 1),
        {"t": t + 2, "type": "worker", "node": "node0", "event": "step", "rank": 0, "world_size": 2, "n": 1},
        _agent(t + 3, "node0", "new_nodes", count=1),
        _worker_start(t + 5.0, "node0", 0, restart=1),
        _agent(t + 5.01, "node1", "rdzv_joined", round=1, group_rank=1, nodes=2),
        _agent(t + 5.02, "node0", "rdzv_joined", round=1, group_rank=0, nodes=2),
        _agent(t + 5.03, "node0", "rdzv_complete", group_rank=0, restart_count=1),
        _agent(t + 5.04, "node0", "group_started"),
        _worker_start(t + 5.1, "node1", 1, restart=1),
    ]
    model = RunModel(records)
    assert [sorted(c.nodes) for c in model.cohorts] == [["node0", "node1"]] * 2


def test_cohorts_split_on_progress_even_without_agent_logs():
    run = HistoryBuilder()
    run.start_workers(agent_logs=False)
    run.train(12)
    run.fault("kill-worker", "node1", node="node1")
    run.wait(1.0)
    run.start_workers(resumed_from=10, agent_logs=False)  # same world size, 4 s later
    run.train(30)
    run.finish()
    result = check_ranks(RunModel(run.records), run.spec())
    assert result.valid and result.metrics.cohorts == 2
    assert run.verdict().rounds == 2


# ---------------------------------------------------------------- progress


def test_progress_passes_after_a_resume_within_the_checkpoint_interval():
    run = worker_kill_run()
    result = check_progress(RunModel(run.records), run.spec())
    assert result.valid, result.reasons
    assert list(result.metrics.steps_lost.values()) == [4]


def test_progress_fails_on_a_skipped_step():
    run = clean_run()
    records = without(run.records, lambda r: is_progress(r, rank=3, steps=(12, 13, 14)))
    result = check_progress(RunModel(records), run.spec())
    assert not result.valid
    assert_reason(result, "rank 3 skipped steps 12..14 at 22:13:")


def test_progress_fails_when_a_restart_skips_ahead_of_its_checkpoint():
    run = worker_kill_run()
    records = without(run.records, lambda r: is_progress(r, rank=1, steps=(21,)) and r["t"] > T0 + 30)
    assert_reason(check_progress(RunModel(records), run.spec()), "rank 1 skipped step 21 after the restart at")


def test_progress_fails_when_more_steps_are_lost_than_the_checkpoint_interval():
    run = HistoryBuilder(steps=30, ckpt=10)
    run.start_workers()
    run.train(24)
    run.fault("kill-worker", "node1", node="node1")
    run.group_failure()
    run.wait(3.0)
    run.start_workers(resumed_from=10)  # checkpoint 20 unusable: falls back to 10
    run.train(30)
    run.finish()
    result = check_progress(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "14 steps lost (reached 24, resumed from 10) > checkpoint interval 10")
    assert_reason(
        check_progress(RunModel(worker_kill_run().records), worker_kill_run().spec(max_steps_lost=3)),
        "4 steps lost (reached 24, resumed from 20) > max 3",
    )


def test_progress_fails_when_ranks_resume_from_different_steps():
    run = worker_kill_run()
    restart_t = max(r["t"] for r in run.records if r.get("kind") == "start")
    records = [
        {**r, "resumed_from": 10} if r.get("kind") == "start" and r["t"] == restart_t and r["rank"] == 3 else r
        for r in run.records
    ]
    assert_reason(
        check_progress(RunModel(records), run.spec()),
        "resumed from different steps: rank 3 from step 10; ranks 0, 1, 2 from step 20",
    )


def test_a_partition_healed_before_anything_failed_loses_no_steps():
    run = HistoryBuilder()
    run.start_workers()
    run.train(12)
    run.fault("partition", "node0 | node1", op="p1", id="partition-abc", partition="node0 | node1")
    run.wait(5.0)
    run.fault("heal", "all", healed=["partition-abc"])
    run.train(30)
    run.finish()
    verdict = run.verdict()
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    (recovery,) = verdict.recoveries
    assert recovery.steps_lost == 0 and recovery.world_after == 4


def test_a_restart_belongs_to_the_fault_after_which_training_stopped():
    run = HistoryBuilder()
    run.start_workers()
    run.train(12)
    run.fault("partition", "node0 | node1", id="partition-abc")
    run.wait(5.0)
    run.fault("heal", "all", healed=["partition-abc"])
    run.train(24)
    run.fault("kill-worker", "node1", node="node1")
    run.group_failure()
    run.wait(3.0)
    run.start_workers(resumed_from=20)
    run.train(30)
    run.finish()
    verdict = run.verdict()
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    assert [(r.fault, r.steps_lost) for r in verdict.recoveries] == [("partition", 0), ("kill-worker", 4)]


# ---------------------------------------------------------------- loss_continuity


def test_loss_carries_on_after_a_resume():
    run = worker_kill_run()
    result = check_loss_continuity(RunModel(run.records), run.spec())
    assert result.valid and len(result.metrics.relative_jumps) == 1


def test_loss_jump_after_a_resume_fails():
    run = HistoryBuilder(steps=30, ckpt=10)
    run.start_workers()
    run.train(24)
    run.fault("kill-worker", "node1", node="node1")
    run.group_failure()
    run.wait(3.0)
    run.start_workers(resumed_from=20)
    run.train(30, loss=lambda step: smooth_loss(step - 20))  # the optimizer state was lost: back to the start
    run.finish()
    result = check_loss_continuity(RunModel(run.records), run.spec())
    assert not result.valid
    # Steps 21..23 ran before the fault too: the same steps are compared.
    assert_reason(
        result,
        "loss jumped",
        "after the resume from step 20",
        "over steps 21..23 before",
        "over steps 21..23 after (tolerance 50%)",
    )


def test_a_jump_after_one_replayed_step_fails():
    # Seen in CI (model-only checkpoint): the worker reached step 21, one step past the
    # checkpoint. Replayed, step 21's loss is the same (restored weights, no update yet); the
    # fresh optimizer's first update makes step 22 jump. One equal step is no evidence.
    run = HistoryBuilder(steps=30, ckpt=10)
    run.start_workers()
    run.train(21)
    run.fault("kill-worker", "node1", node="node1")
    run.group_failure()
    run.wait(3.0)
    run.start_workers(resumed_from=20)
    run.train(30, loss=lambda step: smooth_loss(step) if step == 21 else 2.0)
    run.finish()
    result = check_loss_continuity(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "loss jumped", "after the resume from step 20", "over steps 21..23 after")


def test_a_replayed_oscillation_is_no_jump():
    # Seen in a real run: the loss rose from 0.16 to 0.59 over steps 30..33 on its own; after a
    # resume from 30 the same steps replay the same losses. Only a different replay is a jump.
    wobbly = lambda step: 0.2 + 0.4 * (step % 6 >= 3)  # noqa: E731
    run = HistoryBuilder(steps=30, ckpt=10)
    run.start_workers()
    run.train(24, loss=wobbly)
    run.fault("kill-worker", "node1", node="node1")
    run.group_failure()
    run.wait(3.0)
    run.start_workers(resumed_from=20)
    run.train(30, loss=wobbly)
    run.finish()
    assert check_loss_continuity(RunModel(run.records), run.spec()).valid


# ---------------------------------------------------------------- hang


def test_a_90_s_gap_while_a_partition_is_in_force_is_no_hang():
    run = HistoryBuilder()
    run.start_workers()
    run.train(15)
    run.fault("partition", "node0 | node1", id="partition-1")
    run.wait(90.0)
    run.fault("heal", "partition-1", healed=["partition-1"])
    run.train(30)
    run.finish()
    assert check_hang(RunModel(run.records), run.spec()).valid


def test_a_90_s_gap_with_no_fault_in_force_is_a_hang():
    run = HistoryBuilder()
    run.start_workers()
    run.train(15)
    run.wait(90.0)
    run.train(30)
    run.finish()
    result = check_hang(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "no progress for 91.0 s", "with no fault in force (limit 60 s)")


def test_a_job_that_stalls_to_the_end_is_a_hang():
    run = HistoryBuilder()
    run.start_workers()
    run.train(15)
    run.wait(120.0)
    run.end()
    assert_reason(check_hang(RunModel(run.records), run.spec()), "no progress for 121.0 s")


# ---------------------------------------------------------------- recovery


def test_recovery_fails_for_a_fault_never_recovered():
    run = HistoryBuilder()
    run.start_workers()
    run.train(15)
    run.fault(
        "kill-node",
        "node1",
        node="node1",
        effects=[docker("node1", "kill", signal="9"), docker("node1", "die", exit_code=137)],
    )
    run.wait(200.0)
    run.end()
    result = check_recovery(RunModel(run.records), run.spec())
    assert not result.valid
    assert_reason(result, "kill-node node1 at", "never recovered")
    (recovery,) = result.metrics.recoveries
    assert recovery.t_recovered is None and recovery.world_before == 4


def test_recovery_fails_beyond_max_recovery_s():
    run = worker_kill_run()
    assert check_recovery(RunModel(run.records), run.spec(max_recovery_s=10)).valid
    result = check_recovery(RunModel(run.records), run.spec(max_recovery_s=5))
    assert not result.valid
    assert_reason(result, "kill-worker node1 at", "recovered in 7.5 s > max 5 s")


def test_recovery_at_a_smaller_world_after_a_node_is_lost():
    run = HistoryBuilder(nodes=3)
    run.start_workers()
    run.train(13)
    t_ok = run.fault(
        "kill-node",
        "node2",
        node="node2",
        effects=[docker("node2", "kill", signal="9"), docker("node2", "die", exit_code=137)],
    )
    run.group_failure(["node0", "node1"])
    run.wait(15.0)
    run.start_workers(resumed_from=10, nodes=["node0", "node1"])
    run.train(30)
    run.finish(nodes=["node0", "node1"])
    verdict = run.verdict()
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    (recovery,) = verdict.recoveries
    assert (recovery.world_before, recovery.world_after, recovery.steps_lost) == (6, 4, 3)
    assert recovery.recovery_s == pytest.approx(18.5)
    assert recovery.t_recovered - t_ok == pytest.approx(18.5)


# ---------------------------------------------------------------- fails_cleanly


def failing_run(hang_node=None):
    run = HistoryBuilder(max_restarts=0)
    run.start_workers()
    run.train(12)
    run.fault("kill-worker", "node1", node="node1", rank=2)
    run.wait(1.0)
    for node in run.nodes:
        if node != hang_node:
            run.die(node, 1)
    run.wait(300.0)
    teardown(run)
    return run


def last_docker_action(run, node):
    return [r["action"] for r in run.records if r.get("type") == "docker" and r["node"] == node][-1]


def teardown(run):
    """What `down` records: `rm -f` kills what still runs, then the run "end"."""
    for node in [n for n in run.nodes if last_docker_action(run, n) == "start"]:
        run.add(type="docker", node=node, action="kill", signal="9")
        run.die(node, 137)
    for node in run.nodes:
        run.add(type="docker", node=node, action="destroy")
    run.end()


def test_fails_cleanly_when_every_agent_exits_non_zero_fast():
    run = failing_run()
    result = check_fails_cleanly(RunModel(run.records), run.spec(expected="fails"))
    assert result.valid, result.reasons
    assert result.metrics.exits == {"node0": "exited 1", "node1": "exited 1"}


def test_agents_exiting_while_the_fault_is_still_being_injected_fail_fast():
    run = HistoryBuilder(max_restarts=0)
    run.start_workers()
    run.train(12)
    run.add(type="fault", op="w1", fault="wipe-etcd", target="etcd", phase="invoke", args={})
    run.die("etcd", 0)
    for action in ("create", "start", "die"):  # the throwaway container that clears etcd's volume
        run.add(type="docker", node="quirky_turing", action=action, **({"exit_code": 0} if action == "die" else {}))
    run.wait(1.5)
    run.die("node0", 1)
    run.die("node1", 1)
    run.wait(6.0)
    run.add(type="fault", op="w1", fault="wipe-etcd", target="etcd", phase="ok", result={"node": "etcd"})
    run.end()
    result = check_fails_cleanly(RunModel(run.records), run.spec(expected="fails", fail_fast_s=1.0))
    assert result.valid, result.reasons


def test_a_fails_run_that_hangs_instead_fails_the_check():
    run = failing_run(hang_node="node0")
    result = check_fails_cleanly(RunModel(run.records), run.spec(expected="fails"))
    assert not result.valid
    assert_reason(result, "node0 still running at the run end: the job hung instead of failing")


def test_a_fails_run_that_trains_on_through_the_fault_is_told_apart_from_a_hang():
    """A node still running at the end that kept stepping after the fault survived it: "hung" would be untrue."""
    run = HistoryBuilder(max_restarts=0, steps=100)
    run.start_workers()
    run.train(12)
    run.fault("restart-node", "etcd", node="etcd")
    run.train(60)  # every node trains on to the end
    teardown(run)
    result = check_fails_cleanly(RunModel(run.records), run.spec(expected="fails"))
    assert not result.valid
    assert result.metrics.trained_on == ("node0", "node1")
    assert_reason(result, "node0 still running at the run end, training on (step 13 to 5")
    assert not any("hung" in r for r in result.reasons), result.reasons


def test_a_node_that_trains_on_but_stops_long_before_the_end_is_a_hang():
    run = HistoryBuilder(max_restarts=0, steps=100)
    run.start_workers()
    run.train(12)
    run.fault("restart-node", "etcd", node="etcd")
    run.train(20)
    run.wait(120.0)  # then silence to the end
    teardown(run)
    result = check_fails_cleanly(RunModel(run.records), run.spec(expected="fails"))
    assert result.metrics.trained_on is None
    assert_reason(result, "node0 still running at the run end: the job hung instead of failing")


def test_captured_etcd_restart_on_a_swarm_trained_on_through_it():
    """A real `sim vet --engine swarm` solo run (2026-12-05): etcd restarted behind the service's virtual IP, the
    etcd-v2 agents' calls waited instead of failing, and all three nodes trained on to the run's end."""
    run = RunModel(History(RUNS / "etcd_restart_swarm_trained_on" / "history.jsonl").read().records)
    result = check_fails_cleanly(run, RunSpec.from_run(run, expected="fails"))
    assert not result.valid
    assert result.metrics.trained_on == ("node0", "node1", "node2")
    assert all("training on" in r and "survived the fault instead of ending" in r for r in result.reasons)


def test_a_fails_run_that_exits_slowly_or_completes_fails_the_check():
    run = HistoryBuilder(max_restarts=0)
    run.start_workers()
    run.train(12)
    run.fault("kill-worker", "node1", node="node1")
    run.wait(1.0)
    run.die("node1", 1)
    run.wait(90.0)
    run.die("node0", 1)
    run.end()
    assert_reason(
        check_fails_cleanly(RunModel(run.records), run.spec(expected="fails")),
        "node0 exited 91.0 s after kill-worker node1 at",
        "> fail_fast 60 s",
    )

    done = clean_run()
    assert_reason(
        check_fails_cleanly(RunModel(done.records), done.spec(expected="fails")),
        "the job completed (step 30 at",
        "but was expected to fail",
        "node0's agent exited 0",
    )


def test_check_all_of_a_hanging_fails_run_is_invalid():
    run = failing_run(hang_node="node0")
    verdict = check_all(RunModel(run.records), run.spec(expected="fails"))
    assert not verdict.valid and not verdict.result("fails_cleanly").valid


def test_check_results_are_frozen_data():
    result = check_completed(RunModel(clean_run().records), clean_run().spec())
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.valid = False


def test_check_all_can_run_only_named_checkers():
    run = clean_run()
    verdict = check_all(RunModel(run.records), run.spec(), only=["completed"])
    # trained always runs: no run passes without training, whatever checkers a scenario names
    assert [r.name for r in verdict.results] == ["trained", "completed", "restart_budget"] and verdict.valid


def test_a_checkpoint_damaged_on_purpose_allows_one_more_interval_lost():
    # corrupt-checkpoint at 42 (checkpoints at 20 and 40; 40 damaged), a worker dies at 50: the
    # resume from 20 loses 30 steps, within 2 x 20, and the progress check passes.
    run = HistoryBuilder(steps=60, ckpt=20)
    run.start_workers()
    run.train(42)
    run.fault("corrupt-checkpoint", "node0", node="node0")
    run.train(50)
    run.fault("kill-worker", "node1", node="node1")
    run.group_failure()
    run.wait(3.0)
    run.start_workers(resumed_from=20)
    run.train(60)
    run.finish()
    assert check_progress(run.model(), run.spec()).valid
    # The same loss without the corrupted checkpoint is one interval too many.
    plain = [r for r in run.records if r.get("fault") != "corrupt-checkpoint"]
    result = check_progress(RunModel(plain), run.spec())
    assert not result.valid and "> checkpoint interval 20" in result.reasons[0]


def trained_to_step_20() -> HistoryBuilder:
    """A job of 60 steps at 0.1 s a step, at step 20: where the fault tests below inject."""
    run = HistoryBuilder(steps=60)
    run.start_workers()
    run.train(20, step_s=0.1)
    return run


@pytest.mark.parametrize(
    ("fault", "target", "result"),
    [
        ("kill-node", "etcd", {"node": "etcd"}),  # etcd-v2 training needs etcd only at a rendezvous
        ("partition", "node1 | etcd", {"id": "p1", "cuts": [["etcd", "node1"], ["node1", "etcd"]]}),
        ("link", "node1", {"node": "node1"}),  # a slow, lossy link: slower steps
    ],
)
def test_training_that_goes_on_through_a_fault_is_no_recovery(fault, target, result):
    """No "recovered in 0.1 s" (the step that was in flight) for a fault training rode out."""
    run = trained_to_step_20()
    run.fault(fault, target, **result)
    run.train(60, step_s=0.1)
    run.finish()
    result = check_recovery(run.model(), run.spec())
    assert result.valid
    assert_reason(result, "training went on, no restart", "(during)")
    (recovery,) = run.verdict().recoveries
    assert recovery.degraded and recovery.recovery_s is None


def test_a_partition_between_training_nodes_is_timed_like_any_stop():
    """A cut between two training nodes stops their collectives: the stall until the next step is its recovery."""
    run = trained_to_step_20()
    run.fault("partition", "node0 | node1", id="p1", cuts=[["node0", "node1"], ["node1", "node0"]])
    run.wait(5.0)
    run.fault("heal", "p1", healed=["p1"])
    run.train(60, step_s=0.1)
    run.finish()
    (recovery,) = [r for r in run.verdict().recoveries if r.fault == "partition"]
    assert not recovery.degraded and recovery.recovery_s > 5


def test_a_straggler_that_stops_training_is_never_recovered():
    """A degrading fault after which no step came is no slowdown: it never recovered."""
    run = trained_to_step_20()
    run.fault("slow-node", "node1", node="node1", id="slow-node-node1")
    run.wait(30.0)
    result = check_recovery(run.model(), run.spec())
    assert not result.valid
    assert_reason(result, "slow-node node1", "never recovered")


def test_a_straggler_is_no_recovery_but_a_slowdown():
    run = trained_to_step_20()
    run.fault("slow-node", "node1", node="node1", id="slow-node-node1")
    run.train(40, step_s=0.4)  # every synchronous step waits for the slow node
    run.fault("heal", "slow-node-node1", healed=["slow-node-node1"])
    run.train(60, step_s=0.1)
    run.finish()
    result = check_recovery(run.model(), run.spec())
    assert result.valid
    assert_reason(result, "training slowed, no restart", "(during)")
    (recovery,) = run.verdict().recoveries
    assert recovery.degraded and recovery.recovery_s is None
    assert recovery.throughput_during < recovery.throughput_before / 2
    assert recovery.throughput_after > recovery.throughput_during * 2


# ---------------------------------------------------------------- checkpoint integrity

RUNS = Path(__file__).resolve().parent.parent / "data" / "runs"


def damaged_checkpoint_run(fault, file, resumed_from, rewrite_first=False, **result):
    """Checkpoints at 10 and 20; `fault` damages `file` at step 22, rank 0 dies, the job resumes
    from `resumed_from` (after rewriting step 20 first, if asked, in a round that dies again)."""
    run = HistoryBuilder(steps=30, ckpt=10)
    run.start_workers()
    run.train(22)
    run.fault(fault, "rank0", node="node0", file=file, pid=7, **result)
    run.add(type="agent", node="node0", event="worker_failed", local_rank=0, exitcode=-9, pid=7)
    run.group_failure()
    run.wait(4.0)
    if rewrite_first:
        run.start_workers(resumed_from=10)
        run.train(21)
        run.group_failure()
        run.wait(4.0)
    run.start_workers(resumed_from=resumed_from)
    run.train(30)
    run.finish()
    return run


def judge_integrity(run):
    return check_checkpoint_integrity(RunModel(run.records), run.spec())


def test_checkpoint_integrity_passes_when_the_damaged_checkpoint_is_skipped():
    result = judge_integrity(damaged_checkpoint_run("corrupt-checkpoint", "/ckpt/ckpt-00000020.pt", 10))
    assert result.valid and result.measured
    assert result.metrics == CheckpointIntegrityMetrics(damaged_steps=(20,))
    assert_reason(result, "no start resumed from a damaged checkpoint (step 20)")


def test_checkpoint_integrity_fails_on_a_resume_from_the_corrupted_checkpoint():
    result = judge_integrity(damaged_checkpoint_run("corrupt-checkpoint", "/ckpt/ckpt-00000020.pt", 20))
    assert not result.valid
    assert_reason(
        result,
        "rank 0 on node0 resumed from step 20 at ",
        "after corrupt-checkpoint rank0 (node0) at ",
        "damaged /ckpt/ckpt-00000020.pt, with no checkpoint of step 20 written since",
    )


def test_checkpoint_integrity_reads_the_step_of_a_killed_temp_file():
    run = damaged_checkpoint_run("kill-during-checkpoint", "/ckpt/ckpt-00000020.pt.tmp.7", 20)
    assert not judge_integrity(run).valid


def test_a_kill_just_after_the_temp_file_was_renamed_damaged_nothing():
    """Seen under load: the trigger saw the temp file open, the worker renamed it into place before the
    signal came, and the kill script found it gone (size_at_kill null): step 20 is whole."""
    run = damaged_checkpoint_run("kill-during-checkpoint", "/ckpt/ckpt-00000020.pt.tmp.7", 20, size_at_kill=None)
    result = judge_integrity(run)
    assert result.valid and result.metrics == CheckpointIntegrityMetrics(damaged_steps=())
    assert_reason(result, "landed just after the write of step 20 completed (/ckpt/ckpt-00000020.pt.tmp.7 renamed)")
    still_there = damaged_checkpoint_run(
        "kill-during-checkpoint", "/ckpt/ckpt-00000020.pt.tmp.7", 20, size_at_kill=4096
    )
    assert not judge_integrity(still_there).valid


def test_checkpoint_integrity_allows_a_resume_from_a_step_written_again():
    run = damaged_checkpoint_run("kill-during-checkpoint", "/ckpt/ckpt-00000020.pt.tmp.7", 20, rewrite_first=True)
    assert judge_integrity(run).valid


def test_checkpoint_integrity_without_damage_or_with_an_unnumbered_file():
    assert_reason(judge_integrity(clean_run()), "no checkpoint was damaged on purpose")
    result = judge_integrity(damaged_checkpoint_run("corrupt-checkpoint", "/ckpt/checkpoint.pt", 20))
    assert result.valid and result.metrics == CheckpointIntegrityMetrics(damaged_steps=())
    assert_reason(result, "damaged /ckpt/checkpoint.pt: no checkpoint step in its name")


def test_checkpoint_integrity_is_not_measurable_without_trainer_start_lines():
    run = damaged_checkpoint_run("corrupt-checkpoint", "/ckpt/ckpt-00000020.pt", 20)
    records = without(run.records, lambda r: r.get("kind") == "start")
    result = check_checkpoint_integrity(RunModel(records), run.spec())
    assert result.valid and not result.measured
    assert result.reasons[0].startswith("not measurable here: ")
    # what the user can do with their own script, not "run the shipped trainer"
    assert "shipped trainer" not in result.reasons[0] and "trainer/train.py" not in result.reasons[0]
    assert "torch.load(path)" in result.reasons[0] and "--no-instrument" in result.reasons[0]


def _script_with_a_damaged_checkpoint(saved_again: bool):
    """A plain script (torch.save/torch.load of /ckpt/snapshot.pt) whose checkpoint is corrupted, then a
    worker kill: the restarted workers load the file (the instrumentation's "load" records)."""
    run = ScriptRun(nodes=2)
    run.start_workers()
    run.train(5)
    run.fault("corrupt-checkpoint", "latest", file="/ckpt/snapshot.pt", mode="flip")
    if saved_again:
        run.wait(0.5)
        run.add(type="worker", event="save", path="/ckpt/snapshot.pt", op="torch.save", **run.workers[0])
        run.wait(0.5)
    run.kill_worker("node1")
    run.start_workers()
    for worker in run.workers:
        run.add(type="worker", event="load", path="/ckpt/./snapshot.pt", seconds=0.1, op="torch.load", **worker)
    run.train(8)
    run.finish()
    return check_checkpoint_integrity(RunModel(run.records), run.spec())


def test_checkpoint_integrity_of_any_script_from_the_files_it_loads():
    result = _script_with_a_damaged_checkpoint(saved_again=False)
    assert result.measured and not result.valid
    assert "rank 0 on node0 loaded /ckpt/./snapshot.pt at " in result.reasons[0]
    assert "damaged /ckpt/snapshot.pt, with no save of it since" in result.reasons[0]
    ok = _script_with_a_damaged_checkpoint(saved_again=True)
    assert ok.valid and ok.measured
    assert ok.reasons == ("no process loaded a damaged checkpoint (/ckpt/snapshot.pt)",)


def test_no_not_measurable_text_sends_the_user_to_the_shipped_trainer():
    """Every n/a of every checker, on a plain script's run that shows nothing measurable."""
    from sim.verdict.checkers import CHECKS_FOR

    run = ScriptRun(nodes=2, optimizer=False)
    run.start_workers()
    run.finish()
    model = RunModel(run.records)
    for expected in CHECKS_FOR:
        verdict = check_all(model, RunSpec.from_run(model, expected=expected))
        for result in verdict.results:
            if not result.measured:
                text = " ".join(result.reasons)
                assert "shipped trainer" not in text and "trainer/train.py" not in text, (result.name, text)
                assert "to enable it" in text, (result.name, text)


def captured(case):
    """A captured run's history (tests/data/runs/, see its README)."""
    return RunModel([json.loads(line) for line in (RUNS / case / "history.jsonl").read_text().splitlines()])


@pytest.mark.parametrize(
    ("case", "expected", "damaged"),
    [
        ("corrupt_checkpoint", "recovers", [40]),
        ("kill_during_checkpoint", "recovers", [30]),
        ("full_disk", "recovers", []),
        ("oom_worker", "recovers", []),
        ("full_disk_stays", "fails", []),
    ],
)
def test_captured_runs_of_the_shipped_scenarios_keep_their_verdicts(case, expected, damaged):
    run = captured(case)
    spec = RunSpec.from_run(run, expected=expected)
    assert check_all(run, spec).valid
    assert check_checkpoint_integrity(run, spec).metrics == CheckpointIntegrityMetrics(damaged_steps=tuple(damaged))


def test_captured_repeated_kills_during_checkpoint_writes_never_resume_from_a_damaged_one():
    run = captured("kill_during_checkpoint_x4")
    result = check_checkpoint_integrity(run, RunSpec.from_run(run))
    assert result.valid
    assert result.metrics == CheckpointIntegrityMetrics(damaged_steps=(60, 120, 210, 230, 260, 260))


def test_captured_corrupt_checkpoint_fails_if_a_start_had_loaded_the_damaged_file():
    records = [json.loads(line) for line in (RUNS / "corrupt_checkpoint" / "history.jsonl").read_text().splitlines()]
    tampered = [
        {**r, "resumed_from": 40} if r.get("kind") == "start" and r.get("resumed_from") == 20 else r for r in records
    ]
    run = RunModel(tampered)
    result = check_checkpoint_integrity(run, RunSpec.from_run(run))
    assert not result.valid
    assert "rank 0 on node0 resumed from step 40 at 17:44:56" in result.reasons[0]


# ---------------------------------------------------------------- single group (split brain)

SPLIT_BRAIN = Path(__file__).resolve().parents[1] / "data" / "runs" / "split_brain" / "history.jsonl"


def test_two_groups_training_at_once_fail_single_group():
    """A real clock-skew-60s run on etcd-v2: node1 (60 s ahead) saw its peers as dead; node0 and node2
    regrouped as a world of 2 without it, and node1 made a round of its own: both trained to step 300."""
    run = RunModel([json.loads(line) for line in SPLIT_BRAIN.read_text().splitlines()])
    result = check_single_group(run, RunSpec.from_run(run))
    assert not result.valid and result.metrics == SingleGroupMetrics(split_groups=2)
    assert_reason(result, "node0 (world 2) trained on from step 125 to 300", "node1 (world 1)", "two groups at once")


def _zombie_run(zombie_steps):
    """node2 frozen at step 12; node0 and node1 regroup; woken, node2's old worker logs zombie_steps more steps."""
    run = HistoryBuilder(nodes=3, nproc=1, steps=40)
    run.start_workers()
    run.train(12)
    run.fault("pause", "node2", node="node2")
    run.wait(5.0)
    run.start_workers(resumed_from=10, nodes=["node0", "node1"])
    run.train(20)
    for step in range(13, 13 + zombie_steps):
        run.trainer("node2", 0, 2, 3, "progress", step=step, epoch=0, loss=0.5)
    run.train(40)
    run.finish()
    return run


def test_a_zombies_last_steps_are_not_a_second_group():
    run = _zombie_run(zombie_steps=3)
    model = run.model()
    assert model.zombies and check_single_group(model, run.spec()).valid
    assert not check_single_group(_zombie_run(zombie_steps=12).model(), run.spec()).valid


# ---------------------------------------------------------------- stalled (a run expected to hang)


def hanging_run(quiet_s=70.0, then=None):
    """node1's worker stops calling collectives after step 25; nothing moves for quiet_s."""
    run = HistoryBuilder(steps=200, nproc=1)
    run.start_workers()
    run.train(25)
    run.fault("hang-collectives", "node1", node="node1", rank=1, pid=77)
    run.wait(quiet_s)
    if then:
        then(run)
    run.end()
    return run


def test_a_run_that_hangs_with_every_agent_up_is_stalled():
    run = hanging_run()
    result = check_stalled(RunModel(run.records), run.spec(expected="hangs"))
    assert result.valid, result.reasons
    assert_reason(result, "s after hang-collectives node1", "every agent still running")
    verdict = check_all(RunModel(run.records), run.spec(expected="hangs"))
    assert verdict.valid and [r.name for r in verdict.results][:2] == ["trained", "stalled"]


def test_a_short_silence_an_exit_a_regroup_or_completion_is_not_a_hang():
    short = hanging_run(quiet_s=20.0)
    assert_reason(
        check_stalled(RunModel(short.records), short.spec(expected="hangs")),
        "only 21.5 s without progress",
        "fewer than the 60 s that make a hang",
    )
    exited = hanging_run(then=lambda run: run.die("node0", 1))
    assert_reason(
        check_stalled(RunModel(exited.records), exited.spec(expected="hangs")),
        "node0's agent exited at",
        "the job ended instead of hanging",
    )

    def regroup(run):
        run.start_workers(resumed_from=20)
        run.train(30)
        run.wait(70.0)

    regrouped = hanging_run(quiet_s=12.0, then=regroup)
    assert_reason(
        check_stalled(RunModel(regrouped.records), regrouped.spec(expected="hangs")),
        "a new worker group started at",
    )
    done = HistoryBuilder(steps=30)
    done.start_workers()
    done.train(10)
    done.fault("hang-collectives", "node1", node="node1")
    done.train(30)
    done.finish()
    assert_reason(check_stalled(RunModel(done.records), done.spec(expected="hangs")), "but was expected to hang")


def test_stalled_needs_a_fault_and_a_visible_job():
    run = HistoryBuilder(steps=200)
    run.start_workers()
    run.train(10)
    run.wait(90.0)
    run.end()
    assert_reason(check_stalled(RunModel(run.records), run.spec(expected="hangs")), "no fault took effect")


HANG_DEFAULT_DDP = Path(__file__).resolve().parents[1] / "data" / "runs" / "hang_default_ddp" / "history.jsonl"


def test_a_real_hang_under_the_default_timeout_is_stalled_and_diagnosed():
    """A real hang-default-ddp.yaml run (tests/scripts/ddp_sgd.py, no timeout given to init_process_group):
    node1's worker stopped calling collectives at step 29; node0's blocked; both agents up, no restart."""
    run = RunModel([json.loads(line) for line in HANG_DEFAULT_DDP.read_text().splitlines()])
    verdict = check_all(run, RunSpec.from_run(run, expected="hangs"))
    assert verdict.valid, [r.reasons for r in verdict.results]
    assert_reason(verdict.result("stalled"), "after hang-collectives node1", "every agent still running, no restart")
    (found,) = [d for d in diagnose(run, {}) if d.code == "process-group-timeout"]
    assert "node1 stopped answering (fault hang-collectives on node1 (ok))" in found.evidence[0]
    # The same history judged as a run meant to recover fails: it never did. node0 logged step 29, in flight when
    # node1 was held, 0.2 s after the fault: no recovery (the old checker said "recovered in 0.2 s").
    assert not check_all(run, RunSpec.from_run(run)).valid
    result = check_recovery(run, RunSpec.from_run(run))
    assert not result.valid and result.metrics.recoveries[0].recovery_s is None
    assert_reason(result, "hang-collectives node1", "never recovered (1 step in flight right after it, then no")


def test_completed_excuses_a_node_refused_by_the_closed_rendezvous_at_the_end():
    """The old zombie-rank0 [etcd-v2] flake, made on purpose (chaos/scenarios/zombie-rank0-late-heal.yaml): rank 0's
    node frozen in a checkpoint write, woken only once the others finished step 80. Its old worker's rename
    failed, its agent came to join, found the rendezvous closed and exited 1. The training completed: the
    old checker said `completed FAIL node0's agent exited 1`."""
    run = captured("zombie_late_heal")
    result = check_completed(run, RunSpec.from_run(run, expected="recovers"))
    assert result.valid, result.reasons
    assert result.metrics.excused_nodes == ("node0",)
    assert_reason(result, "node0 excused: it came to join at 14:06:04, after the others finished")
    assert check_all(run, RunSpec.from_run(run, expected="recovers")).valid

    # The same late join by a node added at the end (sim scale at step 78 of 80).
    late = captured("late_join_at_end")
    assert check_completed(late, RunSpec.from_run(late, target_steps=None, expected="recovers")).valid


def test_completed_still_fails_an_exit_1_that_is_not_a_refused_late_join():
    """A RendezvousClosedError before any group finished, or an agent exit with another code, stays a failure."""
    records = [json.loads(line) for line in (RUNS / "zombie_late_heal" / "history.jsonl").read_text().splitlines()]
    unfinished = [r for r in records if not (r.get("type") == "agent" and r.get("event") == "group_finished")]
    run = RunModel(unfinished)
    assert run.refused_at_end() == {}
    assert_reason(check_completed(run, RunSpec.from_run(run, expected="recovers")), "node0's agent exited 1 at")

    killed = [
        {**r, "exit_code": 137}
        if r.get("type") == "docker" and r.get("node") == "node0" and r.get("action") == "die"
        else r
        for r in records
    ]
    run = RunModel(killed)
    assert_reason(check_completed(run, RunSpec.from_run(run, expected="recovers")), "node0's agent exited 137")
