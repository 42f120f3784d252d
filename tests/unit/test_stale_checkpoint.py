"""Zombie workers (split brain) and the checkpoints they write: the freeze-during-checkpoint fault with a
fake provider, the instrumentation's "save" records from a real torch, and the stale_checkpoint checker
and its diagnosis on hand-written histories, one per branch."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sim.core.errors import UsageError
from sim.core.history import as_records
from sim.engines.docker import ExecResult
from sim.faults import nodescripts
from sim.faults.catalog import FAULTS
from sim.verdict import StaleCheckpointMetrics
from sim.verdict.checkers import RunSpec, check_all, check_stale_checkpoint, stale_writes
from sim.verdict.diagnoses.registry import diagnose
from sim.verdict.runmodel import RunModel
from tests.unit.histories import HistoryBuilder, ScriptRun
from tests.unit.test_instrument import run_as_worker, side_channel
from tests.unit.test_nemesis import nemesis, state_home  # noqa: F401 (fixtures)

# --- the fault ---------------------------------------------------------------------------------

CAUGHT = {"pid": 40, "file": "/ckpt/ckpt-00000020.pt.tmp.40", "size_at_kill": 4096}


def test_freeze_during_checkpoint_stops_the_writer_then_pauses_the_node_and_heal_undoes_both(nemesis):  # noqa: F811
    nem, fake = nemesis
    fake.answers = {nodescripts.KILL_IN_WRITE: ExecResult(0, json.dumps(CAUGHT), "")}
    result = nem.freeze_during_checkpoint("node0", within=5)
    assert (result["id"], result["node"], result["pid"], result["file"]) == (
        "freeze-node0",
        "node0",
        40,
        CAUGHT["file"],
    )
    (watched,) = [i for i, c in enumerate(fake.calls) if c[0] == "exec" and nodescripts.KILL_IN_WRITE in c[2]]
    assert fake.calls[watched][2][-4:-1] == ["/ckpt", "5", str(int(signal.SIGSTOP))]  # stopped, not killed
    assert fake.calls[watched][2][-1] == "elastic-sim-act=freeze-node0"  # heal ends it if our call is cut
    assert fake.calls.index(("pause", "id-node0")) > watched  # then the whole node freezes
    assert [f.id for f in nem.active()] == ["freeze-node0"]
    with pytest.raises(UsageError, match="already frozen"):
        nem.freeze_during_checkpoint("node0", within=5)

    fake.paused.add("node0")  # what Docker did
    fake.unpause = lambda cid: (fake.calls.append(("unpause", cid)), fake.paused.discard(cid.removeprefix("id-")))
    nem.heal("freeze-node0")
    unpaused = fake.calls.index(("unpause", "id-node0"))
    assert ("exec", "id-node0", ["kill", "-CONT", "40"], None) in fake.calls[unpaused:]  # then the writer goes on
    assert nem.active() == []
    phases = [(r.fault, r.phase) for r in nem.history.records()]
    assert ("freeze-during-checkpoint", "ok") in phases and phases[-1] == ("heal", "ok")


def test_freeze_during_checkpoint_is_a_reversible_catalog_fault_undone_by_heal():
    fault = FAULTS["freeze-during-checkpoint"]
    assert fault.reversible and fault.undo_verb == "heal" and fault.verb == ("freeze-during-checkpoint",)
    assert fault.option_names == ("target", "dir", "within")
    assert fault.make_options({}).target == "rank0"


def test_a_write_that_never_comes_pauses_nothing(nemesis):  # noqa: F811
    nem, fake = nemesis
    fake.answers = {nodescripts.KILL_IN_WRITE: ExecResult(4, "", "no worker opened a file under /ckpt/ for writing")}
    with pytest.raises(Exception, match="no worker opened a file"):
        nem.freeze_during_checkpoint("node0", within=5)
    assert not any(c[0] == "pause" for c in fake.calls) and nem.active() == []


# --- the instrumentation's save records, from a real torch ------------------------------------

SAVING = """
import io, os, sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
folder = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.Adam(model.parameters())
first = os.path.join(folder, "checkpoint.pt")
if os.path.exists(first):
    torch.load(first)
for _ in range(3):
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
torch.save({"m": model.state_dict()}, io.BytesIO())  # into memory: no checkpoint
tmp = f"{first}.tmp.{os.getpid()}"
with open(tmp, "wb") as f:  # an open file: its name is the path
    torch.save({"m": model.state_dict()}, f)
os.replace(tmp, first)  # the atomic write: the record names checkpoint.pt too
os.replace(first, first)  # not the file just saved any more: nothing
dcp.save({"m": model.state_dict()}, checkpoint_id=os.path.join(folder, "dcp"))
print("saved")
dist.destroy_process_group()
"""


def test_saves_to_a_named_file_are_recorded_with_path_times_and_step_and_loads_name_their_file(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    for _ in range(2):  # the second run loads checkpoint.pt first
        result = run_as_worker(tmp_path, SAVING, str(tmp_path), SIM_EVENTS_DIR=str(events))
        assert (result.returncode, result.stdout) == (0, "saved\n"), result.stderr[-3000:]
    records = side_channel(events)
    saves = [r for r in records if r["event"] == "save"]
    first = str(tmp_path / "checkpoint.pt")
    assert [(r["op"], r["path"].split("/")[-1].split(".tmp.")[0]) for r in saves[:3]] == [
        ("torch.save", "checkpoint.pt"),
        ("os.replace", "checkpoint.pt"),
        ("dcp.save", "dcp"),
    ]
    assert saves[1]["path"] == first and saves[0]["path"].startswith(first + ".tmp.")
    assert len(saves) == 6, "two runs, three saves each: the buffer and the second replace wrote none"
    for save in saves:
        assert save["began"] <= save["t"] and save["seconds"] >= 0 and save["rank"] == 2
        assert (save["step"], save["n"]) == (3, 3)  # Adam's own step count, and this process's steps
    loads = [r for r in records if r["event"] == "load"]
    assert [r["path"] for r in loads] == [first]  # only the second run loaded, before its first step
    assert as_records([{**r, "type": "worker"} for r in saves + loads])  # the history's schema takes them


# --- the checker and its diagnosis -------------------------------------------------------------


def trainer_zombie(write_step: int | None, new_round_until: int, resume_step: int) -> HistoryBuilder:
    """Three nodes; node0 (rank 0) freezes inside its step-20 write; node1 and node2 regroup from step 10 and
    train to `new_round_until`; woken, node0's old worker writes ckpt-`write_step`; then all three regroup
    and resume from `resume_step`."""
    run = HistoryBuilder(nodes=3, nproc=1, steps=80, min_nodes=2)
    run.start_workers()
    run.train(19)
    file = "/ckpt/ckpt-00000020.pt.tmp.9"
    run.fault("freeze-during-checkpoint", "rank0", id="freeze-node0", node="node0", pid=9, file=file)
    run.wait(20)
    run.group_failure(["node1", "node2"])
    run.start_workers(resumed_from=10, nodes=["node1", "node2"])
    run.train(new_round_until)
    run.fault("heal", "freeze-node0", take_s=0.2, healed=["freeze-node0"])
    if write_step is not None:
        run.trainer("node0", 0, 0, 3, "checkpoint", step=write_step, path=f"/ckpt/ckpt-{write_step:08d}.pt")
    run.wait(3)
    run.group_failure()
    run.start_workers(resumed_from=resume_step)
    run.train(80)
    run.finish()
    return run


def test_no_stale_write_passes_and_says_so():
    run = HistoryBuilder(nodes=2, nproc=1, steps=30)
    run.start_workers()
    run.train(30)
    run.finish()
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid and result.measured
    assert result.reasons == ("no checkpoint written by a superseded round (3 writes seen)",)


def test_no_checkpoint_seen_is_not_measurable():
    run = ScriptRun(nodes=2)
    run.start_workers()
    run.train(5)
    run.finish()
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid and not result.measured and "no checkpoint write was seen" in result.reasons[0]


def test_a_step_numbered_stale_write_over_the_same_step_loses_nothing():
    run = trainer_zombie(write_step=20, new_round_until=45, resume_step=40)
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid and result.metrics == StaleCheckpointMetrics(stale_writes=1, lost=0)
    (reason,) = result.reasons
    assert reason.startswith("node0 rank 0 of a superseded round (world 3, restart 0) wrote /ckpt/ckpt-00000020.pt")
    assert "after the round of world 2 on node1, node2 had started at" in reason
    assert "replaced the newer round's /ckpt/ckpt-00000020.pt (step 20), written at" in reason
    assert reason.endswith("nothing lost (the newer round's checkpoint of that name held the same step)")
    assert not [d for d in diagnose(run.model(), {}) if d.code == "superseded-round-checkpoint"]
    assert check_stale_checkpoint(run.model(), run.spec()).valid and run.verdict().result("stale_checkpoint").valid


def test_a_frozen_write_that_never_landed_is_named():
    # The trainer's newer rank 0 removes temp files of writers killed mid-write: the zombie's rename fails.
    run = trainer_zombie(write_step=None, new_round_until=45, resume_step=40)
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid and result.metrics == StaleCheckpointMetrics(stale_writes=0, lost=0)
    assert result.reasons[1] == (
        "freeze-during-checkpoint rank0 (node0) at 22:13:42 held /ckpt/ckpt-00000020.pt.tmp.9 open: that write "
        "never completed (a superseded round's write that did not land)"
    )
    landed = trainer_zombie(write_step=20, new_round_until=45, resume_step=40)
    assert len(check_stale_checkpoint(landed.model(), landed.spec()).reasons) == 1


def test_a_stale_write_of_a_name_nobody_newer_wrote_loses_nothing():
    run = trainer_zombie(write_step=20, new_round_until=15, resume_step=10)
    # The new round had not reached step 20, and the last resume went from step 10: the stale file unused.
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid, result.reasons
    assert result.reasons[0].endswith("nothing lost (no newer checkpoint had that name, and no later resume loaded it)")


def test_a_stale_write_a_later_resume_loaded_fails():
    run = trainer_zombie(write_step=20, new_round_until=15, resume_step=20)
    result = check_stale_checkpoint(run.model(), run.spec())
    assert not result.valid and result.metrics.lost == 1
    assert "loaded it: the job went back to the superseded round's state" in result.reasons[0]
    assert "(node0 rank 0) loaded it" in result.reasons[0]


def script_zombie(
    steps_known: bool = True, name: str = "checkpoint.pt", reload: bool = True, rewrite: bool = False
) -> ScriptRun:
    """A plain script that saves /ckpt/`name` every 10 steps: node0 (rank 0) freezes in its step-20 save, the
    others go on from step 10 to 30 (writing it at 20 and 30); woken, node0's old worker renames its step-20
    state onto it (and, with `rewrite`, the newer round saves again at step 40 before it notices); all three
    restart and (when `reload`) load it."""
    run = ScriptRun(nodes=3, absolute_steps=steps_known)
    run.start_workers()

    def save(worker, step):
        path = f"/ckpt/{name.format(step=step)}"
        run.add(type="worker", event="save", op="os.replace", path=path, began=run.t - 0.1, seconds=0.1,
                step=step if steps_known else None, n=step, **worker)  # fmt: skip

    for until in (10, 19):
        run.train(until)
        if until == 10:
            save(run.workers[0], 10)
    old_rank0 = run.workers[0]
    run.fault("freeze-during-checkpoint", "rank0", id="freeze-node0", node="node0", pid=old_rank0["pid"])
    run.wait(20)
    run.group_failure(["node1", "node2"])
    run.start_workers(resumed_from=10, nodes=["node1", "node2"])
    for until in (20, 30):
        run.train(until)
        save(run.workers[0], until)
    run.wait(2)
    run.fault("heal", "freeze-node0", take_s=0.2, healed=["freeze-node0"])
    save(old_rank0, 20)
    if rewrite:
        run.train(40)
        save(run.workers[0], 40)
    run.wait(3)
    run.group_failure()
    run.start_workers(resumed_from=40 if rewrite else 20)
    if reload:
        for worker in run.workers:
            run.add(type="worker", event="load", n=1, seconds=0.1, op="torch.load", path=f"/ckpt/{name}", **worker)
    run.train(40)
    run.finish()
    return run


def test_a_fixed_name_overwritten_by_a_stale_write_fails_naming_the_newer_checkpoint():
    run = script_zombie()
    result = check_stale_checkpoint(run.model(), run.spec())
    assert not result.valid and result.metrics == StaleCheckpointMetrics(stale_writes=1, lost=1)
    (reason,) = result.reasons
    assert "node0 rank 0 of a superseded round (world 3, restart 0) wrote /ckpt/checkpoint.pt (step 20)" in reason
    assert "it replaced the newer round's /ckpt/checkpoint.pt (step 30), written at" in reason
    assert "by node1 rank 0: 10 steps of newer state silently lost" in reason
    assert "loaded it: the job went back to the superseded round's state" in reason
    assert not run.verdict().valid
    (found,) = [d for d in diagnose(run.model(), {}) if d.code == "superseded-round-checkpoint"]
    assert found.title == "A checkpoint from a superseded round replaced newer state (node0)"
    assert "step-numbered" in found.fix and "rename" in found.fix and "round" in found.fix
    assert any("the newer round's rank 0 had written it" in line for line in found.evidence)


def test_an_overwrite_without_step_numbers_fails_as_newer_state_lost():
    run = script_zombie(steps_known=False, reload=False)
    (stale,) = stale_writes(run.model())
    assert stale.lost and stale.loaded_by is None and stale.step is None
    assert stale.describe().split("written at ")[1].endswith("by node1 rank 0: newer state silently lost")


def test_a_stale_save_under_a_name_of_its_own_loses_nothing():
    run = script_zombie(name="step-{step}.pt", reload=False)
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid and result.metrics == StaleCheckpointMetrics(stale_writes=1, lost=0)
    assert "wrote /ckpt/step-20.pt (step 20)" in result.reasons[0]


def test_a_stale_overwrite_the_newer_round_wrote_again_before_any_resume_loses_nothing():
    run = script_zombie(rewrite=True)
    result = check_stale_checkpoint(run.model(), run.spec())
    assert result.valid and result.metrics == StaleCheckpointMetrics(stale_writes=1, lost=0)
    (reason,) = result.reasons
    assert "it replaced the newer round's /ckpt/checkpoint.pt (step 30)" in reason
    assert "; the newer round wrote it again at " in reason
    assert reason.endswith("nothing lost (overwritten before any resume loaded it)")


def test_a_real_zombie_rank0_of_a_fixed_name_script_fails_stale_checkpoint():
    """A real zombie-fixed-name.yaml run on etcd-v2 (tests/scripts/fixed_name_ckpt.py; history without the
    instrumentation's step records): woken rank 0 of the superseded round renamed step 400 onto checkpoint.pt
    over the newer round's step 600, and the next resume loaded it. The job itself finished."""
    path = Path(__file__).resolve().parents[1] / "data" / "runs" / "zombie_fixed_name" / "history.jsonl"
    run = RunModel(json.loads(line) for line in path.read_text().splitlines())
    stale = check_stale_checkpoint(run, RunSpec.from_run(run))
    assert not stale.valid
    assert "wrote /ckpt/checkpoint.pt (step 400)" in stale.reasons[0]
    assert "replaced the newer round's /ckpt/checkpoint.pt (step 600)" in stale.reasons[0]
    assert "200 steps of newer state silently lost" in stale.reasons[0]
    assert "superseded-round-checkpoint" in [d.code for d in diagnose(run, {})]
    assert check_all(run, RunSpec.from_run(run), only=run.scenario.checkers).valid  # the job recovered
