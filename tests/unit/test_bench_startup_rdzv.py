"""bench/recovery.py's start-up rendezvous figure, on hand-written histories."""

from bench.recovery import startup_rendezvous
from tests.unit.histories import HistoryBuilder


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
