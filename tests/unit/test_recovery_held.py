"""A fault that holds its workers (hang-collectives, hang-worker, pause): the steps already in flight when it
struck are not a recovery (issue 36 item 6: a FAIL row for a hung collective said "recovered in 0.4 s")."""

from sim.verdict.checkers import check_recovery
from sim.verdict.recovery import recoveries
from tests.unit.histories import HistoryBuilder


def held_run(fault="hang-collectives", in_flight=(26, 27), then=None, quiet_s=70.0):
    """Training at 10 steps/s (a record every 0.5 s, as the instrumentation throttles them); node1's worker is
    held before its next collective; each rank logs the steps in flight, then nothing moves for quiet_s."""
    run = HistoryBuilder(steps=100000, nproc=1)
    run.start_workers()
    run.train(25, step_s=0.5)
    run.fault(fault, "node1", node="node1", rank=1, pid=77)
    for step in in_flight:
        run.wait(0.2)
        for node, local, rank, world in run.workers:
            run.trainer(node, local, rank, world, "progress", step=step, epoch=0, loss=0.5)
        run.step = step
    run.wait(quiet_s)
    if then:
        then(run)
    run.end()
    return run


def test_steps_in_flight_after_a_hold_that_never_released_are_no_recovery():
    run = held_run()
    (recovery,) = recoveries(run.model())
    assert recovery.first_progress is None and recovery.public().recovery_s is None
    result = check_recovery(run.model(), run.spec())
    assert not result.valid
    (reason,) = result.reasons
    assert "never recovered" in reason and "recovered in" not in reason
    assert "2 steps in flight right after it, then no progress" in reason


def test_the_same_holds_for_a_held_worker_and_a_paused_node():
    for fault in ("hang-worker", "pause", "freeze-during-checkpoint"):
        run = held_run(fault=fault, in_flight=(26,))
        assert recoveries(run.model())[0].public().recovery_s is None, fault


def test_a_heal_that_releases_the_hold_is_timed_to_the_steady_training_after_it():
    def heal_then_train(run):
        t_heal = run.fault("heal", "all")
        run.train(60, step_s=0.5)
        run.finish(end=False)
        heal_then_train.t_heal = t_heal

    run = held_run(quiet_s=20.0, then=heal_then_train)
    (held,) = recoveries(run.model())
    public = held.public()
    assert public.recovery_s is not None and public.t_recovered > heal_then_train.t_heal
    assert public.recovery_s > 20.0
    result = check_recovery(run.model(), run.spec())
    assert result.valid, result.reasons


def test_a_hold_that_never_bit_leaves_training_going_on_as_before():
    """Steady steps right after the fault and on to the end: the hold never stopped training (its worker was
    past its last collective), so the first step after it is the recovery, as before."""
    run = HistoryBuilder(steps=60, nproc=1)
    run.start_workers()
    run.train(25, step_s=0.5)
    t_ok = run.fault("hang-collectives", "node1", node="node1")
    run.train(60, step_s=0.5)
    run.finish()
    (recovery,) = recoveries(run.model())
    assert recovery.public().recovery_s is not None and recovery.public().recovery_s < 1.0
    assert recovery.t_recovered > t_ok


def test_a_hold_healed_within_seconds_is_timed_to_the_step_after_its_heal():
    """Held 1.5 s (shorter than the 3 s that otherwise mark a hold): the gap across the heal is the hold."""

    def heal_then_train(run):
        heal_then_train.t_heal = run.fault("heal", "all", take_s=0.2)
        run.train(60, step_s=0.5)
        run.finish(end=False)

    run = held_run(in_flight=(26,), quiet_s=1.5, then=heal_then_train)
    (held,) = recoveries(run.model())
    assert held.in_flight == 1 and held.t_recovered > heal_then_train.t_heal
