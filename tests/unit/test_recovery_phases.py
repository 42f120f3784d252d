"""Where a recovery goes (sim/verdict/recovery.py RecoveryPhases): the phases from hand-written histories, their
place in the report, the records they come from (sim/core/history.py) and the instrumentation that writes
them (images/node/elastic_sim_instrument.py, in-process with fakes, then with real torch)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from sim.core.history import TrainerRecord, WorkerRecord, parse_record
from sim.core.sidechannel import worker_record
from sim.verdict.recovery import RecoveryPhases, recoveries
from sim.verdict.report import build_report, format_summary

from .histories import HistoryBuilder, ScriptRun
from .test_instrument import Clock, FakeOptimizer, instrument, probe_writing_to, run_as_worker, side_channel

FIELDS = ("detection_s", "rendezvous_s", "worker_start_s", "pg_init_s", "ckpt_load_s", "first_step_s")


def only_recovery(run):
    [recovery] = recoveries(run)
    return recovery


def trainer_worker_crash(timed: bool) -> HistoryBuilder:
    """node1's worker killed at step 12; its agent notices 0.3 s after the fault's ok; the new round
    completes 1.7 s later, its trainers start 2 s after that and step 1 s later. Timed: torch imported
    1.2 s after the round, the process group ready 0.4 s later, the checkpoint load 0.3 s up to the
    start line (the 0.1 s before it: building the model and optimizer)."""
    b = HistoryBuilder(nodes=2, nproc=1, steps=30)
    b.start_workers()
    b.train(12)
    b.fault("kill-worker", "node1", take_s=0.4, node="node1")
    b.wait(0.3)
    b.add(type="agent", node="node1", event="worker_failed", exitcode=-9, local_rank=0, pid=1)
    b.group_failure()
    b.wait(1.2)
    b.start_workers(resumed_from=10)
    if timed:
        b.time_starts(import_s=1.2, pg_init_s=0.4, load_s=0.3)
    b.train(30)
    b.finish()
    return b


def test_the_shipped_trainer_s_recovery_splits_into_phases_that_add_up():
    recovery = only_recovery(trainer_worker_crash(timed=True).model())
    assert recovery.phases == RecoveryPhases(0.3, 1.7, 1.2, 0.4, 0.3, 1.1)
    assert sum(dataclasses.astuple(recovery.phases)) == pytest.approx(recovery.public().recovery_s)


def test_an_old_history_tells_what_it_can():
    """Trainer start lines without the import, process-group and load times (written before them)."""
    phases = only_recovery(trainer_worker_crash(timed=False).model()).phases
    assert phases == RecoveryPhases(detection_s=0.3, rendezvous_s=1.7)


def script_worker_crash(way: bool) -> ScriptRun:
    """A plain script: the kill's ok, the agents notice 1 s later, the round completes 3 s after that;
    the new workers start 2 s later and step 2 s after their start."""
    run = ScriptRun(nodes=2, absolute_steps=True)
    run.start_workers()
    run.train(5)
    run.kill_worker("node1")
    run.start_workers(resumed_from=3)
    if way:
        # torch imported 0.4 s after start, 0.2 s loading a checkpoint before the process group is
        # ready (0.9 s), 0.3 s more after it.
        run.way_to_first_step(imported_s=0.4, pg_ready_s=0.9, loads=[(0.6, 0.2), (1.5, 0.5)])
    run.train(8)
    run.finish()
    return run


def test_a_script_s_checkpoint_loads_come_out_of_the_phases_they_fell_in():
    recovery = only_recovery(script_worker_crash(way=True).model())
    assert recovery.phases == RecoveryPhases(1.0, 3.0, 2.4, 0.3, 0.5, 0.8)
    assert sum(dataclasses.astuple(recovery.phases)) == pytest.approx(recovery.public().recovery_s)


def test_without_instrumentation_only_the_agents_phases_are_known():
    phases = only_recovery(script_worker_crash(way=False).model()).phases
    assert phases == RecoveryPhases(detection_s=1.0, rendezvous_s=3.0)


def test_a_script_that_loads_nothing_spends_no_time_loading():
    run = ScriptRun(nodes=2, absolute_steps=True)
    run.start_workers()
    run.train(5)
    run.kill_worker("node1")
    run.start_workers(resumed_from=3)
    run.way_to_first_step(imported_s=0.4, pg_ready_s=0.9)
    run.train(8)
    run.finish()
    phases = only_recovery(run.model()).phases
    assert (phases.ckpt_load_s, phases.pg_init_s, phases.first_step_s) == (0.0, 0.5, 1.1)


def test_the_agent_of_a_node_the_fault_took_out_does_not_count_as_noticing():
    b = HistoryBuilder(nodes=3, nproc=1, steps=30)
    b.start_workers()
    b.train(12)
    # node2's agent saw its own workers die before it went: not a survivor noticing.
    killed = {"type": "agent", "node": "node2", "event": "worker_failed", "exitcode": -9, "local_rank": 0, "pid": 1}
    b.fault("kill-node", "node2", take_s=0.4, effects=[killed], node="node2")
    b.wait(2.0)
    b.group_failure(nodes=["node0", "node1"])
    b.wait(1.0)
    b.start_workers(resumed_from=10, nodes=["node0", "node1"])
    b.train(30)
    b.finish(nodes=["node0", "node1"])
    phases = only_recovery(b.model()).phases
    assert (phases.detection_s, phases.rendezvous_s) == (2.0, 1.5)


def test_detection_lasts_until_the_last_agent_of_the_new_round_entered_the_rendezvous():
    """A frozen worker: node0 notices at once; node1 sees nodes waiting, but stopping its frozen worker
    takes torch's 30 s stop timeout before it joins. That is not the rendezvous' doing."""
    b = HistoryBuilder(nodes=2, nproc=1, steps=30)
    b.start_workers()
    b.train(12)
    b.fault("hang-worker", "node1", take_s=0.4, node="node1")
    b.wait(10.0)
    b.add(type="agent", node="node0", event="group_failed", attempts_left=3, max_restarts=3)
    b.add(type="agent", node="node0", event="rdzv_joining")
    b.wait(0.5)
    b.add(type="agent", node="node1", event="new_nodes", count=1)
    b.wait(30.0)
    b.add(type="agent", node="node1", event="rdzv_joining")
    b.wait(0.5)
    b.start_workers(resumed_from=10)
    b.train(30)
    b.finish()
    phases = only_recovery(b.model()).phases
    assert (phases.detection_s, phases.rendezvous_s) == (40.5, 1.0)


def test_a_joining_node_is_noticed_by_the_agents_already_there():
    b = HistoryBuilder(nodes=3, nproc=1, steps=30)
    b.start_workers(nodes=["node0", "node1"])
    b.train(12)
    b.fault("scale", "3", take_s=0.4, joined=["node2"], left=[])
    b.add(type="agent", node="node2", event="rdzv_joining")  # the new node itself
    b.wait(1.5)
    b.add(type="agent", node="node0", event="new_nodes", count=1)
    b.wait(0.5)
    b.start_workers(resumed_from=10)
    b.train(30)
    b.finish()
    assert only_recovery(b.model()).phases.detection_s == 1.5


def test_no_restart_no_phases():
    """Training went on through the fault (a lossy link): nothing to split."""
    b = HistoryBuilder(nodes=2, nproc=1, steps=30)
    b.start_workers()
    b.train(12)
    b.fault("link", "node1", node="node1")
    b.train(30)
    b.finish()
    recovery = only_recovery(b.model())
    assert recovery.restart is None and recovery.phases == RecoveryPhases() and not recovery.phases.known


# --- the report ------------------------------------------------------------------------------


def fault_line(text: str, fault: str) -> list[str]:
    return next(line for line in text.split("Faults:")[1].splitlines() if fault in line).split()


def test_report_json_and_the_text_say_where_the_recovery_went():
    b = trainer_worker_crash(timed=True)
    run, verdict = b.model(), b.verdict()
    [entry] = build_report(verdict, run, title="t", profile="fast").to_json()["recoveries"]
    assert entry["phases"] == dict(zip(FIELDS, (0.3, 1.7, 1.2, 0.4, 0.3, 1.1), strict=True))
    json.dumps(entry)  # plain data
    text = format_summary(verdict, run, title="t", profile="fast")
    assert "s: detect/rdzv/start/pg/ckpt/step  rdzv share" in text
    assert fault_line(text, "kill-worker")[-2:] == ["0.3/1.7/1.2/0.4/0.3/1.1", "34%"]  # 1.7 s of 5.0 s


def test_the_report_marks_what_an_old_history_cannot_tell():
    b = trainer_worker_crash(timed=False)
    text = format_summary(b.verdict(), b.model(), title="t", profile="fast")
    assert fault_line(text, "kill-worker")[-2:] == ["0.3/1.7/?/?/?/?", "34%"]


def test_a_fault_without_phases_shows_dashes():
    b = HistoryBuilder(nodes=2, nproc=1, steps=30)
    b.start_workers()
    b.train(12)
    b.fault("link", "node1", node="node1")
    b.train(30)
    b.finish()
    text = format_summary(b.verdict(), b.model(), title="t", profile="fast")
    assert fault_line(text, "link")[-2:] == ["-", "-"]


# --- the records -----------------------------------------------------------------------------


def test_the_new_records_parse_and_old_ones_still_do():
    for event, fields in (("imported", {}), ("pg_ready", {"seconds": 0.25}), ("load", {"n": 2, "seconds": 1.5})):
        record = parse_record({"t": 1.0, "type": "worker", "event": event, "node": "node0", "pid": 7, **fields})
        assert isinstance(record, WorkerRecord) and record.event == event
        assert worker_record(json.dumps({"t": 1.0, "event": event, **fields}), "node0") is not None  # the collector
    times = {"t_imported": 2.0, "t_pg_ready": 3, "t_ckpt_began": 4.5}
    start = parse_record({"t": 5.0, "type": "trainer", "kind": "start", **times})
    assert isinstance(start, TrainerRecord)
    assert (start.t_imported, start.t_pg_ready, start.t_ckpt_began) == (2.0, 3, 4.5)
    old = parse_record({"t": 5.0, "type": "trainer", "kind": "start", "resumed_from": 10})
    assert (old.t_imported, old.t_pg_ready, old.t_ckpt_began, old.extra) == (None, None, None, {})


# --- the instrumentation ---------------------------------------------------------------------


class FakeLoads:
    """A module whose `load` takes `seconds` on the probe's clock and may call another load inside."""

    def __init__(self, clock: Clock, seconds: float):
        self.clock, self.seconds, self.inner = clock, seconds, None

    def load(self, *args, **kwargs):
        self.clock.now += self.seconds
        if self.inner is not None:
            self.inner.load()
        return "state"


def test_loads_are_timed_until_the_first_step_and_flushed_at_each_milestone():
    records: list = []
    probe = probe_writing_to(records)
    torch_like = FakeLoads(probe._clock, 0.1)
    dcp_like = FakeLoads(probe._clock, 0.2)
    dcp_like.inner = torch_like  # dcp.load's own torch.load: counted once, as part of dcp.load
    probe.wrap_loads(torch_like, ("load",), "torch.")
    probe.wrap_loads(dcp_like, ("load",), "dcp.")
    assert torch_like.load("ckpt.pt") == "state" and torch_like.load.__elastic_sim_op__ == "torch.load"
    torch_like.load("more.pt")  # within the gap: held back
    first = {"event": "load", "n": 1, "seconds": 0.1, "op": "torch.load", "path": os.path.abspath("ckpt.pt")}
    assert records == [first]
    probe.on_pg_ready(0.05)  # what was held back goes first: the total before the group is exact
    assert records[1:] == [
        {"event": "load", "n": 2, "seconds": 0.2, "op": "torch.load", "path": os.path.abspath("more.pt")},
        {"event": "pg_ready", "seconds": 0.05},
    ]
    probe._clock.now += instrument.LOAD_RECORD_GAP_S
    dcp_like.load()
    assert records[-1] == {"event": "load", "n": 3, "seconds": pytest.approx(0.5), "op": "dcp.load"}
    probe.on_step(FakeOptimizer(), (), {})
    torch_like.load("after.pt")  # after the first step: not a recovery's load, not timed
    probe.at_exit()
    assert [r["event"] for r in records[4:]] == ["step", "exit"]


def test_a_script_that_never_steps_writes_its_loads_before_a_collective_at_most_once_a_gap():
    records: list = []
    probe = probe_writing_to(records)
    loads = FakeLoads(probe._clock, 0.1)
    probe.wrap_loads(loads, ("load",), "torch.")
    loads.load()
    loads.load()  # held back
    probe.on_collective("all_reduce")  # within the gap: still held back
    probe._clock.now += instrument.LOAD_RECORD_GAP_S
    probe.on_collective("all_reduce")
    assert [(r["event"], r.get("n")) for r in records] == [("load", 1), ("activity", None), ("load", 2)]


def test_init_process_group_is_wrapped_where_it_is_held_by_name():
    records: list = []
    probe = probe_writing_to(records)

    def init_process_group(backend=None, **kwargs):
        probe._clock.now += 0.75
        return backend

    holders = [type("Module", (), {"init_process_group": staticmethod(init_process_group)})() for _ in range(2)]
    other = type("Module", (), {"init_process_group": staticmethod(lambda: None)})()  # someone else's: left alone
    probe.wrap_pg_init([*holders, other])
    assert holders[0].init_process_group is holders[1].init_process_group
    assert holders[1].init_process_group("gloo") == "gloo"
    assert records == [{"event": "pg_ready", "seconds": 0.75}]
    assert other.init_process_group() is None and len(records) == 1


WAY_SCRIPT = """
import sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

torch.save({"w": torch.ones(2)}, sys.argv[1] + "/plain.pt")
dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/store", rank=0, world_size=1)
state = torch.load(sys.argv[1] + "/plain.pt")
dcp.save({"w": torch.ones(2)}, checkpoint_id=sys.argv[1] + "/dcp")
restored = {"w": torch.zeros(2)}
dcp.load(restored, checkpoint_id=sys.argv[1] + "/dcp")
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(restored["w"]).sum().backward()
optimizer.step()
dist.destroy_process_group()
print("ok")
"""


def test_a_real_worker_records_its_way_to_the_first_step(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    result = run_as_worker(tmp_path, WAY_SCRIPT, str(tmp_path), SIM_EVENTS_DIR=str(events))
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr[-3000:]
    records = side_channel(events)
    way = [r["event"] for r in records if r["event"] in ("start", "imported", "pg_ready", "load", "step")]
    assert way == ["start", "imported", "pg_ready", "load", "load", "step"], way
    assert [r["t"] for r in records] == sorted(r["t"] for r in records)
    pg_ready = next(r for r in records if r["event"] == "pg_ready")
    assert 0 < pg_ready["seconds"] < 60
    loads = [r for r in records if r["event"] == "load"]
    # torch.load, then dcp.load (its own reads inside it not counted again)
    assert [(r["n"], r["op"]) for r in loads] == [(1, "torch.load"), (2, "dcp.load")]
    assert 0 < loads[0]["seconds"] <= loads[1]["seconds"]


# --------------------------------------------------------------------------- compound faults


def test_a_fault_in_another_s_regroup_is_timed_from_its_own_strike_and_marked():
    """node1's worker killed at step 12; 1 s later, before the new round started, node0's worker too; one round
    restarts both. Each recovery runs from its own fault to the first step of that round, and the second is
    marked as struck during the first one's regroup (in the recovery, the report's table and the timeline)."""
    from sim.verdict.timeline import build_timeline

    b = HistoryBuilder(nodes=2, nproc=1, steps=30)
    b.start_workers()
    b.train(12)
    b.fault("kill-worker", "node1", take_s=0.4, node="node1")
    b.add(type="agent", node="node1", event="worker_failed", exitcode=-9, local_rank=0, pid=1)
    b.wait(1.0)
    b.fault("kill-worker", "node0", take_s=0.4, node="node0")
    b.group_failure()
    b.wait(2.0)
    b.start_workers(resumed_from=10)
    b.train(30)
    b.finish()
    run = b.model()
    first, second = (r.public() for r in recoveries(run))
    assert first.struck_during is None and first.regroup_cut_by == "kill-worker node0"
    assert second.struck_during == "kill-worker node1" and second.regroup_cut_by is None
    assert first.t_recovered == second.t_recovered
    assert first.recovery_s == pytest.approx(second.recovery_s + (second.t_fault - first.t_fault), abs=1e-3)
    text = format_summary(b.verdict(), run, title="t", profile="fast")
    assert "struck during kill-worker node1's regroup" in text and "regroup cut by kill-worker node0" in text
    spans = build_timeline(run, b.verdict()).faults
    assert spans[1].outcome.startswith("struck during kill-worker's regroup; recovered in")


def test_a_worker_kill_whose_regroup_a_node_loss_cut_never_recovered():
    """The captured compound run (tests/data/runs/lost_before_ranks): the steps still in flight 0.15 s after the
    worker kill are not its recovery (the old figure: "recovered in 0.1 s"); node0's loss struck during its regroup,
    and the scale-up during node0's."""
    from pathlib import Path

    from sim.core.history import History
    from sim.verdict.runmodel import RunModel

    folder = Path(__file__).resolve().parent.parent / "data" / "runs" / "lost_before_ranks"
    run = RunModel(History(folder / "history.jsonl").read().records)
    worker, node, scale = (r.public() for r in recoveries(run))
    assert (worker.recovery_s, worker.struck_during, worker.regroup_cut_by) == (None, None, "kill-node node0")
    assert (node.recovery_s, node.struck_during, node.regroup_cut_by) == (None, "kill-worker node1", "scale nodes=4")
    assert (scale.recovery_s, scale.struck_during) == (None, "kill-node node0")
