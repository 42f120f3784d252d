"""bench/recovery.py's start-up figures (its rendezvous, its phases), on hand-written histories."""

import pytest

from bench.recovery import startup_phases, startup_rendezvous
from tests.unit.histories import HistoryBuilder, ScriptRun


def _joining(run: HistoryBuilder, *nodes: str) -> None:
    for node in nodes:
        run.add(type="agent", node=node, event="rdzv_joining")


def test_from_the_last_agent_entering_to_the_last_completing():
    run = HistoryBuilder(nodes=3)
    _joining(run, "node0", "node1")
    run.wait(4.0)  # node2's container starts late: not the backend's time
    _joining(run, "node2")
    run.wait(0.25)
    run.start_workers()  # every agent's rdzv_complete 0.5 s later
    run.train(until=5)
    assert startup_rendezvous(run.model()) == 0.75


def test_only_the_first_rendezvous_counts():
    run = HistoryBuilder(nodes=2)
    _joining(run, *run.nodes)
    run.start_workers()
    run.train(until=5)
    run.wait(10.0)
    _joining(run, *run.nodes)  # a later round, after a fault
    run.start_workers(resumed_from=5)
    assert startup_rendezvous(run.model()) == 0.5


def test_none_until_every_agent_that_joined_has_completed():
    run = HistoryBuilder(nodes=2)
    assert startup_rendezvous(run.model()) is None
    _joining(run, *run.nodes)
    assert startup_rendezvous(run.model()) is None


def _started_script(instrumented: bool) -> tuple[ScriptRun, float]:
    """Two nodes: containers at the run's start, agents entering the rendezvous 1 s later, the round
    complete 0.5 s after that, workers 2 s later (import 0.3 s, pg init 0.3 s more), a step 1.7 s on."""
    run = ScriptRun(nodes=2)
    t_up = run.t - 0.2  # `up` called: the host's part before the history starts
    run.wait(1.0)
    _joining(run, *run.nodes)
    run.wait(0.5)
    run.start_workers()
    if instrumented:
        run.way_to_first_step(imported_s=0.3, pg_ready_s=0.6)
    run.train(until=1)
    return run, t_up


def test_startup_phases_end_where_the_last_node_got_there():
    run, t_up = _started_script(instrumented=True)
    model = run.model()
    phases = startup_phases(model, t_up, model.step_beat_times[0])
    assert phases == pytest.approx(
        {
            "host_s": 0.2,
            "containers_s": 0.0,
            "agents_s": 1.0,
            "rendezvous_s": 0.5,
            "worker_start_s": 2.3,
            "pg_init_s": 0.3,
            "first_step_s": 1.4,
        }
    )


def test_a_startup_phase_with_no_record_is_none_and_the_next_takes_its_time():
    run, t_up = _started_script(instrumented=False)
    model = run.model()
    phases = startup_phases(model, t_up, model.step_beat_times[0])
    assert phases["worker_start_s"] is None and phases["pg_init_s"] is None
    assert phases["first_step_s"] == pytest.approx(4.0)
    assert sum(v for v in phases.values() if v is not None) == pytest.approx(model.step_beat_times[0] - t_up)
