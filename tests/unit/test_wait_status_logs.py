import pytest

from sim.core.agentlog import node_log_facts
from sim.core.errors import ClusterError
from sim.core.wait import Check, Condition, wait_for


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Scripted:
    description = "waiting for the thing"

    def __init__(self, checks):
        self.checks = list(checks)

    def check(self):
        return self.checks.pop(0) if len(self.checks) > 1 else self.checks[0]


def test_wait_ready_after_polls():
    clock = FakeClock()
    result = wait_for(
        Scripted([Check(False), Check(False), Check(True, detail="node1")]), timeout=10, clock=clock, sleep=clock.sleep
    )
    assert result.detail == "node1" and clock.now == 2.0


def test_wait_times_out_with_detail():
    clock = FakeClock()
    with pytest.raises(ClusterError, match=r"waiting for the thing: not reached within 5s \(node0 created\)"):
        wait_for(Scripted([Check(False, detail="node0 created")]), timeout=5, clock=clock, sleep=clock.sleep)


def test_wait_fails_fast():
    clock = FakeClock()
    with pytest.raises(ClusterError, match="node0 exited"):
        wait_for(Scripted([Check(False, failure="node0 exited")]), timeout=100, clock=clock, sleep=clock.sleep)
    assert clock.now == 0.0


def test_wait_without_raising_returns_the_last_check():
    clock = FakeClock()
    timed_out = wait_for(
        Scripted([Check(False, detail="slow")]), timeout=3, clock=clock, sleep=clock.sleep, raise_errors=False
    )
    assert not timed_out.ready and timed_out.failure is None and clock.now == 3.0
    failed = wait_for(
        Scripted([Check(False, failure="gone")]), timeout=None, clock=clock, sleep=clock.sleep, raise_errors=False
    )
    assert failed.failure == "gone"


def test_condition_polls_a_predicate():
    clock, answers = FakeClock(), iter([0, [], "yes"])
    assert wait_for(Condition("the answer", lambda: next(answers)), timeout=10, clock=clock, sleep=clock.sleep).ready
    assert clock.now == 2.0


AGENT_LOG = """\
I1129 10:57:15.272000 7 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1234] The node 'node0_7_0' has joined round 2 of the rendezvous 'sim-r1' as rank 1 in a world of size 3.
W1129 10:57:20.000000 7 torch/distributed/elastic/agent/server/api.py:900] [default] Worker group FAILED. 2/3 attempts left; will restart worker group
{"sim": "progress", "t": 1.0, "node": "node0", "rank": 2, "local_rank": 0, "world_size": 6, "restart": 1, "step": 17, "epoch": 0, "loss": 0.5}
"""


def test_node_log_facts():
    facts = node_log_facts(AGENT_LOG)
    assert (facts.round, facts.group_rank, facts.nodes_in_round) == (2, 1, 3)
    # "2/3 attempts left" is the agent's second failure: two restarts used (the progress line is older)
    assert facts.restarts == 2 and facts.step == 17 and facts.world_size == 6 and not facts.finished


def _clusters(**nodes):
    """A fake listing: cluster name -> its node names."""
    from types import SimpleNamespace

    return lambda name: [SimpleNamespace(node=n) for n in nodes.get(name, [])]


def test_sim_logs_reads_one_word_as_a_node_of_the_default_cluster_else_as_a_cluster():
    from sim.cli.main import _logs_target
    from sim.core.errors import UsageError

    listing = _clusters(sim=["etcd", "node0", "node1"], h2=["etcd", "node0"])
    assert _logs_target([], None, listing) == ("sim", None)
    assert _logs_target(["node1"], None, listing) == ("sim", "node1")
    assert _logs_target(["h2"], None, listing) == ("h2", None)  # as `sim status h2` takes it
    assert _logs_target(["h2", "node0"], None, listing) == ("h2", "node0")
    assert _logs_target(["node0"], "h2", listing) == ("h2", "node0")
    assert _logs_target([], "h2", listing) == ("h2", None)
    with pytest.raises(UsageError, match="neither a node of cluster 'sim' nor a cluster"):
        _logs_target(["nope"], None, listing)
    with pytest.raises(UsageError, match="cluster 'gone': not found"):
        _logs_target(["gone", "node0"], None, listing)
    with pytest.raises(UsageError, match="too many words"):
        _logs_target(["h2", "node0", "x"], None, listing)
    with pytest.raises(UsageError, match="cluster 'sim': not found"):
        _logs_target([], None, _clusters())
