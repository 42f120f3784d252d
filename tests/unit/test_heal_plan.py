"""Heal as a plan (sim/faults/heal.py): what to undo, in which order, what to keep and why, as data from the
faults in force and the containers' states. No Docker, no nemesis: the executor is tested in test_nemesis."""

from __future__ import annotations

import pytest

from sim.core.faultkinds import (
    FAULT_KINDS,
    ApplyPartitions,
    ClearLink,
    ContinueWorker,
    LimitCpu,
    NodeShell,
    RemoveFile,
    Struck,
    Unpause,
)
from sim.core.faultkinds.clock import SKEW_CLOCK
from sim.faults.heal import EndAct, Keep, Undo, plan_heal
from sim.faults.inforce import InForce

RUNNING = {"etcd": "running", "node0": "running", "node1": "running", "node2": "running"}


def fault(kind: str, node: str = "node1", **fields) -> InForce:
    return InForce(id=f"{kind}-{node}", fault=kind, target=node, **fields)


def test_a_pause_is_undone_first_and_the_node_it_frees_has_its_link_cleared():
    plan = plan_heal([fault("link"), fault("pause")], {**RUNNING, "node1": "paused"})
    assert plan.steps == (
        Undo("pause-node1", (Unpause("node1"),)),
        Undo("link-node1", (ClearLink("node1"),)),
    )
    assert plan.undone == ("pause-node1", "link-node1") and not plan.sweep


def test_a_frozen_writer_is_unpaused_then_continued():
    (step,) = plan_heal([fault("freeze", pid=41)], {**RUNNING, "node1": "paused"}).steps
    assert step == Undo("freeze-node1", (Unpause("node1"), ContinueWorker("node1", 41)))


def test_a_stopped_node_took_its_process_faults_along_and_keeps_its_settings_and_files():
    stopped = {**RUNNING, "node1": "exited"}
    plan = plan_heal(
        [
            fault("link"),
            fault("hang", pid=40),
            fault("slow-node", cpu_quota=0, cpu_period=0),
            fault("skew-clock"),
            fault("fill", file="/ckpt/.sim-filler"),
        ],
        stopped,
    )
    steps = {step.fault_id: step for step in plan.steps}
    assert steps["link-node1"] == Undo("link-node1", (), "nothing left to undo: node1 is exited")
    assert steps["hang-node1"].actions == ()
    assert steps["slow-node-node1"].actions == (LimitCpu("node1", -1, 100_000),)  # no quota of its own: none
    assert steps["skew-clock-node1"] == Keep(
        "skew-clock-node1", "node1 is exited; `sim start node1`, then `sim heal skew-clock-node1`"
    )
    # the shared volume is reached from any running node but etcd
    assert steps["fill-node1"].actions == (RemoveFile("node0", "/ckpt/.sim-filler"),)
    assert [k.fault_id for k in plan.kept] == ["skew-clock-node1"]


def test_a_node_local_filler_of_a_removed_container_went_with_it_and_a_paused_clock_waits():
    gone = {k: v for k, v in RUNNING.items() if k != "node1"}
    (step,) = plan_heal([fault("fill", file="/data/.sim-filler")], gone).steps
    assert step == Undo("fill-node1", (), "nothing left to undo: node1 is gone")
    (kept,) = plan_heal([fault("skew-clock")], {**RUNNING, "node1": "paused"}).steps
    assert kept == Keep("skew-clock-node1", "node1 is paused; `sim unpause node1`, then `sim heal skew-clock-node1`")
    (nowhere,) = plan_heal([fault("fill", file="/ckpt/.sim-filler")], {"etcd": "running"}).steps
    assert nowhere == Keep(
        "fill-node1", "no running node reaches /ckpt/.sim-filler; start one, then `sim heal fill-node1`"
    )


def test_heal_all_sweeps_and_a_partition_is_undone_by_applying_the_others_again():
    cut = InForce(id="partition-ab12", fault="partition", target="node0 | node1", cuts=(("node0",), ("node1",)))
    plan = plan_heal([cut], RUNNING, sweep=True)
    assert plan.sweep and plan.steps[0].actions == (ApplyPartitions(),)


def _set_clock(node: str, seconds: float) -> NodeShell:
    (action,) = SKEW_CLOCK.act.undo(Struck(node)) if seconds == 0 else SKEW_CLOCK.act.inject(None, Struck(node))
    return action


@pytest.mark.parametrize("kind", [k for k in FAULT_KINDS if k.in_force is not None], ids=lambda k: k.name)
def test_every_in_force_kind_on_a_running_node_has_an_undo(kind):
    record = fault(kind.in_force, pid=40, file="/ckpt/x", cpu_quota=5000, cpu_period=100_000)
    (step,) = plan_heal([record], RUNNING).steps
    assert isinstance(step, Undo)
    # a pause of a running node: someone unpaused it already
    assert step.actions or kind.in_force == "pause", kind.name
    expected = {
        "partition": ApplyPartitions(),
        "link": ClearLink("node1"),
        "hang": ContinueWorker("node1", 40),
        "stall": RemoveFile("node1", "/ckpt/x"),
        "slow-node": LimitCpu("node1", 5000, 100_000),
        "skew-clock": _set_clock("node1", 0),
        "fill": RemoveFile("node1", "/ckpt/x"),
        "freeze": ContinueWorker("node1", 40),
    }
    if kind.in_force in expected:
        assert step.actions == (expected[kind.in_force],)


def test_the_plan_does_not_change_the_states_it_was_given():
    states = {**RUNNING, "node1": "paused"}
    plan_heal([fault("pause")], states)
    assert states["node1"] == "paused"


def test_an_in_force_record_round_trips_through_the_store_and_keeps_keys_it_does_not_name(tmp_path):
    from sim.faults.inforce import FaultStore

    store = FaultStore(tmp_path / "faults.json")
    store.remember({"id": "partition-x", "fault": "partition", "target": "a | b", "cuts": [["a"], ["b"]], "new": 1})
    (record,) = store.active()
    assert record.cuts == (("a",), ("b",)) and record.extra == {"new": 1} and record.since > 0
    assert record.to_dict()["cuts"] == [["a"], ["b"]] and FaultStore(tmp_path / "faults.json").active() == [record]
    store.forget_faults_of(["b"], None)
    assert store.active() == [record]  # a partition's target is its description, not a node
    store.forget("partition-x")
    assert store.active() == []


# --- intents: a fault recorded before it acted, interrupted mid-act (issue 37 finding 7) ---------------


def test_an_interrupted_freeze_ends_its_watcher_then_continues_every_worker_of_the_node():
    intent = fault("freeze", acting=True, act="elastic-sim-act=freeze-node1")  # no pid: none was caught yet
    (step,) = plan_heal([intent], {**RUNNING, "node1": "paused"}).steps
    assert step == Undo(
        "freeze-node1",
        (Unpause("node1"), EndAct("node1", "elastic-sim-act=freeze-node1"), ContinueWorker("node1", None)),
    )
    (running,) = plan_heal([intent], RUNNING).steps  # interrupted before the pause
    assert running.actions == (EndAct("node1", "elastic-sim-act=freeze-node1"), ContinueWorker("node1", None))


def test_an_interrupted_fill_ends_its_filler_before_removing_the_file_and_a_finished_one_only_removes():
    filler = {"file": "/ckpt/.sim-filler", "act": "elastic-sim-act=fill-node1"}
    (cut,) = plan_heal([fault("fill", acting=True, **filler)], RUNNING).steps
    assert cut.actions == (EndAct("node1", filler["act"]), RemoveFile("node1", "/ckpt/.sim-filler"))
    (done,) = plan_heal([fault("fill", **filler)], RUNNING).steps
    assert done.actions == (RemoveFile("node1", "/ckpt/.sim-filler"),)
    # Its node gone: the filler went with its exec; another node removes the file on the shared volume.
    (gone,) = plan_heal([fault("fill", acting=True, **filler)], {**RUNNING, "node1": "exited"}).steps
    assert gone.actions == (RemoveFile("node0", "/ckpt/.sim-filler"),)


def test_an_intent_is_recorded_before_the_act_and_stays_when_the_call_is_interrupted(tmp_path):
    from sim.faults.inforce import FaultStore

    store = FaultStore(tmp_path / "faults.json")
    with (
        pytest.raises(KeyboardInterrupt),
        store.claimed("pause-node1", None, lambda: {"fault": "pause", "target": "node1"}),
    ):
        assert [(f.id, f.acting) for f in store.active()] == [("pause-node1", True)]  # before it acts
        raise KeyboardInterrupt
    assert [(f.id, f.acting) for f in store.active()] == [("pause-node1", True)]  # heal --all undoes it
    with store.claimed("pause-node1", None, lambda: {"fault": "pause", "target": "node1"}):
        pass
    assert [(f.id, f.acting) for f in store.active()] == [("pause-node1", False)]  # acted: an outcome
