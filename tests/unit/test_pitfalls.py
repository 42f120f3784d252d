"""The job's own pitfalls (sim/verdict/pitfalls.py) and `sim vet`'s scoring, on captured real runs
(tests/data/runs/)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch

from sim.core.spec import spec_from_options
from sim.scenarios.runner import ScenarioResult
from sim.verdict.diagnoses.registry import diagnose
from sim.verdict.runmodel import RunModel
from sim.vet.gauntlet import plan_vet, score_gauntlet, vet_spec

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
NODE_DIR = Path(__file__).resolve().parents[2] / "images" / "node"
sys.path.insert(0, str(NODE_DIR))
import elastic_sim_instrument as instrument  # noqa: E402


def _history(case: str) -> list[dict]:
    return [json.loads(line) for line in (RUNS / case / "history.jsonl").read_text().splitlines()]


def test_the_tutorial_snapshot_is_node_local_and_the_joiner_resumed_from_nothing():
    """`sim vet tests/scripts/tutorial_snapshot.py --faults kill-worker,scale-up -- 100000 5` (etcd-v2, 3 nodes):
    each node's local rank 0 saved /home/sim/snapshot.pt; node2, removed and added again, found none."""
    found = diagnose(_history("vet_tutorial_scale_up"), {})
    codes = [d.code for d in found]
    assert codes[:3] == ["node-local-checkpoint", "resumed-apart", "missing-optimizer-state"]
    local, apart, missing = found[:3]
    assert "/home/sim/snapshot.pt" in local.cause and len(local.evidence) == 3
    assert [e.split()[0] for e in local.evidence] == ["node0", "node1", "node2"]
    # One name on every node, each its own node's copy: which save wrote it (none knows its step) tells them apart.
    assert re.search(r"rank 0 loaded /home/sim/snapshot.pt \(written by node0 at [\d:.]+\)$", apart.evidence[0])
    assert apart.evidence[2].startswith("node2") and apart.evidence[2].endswith("loaded nothing: it started afresh")
    assert "MODEL_STATE: OrderedDict" in missing.evidence[0] and "optimizer.state_dict()" in missing.fix


def test_a_shared_checkpoint_with_optimizer_state_has_none_of_these_pitfalls():
    """fixed_name_ckpt.py (rank 0 saves model + optimizer to /ckpt) through kill-worker and restart-node."""
    codes = [d.code for d in diagnose(_history("vet_fixed_name"), {})]
    assert not {"node-local-checkpoint", "resumed-apart", "missing-optimizer-state"} & set(codes)


def test_the_vet_fails_the_scale_up_naming_the_pitfalls_first_and_passes_the_worker_crash():
    spec = spec_from_options({"nodes": 3, "nproc_per_node": 1, "script": "tests/scripts/tutorial_snapshot.py"}, None)
    kinds = ("kill-worker", "scale-up")
    plan = plan_vet(vet_spec(spec, kinds, restarts_given=False), kinds, chosen=True)
    result = ScenarioResult("vet", "etcd-v2", "recovers", None, "", RUNS / "vet_tutorial_scale_up", 0)
    worker, scale = score_gauntlet(plan, result)
    assert worker.outcome == "survived" and worker.recovery_s and worker.restarts == 1
    assert scale.outcome == "failed" and "rank 2 loaded nothing (started afresh)" in scale.why
    assert [d["code"] for d in scale.diagnoses][:2] == ["node-local-checkpoint", "resumed-apart"]
    assert worker.phases["detection_s"] is not None


def test_ranks_that_loaded_the_same_files_did_not_resume_apart():
    run = RunModel(_history("vet_fixed_name"))
    from sim.verdict.pitfalls import mixed_sources, resume_sources

    assert not any(mixed_sources(g) for g in resume_sources(run))


def test_the_first_save_describes_what_the_checkpoint_holds():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    full = instrument.saved_content({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3})
    assert full["model_state"] and full["optimizer_state"]
    assert full["keys"] == {"model": "OrderedDict", "optimizer": "dict", "step": "int"}
    only_model = instrument.saved_content(model.state_dict())
    assert only_model["model_state"] and not only_model["optimizer_state"]
    assert instrument.saved_content([1, 2]) == {"type": "list"}


def test_the_vet_names_the_jobs_pitfalls_whatever_the_outcomes():
    from sim.vet.gauntlet import VetResult, job_pitfalls, scorecard

    pitfalls = job_pitfalls(RUNS / "vet_tutorial_scale_up")
    assert [d["code"] for d in pitfalls] == ["node-local-checkpoint", "resumed-apart", "missing-optimizer-state"]
    text = scorecard(VetResult("t.py", "etcd-v2", 3, 1, (), (), 1.0, None, tuple(pitfalls)))
    assert "pitfall of the job: Checkpoint without optimizer state." in text


def test_a_job_that_ends_before_the_gauntlet_is_done_is_reported_with_the_faults_it_never_reached():
    spec = spec_from_options({"nodes": 3, "nproc_per_node": 1, "script": "tests/scripts/tutorial_snapshot.py"}, None)
    kinds = ("kill-worker", "scale-up", "restart-node")
    plan = plan_vet(vet_spec(spec, kinds, restarts_given=False), kinds, chosen=True)
    why = "the job ended before the trigger recovered=3 of step 'restart-node' (line 0) was reached"
    result = ScenarioResult("vet", "etcd-v2", "recovers", None, "", RUNS / "vet_tutorial_scale_up", 0, why)
    worker, scale, restart = score_gauntlet(plan, result)
    assert worker.outcome == "survived"
    assert scale.outcome == "failed" and "not steady again after it" in scale.why
    assert restart.outcome == "not reached" and restart.why == why and not restart.ok


def test_the_default_gauntlet_of_a_real_run_is_scored_fault_by_fault():
    """bench/vet_time.py's gauntlet: fixed_name_ckpt.py (0.1 s step, 10 s process-group timeout), 3 nodes x 1,
    etcd-v2; every fault fired once the job was steady again (etcd-restart ran on a cluster of its own)."""
    from sim.vet.gauntlet import DEFAULT_GAUNTLET, prepare

    options = {"script": "tests/scripts/fixed_name_ckpt.py", "rdzv_backend": "etcd-v2"}
    spec, kinds = prepare(options, ["--pg-timeout", "10"], None)
    plan = plan_vet(spec, kinds, chosen=False)
    scores = score_gauntlet(plan, ScenarioResult("vet", "etcd-v2", "recovers", None, "", RUNS / "vet_gauntlet", 0))
    by_kind = {s.kind: s for s in scores}
    assert set(by_kind) == set(DEFAULT_GAUNTLET) - {"etcd-restart"}
    assert by_kind["store-host-loss"].outcome == "not applicable"
    survived = [k for k, s in by_kind.items() if s.outcome == "survived"]
    assert len(survived) == 14, {k: (s.outcome, s.why) for k, s in by_kind.items()}
    # The lossy link is recorded as the nemesis' "link"; it slows training, nothing to recover from.
    assert by_kind["netem"].recovery_s is None and by_kind["netem"].steps_lost == 0
    assert by_kind["pause"].recovery_s > 10 and by_kind["kill-worker"].phases["detection_s"] is not None
    assert by_kind["scale-up"].restarts == 0 and by_kind["fill-disk"].restarts == 1


def test_a_writable_mount_of_one_host_folder_counts_as_shared_storage():
    """--mount HOST:/shared:rw puts one host folder in every node: a checkpoint there is not node-local."""
    from sim.verdict.pitfalls import _shared_dirs
    from sim.verdict.runmodel import RunModel

    start = {
        "t": 1.0,
        "type": "run",
        "event": "start",
        "spec": {"mounts": [["/h/data", "/data", False], ["/h/shared", "/shared", True]]},
    }
    run = RunModel([start])
    assert _shared_dirs(run) == ("/ckpt", "/shared")
    assert _shared_dirs(RunModel([{"t": 1.0, "type": "run", "event": "start", "spec": {}}])) == ("/ckpt",)


def _probe(records: list):
    return instrument.WorkerProbe(lambda event, **fields: records.append({"event": event, **fields}) or True)


def test_the_first_save_tells_scheduler_and_scaler_state_apart():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    scaler = torch.amp.GradScaler("cpu")
    full = instrument.saved_content(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
        }
    )
    assert full["scheduler_state"] and full["scaler_state"]
    bare = instrument.saved_content({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    assert not bare["scheduler_state"] and not bare["scaler_state"]


def test_a_scheduler_and_a_scaler_constructed_are_recorded_once_each():
    records: list = []
    probe = _probe(records)

    class Scheduler:
        def __init__(self, optimizer):
            self.optimizer = optimizer

    class StepLike(Scheduler):
        def __init__(self, optimizer):
            super().__init__(optimizer)

    probe.wrap_uses(Scheduler, "lr_scheduler")
    StepLike(None), StepLike(None), Scheduler(None)
    assert records == [{"event": "uses", "what": "lr_scheduler", "cls": "StepLike"}]


def test_a_sampler_records_its_epoch_at_powers_of_two_and_when_it_changes():
    from torch.utils.data.distributed import DistributedSampler

    records: list = []
    probe = _probe(records)
    sampler = DistributedSampler(list(range(8)), num_replicas=2, rank=0, shuffle=True)
    for _ in range(5):
        probe.on_sampler_iter(sampler)  # set_epoch never called
    sampler.set_epoch(1)
    probe.on_sampler_iter(sampler)
    assert [(r["iterations"], r["epoch"]) for r in records] == [(1, 0), (2, 0), (4, 0), (6, 1)]
    assert all(r["shuffle"] and r["sampler"] == 0 for r in records)


def test_replicas_fingerprint_equal_when_in_step_and_apart_when_not():
    records: list = []
    probe = _probe(records)
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 2)
    b = torch.nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    probe.write_params(torch.optim.SGD(a.parameters(), lr=0.1))
    probe.write_params(torch.optim.SGD(b.parameters(), lr=0.1))
    with torch.no_grad():
        b.weight[0, 0] += 1e-6
    probe.write_params(torch.optim.SGD(b.parameters(), lr=0.1))
    prints = [r["fingerprint"] for r in records]
    assert prints[0] == prints[1] != prints[2] and records[0]["numel"] == 10 and not probe.off


def test_an_unexplained_fault_carries_each_nodes_last_records():
    """late_join_at_end: node2's agent got RendezvousClosedError; its last records are what the user sees."""
    from sim.core.history import History
    from sim.core.nodes import node_order
    from sim.vet.gauntlet import FaultScore, VetResult, junit_xml, last_records, scorecard

    records = History(RUNS / "late_join_at_end" / "history.jsonl").read().records
    lines = last_records(records, float("-inf"), float("inf"))
    nodes = [line.split()[0] for line in lines]
    assert nodes == sorted(nodes, key=node_order) and {"node0", "node1", "node2"} <= set(nodes)
    assert max(nodes.count(n) for n in set(nodes)) == 3 and all(len(line) <= 160 for line in lines)
    score = FaultScore("scale-up", "a node joins", "failed", "trains on", "why not", evidence=tuple(lines))
    text = scorecard(VetResult("t.py", "etcd-v2", 3, 1, (score,), (), 1.0))
    assert "unexplained; each node's last records:" in text and lines[-1][:60] in text
    assert lines[0] in junit_xml(VetResult("t.py", "etcd-v2", 3, 1, (score,), (), 1.0))


def test_the_per_rank_checkpoint_shows_five_pitfalls_of_its_own():
    """tests/scripts/rank-ckpt-preempt-rank0.yaml (etcd-v2, 3 nodes): rank_ckpt.py saves /ckpt/rank{RANK}.pt
    (model and Adam, not its StepLR nor its GradScaler), never calls set_epoch, saves nothing on SIGTERM; node0
    (rank 0) preempted at step 37, node1 and node2 regrouped as ranks 0 and 1; node0 back, node2 became rank 2
    again and loaded its own step-20 rank2.pt while the others loaded step 60's."""
    found = {d.code: d for d in diagnose(_history("rank_ckpt_preempt"), {})}
    scheduler, scaler = found["missing-scheduler-state"], found["missing-scaler-state"]
    assert "StepLR" in scheduler.cause and "constructed a StepLR" in scheduler.evidence[0]
    assert "{model: OrderedDict, optimizer: dict, step: int}" in scheduler.evidence[1]
    assert "scheduler.load_state_dict(checkpoint['scheduler'])" in scheduler.fix
    assert "GradScaler" in scaler.cause and "scaler.state_dict()" in scaler.fix
    sampler = found["sampler-epoch-fixed"]
    assert [e.split()[0] for e in sampler.evidence] == ["node0", "node1", "node2"]
    assert all("its epoch always 0" in e for e in sampler.evidence) and "set_epoch(epoch)" in sampler.fix
    paths = found["rank-derived-paths"]
    assert paths.evidence[0].startswith("node0") and paths.evidence[0].endswith("rank 0 saved /ckpt/rank0.pt")
    assert paths.evidence[1].startswith("node1") and "was rank 1 before the regroup" in paths.evidence[1]
    diverged = found["replicas-diverged"]
    assert diverged.evidence[0].startswith("rank(s) 0, 1 (node0, node1)")
    assert diverged.evidence[1].startswith("rank(s) 2 (node2)")
    sigterm = found["no-save-on-sigterm"]
    assert "node0's preemption (a 5.0 s grace period) lost 17 steps" in sigterm.cause
    assert sigterm.evidence[1].endswith("17 steps lost") and "every 20 steps" in sigterm.evidence[2]
    assert "signal.SIGTERM" in sigterm.fix


def test_a_job_without_these_pitfalls_is_not_named_for_them():
    """The tutorial calls set_epoch and has no scheduler; fixed_name_ckpt.py saves one shared file from rank 0 and
    survived its preemption-free faults: none of the new pitfalls is named."""
    new = {
        "missing-scheduler-state",
        "missing-scaler-state",
        "sampler-epoch-fixed",
        "rank-derived-paths",
        "replicas-diverged",
        "no-save-on-sigterm",
    }
    for case in ("vet_tutorial_scale_up", "vet_fixed_name", "vet_gauntlet", "nccl_dead_peer"):
        assert not new & {d.code for d in diagnose(_history(case), {})}, case


def test_the_vet_lists_the_new_pitfalls_among_the_jobs_own():
    from sim.vet.gauntlet import job_pitfalls

    codes = [d["code"] for d in job_pitfalls(RUNS / "rank_ckpt_preempt")]
    for code in ("missing-scheduler-state", "sampler-epoch-fixed", "rank-derived-paths", "replicas-diverged"):
        assert code in codes
    assert "no-save-on-sigterm" in codes


def test_fingerprints_a_reduction_order_apart_are_one_replicas():
    from sim.verdict.pitfalls import _close

    assert _close("-0.54358324222266674", "-0.54358324222266685")
    assert not _close("0.033817836549133062", "-0.26746568828821182") and not _close("0.5", "0.5000001")


def _worker(t: float, node: str, event: str, rank: int, pid: int, **fields) -> dict:
    return {"t": t, "type": "worker", "node": node, "event": event, "rank": rank, "world_size": 2, "pid": pid, **fields}


def _two_groups(first_saves: dict[int, dict], loads: dict[int, str]) -> list[dict]:
    """Two ranks train (pids 10, 11), save, and a second group (pids 20, 21) loads `loads` (rank: path)."""
    records = [{"t": 0.0, "type": "run", "event": "start", "spec": {"max_nodes": 2}}]
    for rank in (0, 1):
        records.append(_worker(1.0 + rank / 10, f"node{rank}", "start", rank, 10 + rank))
    for rank, save in first_saves.items():
        records.append(_worker(save.pop("t"), f"node{rank}", "save", rank, 10 + rank, **save))
    for rank in (0, 1):
        records.append(_worker(100.0 + rank / 10, f"node{rank}", "start", rank, 20 + rank))
        if loads.get(rank):
            records.append(_worker(101.0 + rank / 10, f"node{rank}", "load", rank, 20 + rank, path=loads[rank], n=0))
        records.append(_worker(102.0 + rank / 10, f"node{rank}", "step", rank, 20 + rank, n=1))
    return records


def _apart(records: list[dict]) -> bool:
    from sim.verdict.pitfalls import mixed_sources, resume_sources

    groups = resume_sources(RunModel(records))
    return any(mixed_sources(g) for g in groups)


def test_per_rank_files_of_one_save_round_are_one_point_and_of_two_rounds_are_not():
    """Each rank keeps its own file (/ckpt/rank0.pt, /ckpt/rank1.pt): loaded after one save round (the same
    optimizer step, or with no step known the same steps taken in one group) they are one point; files of
    different steps, or a file whose writing was never seen, are not."""
    per_rank = {0: "/ckpt/rank0.pt", 1: "/ckpt/rank1.pt"}

    def saves(step0, step1, n0=50, n1=50):
        return {
            0: {"t": 50.0, "path": per_rank[0], "step": step0, "n": n0},
            1: {"t": 50.1, "path": per_rank[1], "step": step1, "n": n1},
        }

    assert not _apart(_two_groups(saves(50, 50), per_rank))
    assert _apart(_two_groups(saves(50, 40), per_rank))
    assert not _apart(_two_groups(saves(None, None), per_rank))
    assert _apart(_two_groups(saves(None, None, n1=40), per_rank))
    assert _apart(_two_groups({0: saves(50, 50)[0]}, per_rank))  # rank 1's file: never seen written
    assert _apart(_two_groups(saves(50, 50), {0: per_rank[0]}))  # rank 1 started afresh


def test_one_node_local_name_of_two_save_rounds_is_two_points():
    """Each node's own snapshot.pt (one name, two files): written at different steps, the ranks resumed apart;
    one shared file is one point whoever wrote it."""
    local = "/home/sim/snapshot.pt"
    both = {0: local, 1: local}
    same = {0: {"t": 50.0, "path": local, "step": 50}, 1: {"t": 50.1, "path": local, "step": 50}}
    older = {0: {"t": 50.0, "path": local, "step": 50}, 1: {"t": 20.0, "path": local, "step": 20}}
    assert not _apart(_two_groups(same, both))
    assert _apart(_two_groups(older, both))
    shared = {0: {"t": 50.0, "path": "/ckpt/c.pt", "step": 50}}
    assert not _apart(_two_groups(shared, {0: "/ckpt/c.pt", 1: "/ckpt/c.pt"}))


def test_the_per_rank_checkpoint_resumed_apart_only_where_one_rank_loaded_an_older_round():
    """rank_ckpt_preempt: after the preemption node1 and node2 loaded rank0.pt and rank1.pt, both of the step-20
    save round (one point: no finding there, as there was before); after node0's return node2 loaded its own
    step-20 rank2.pt while the others loaded the latest round's files: resumed apart, that group only."""
    from sim.verdict.pitfalls import mixed_sources, resume_sources

    groups = resume_sources(RunModel(_history("rank_ckpt_preempt")))
    assert [mixed_sources(g) for g in groups] == [False, False, True]
    apart = {d.code: d for d in diagnose(_history("rank_ckpt_preempt"), {})}["resumed-apart"]
    assert any(
        e.startswith("node2") and e.endswith("rank 2 loaded /ckpt/rank2.pt (saved at step 20)") for e in apart.evidence
    )


def test_a_job_ending_fault_the_job_trained_through_is_scored_survived_not_hung():
    """`sim vet --engine swarm` (2026-12-05): etcd restarted behind the service's virtual IP, and the job trained on
    where torch's etcd-v2 agents end on Compose. The job survived it outright: never "the job hung"."""
    from sim.verdict.runfolder import judge
    from sim.vet.gauntlet import score_solo

    spec = spec_from_options({"nodes": 3, "nproc_per_node": 1, "script": "tests/scripts/fixed_name_ckpt.py"}, None)
    kinds = ("etcd-restart",)
    plan = plan_vet(vet_spec(spec, kinds, restarts_given=False), kinds, chosen=True)
    (planned,) = [f for f in plan.faults if f.solo]
    run = RunModel(_history("etcd_restart_swarm_trained_on"))
    verdict, _ = judge(run, {})
    assert not verdict.valid  # it was meant to end the job
    result = ScenarioResult("vet-solo", "etcd-v2", "fails", verdict, "", RUNS / "etcd_restart_swarm_trained_on", 0)
    score = score_solo(planned, result)
    assert score.outcome == "survived" and score.diagnoses == ()
    assert score.why == "trained on through it: the job did not end (node0, node1, node2 training at the run's end)"


def test_the_trained_through_diagnosis_explains_the_captured_fail_with_its_evidence():
    from sim.verdict.diagnoses.registry import DIAGNOSES

    found = diagnose(_history("etcd_restart_swarm_trained_on"), {})
    assert [d.code for d in found] == ["trained-through"]
    (d,) = found
    assert d.cause.startswith("restart-node etcd at ") and "did not hang" in d.cause
    assert len(d.evidence) == 4 and all("still training at step" in e for e in d.evidence[1:])
    assert any(rule.__name__ == "trained_through" for rule in DIAGNOSES)
    # A job that ended as expected, or hung, is not diagnosed so.
    assert "trained-through" not in [d.code for d in diagnose(_history("oom_worker"), {})]
    assert "trained-through" not in [d.code for d in diagnose(_history("hang_default_ddp"), {})]
