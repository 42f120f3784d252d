"""The checkers and the report on scripts that are not ours: hand-written histories of what the
instrumentation, a progress regex and torch's agents record for a plain third-party script."""

from sim.checkers import RunSpec, check_all
from sim.cluster import _training_started
from sim.report import build_timeline, format_summary
from sim.runmodel import RunModel

T0 = 1_700_000_000.0


class ScriptRun:
    """A plain script under sim: agents' events, Docker events and instrumentation records only."""

    def __init__(self, nodes=2, nproc=1, absolute_steps=False, log_progress=False, optimizer=True, losses=None):
        self.records, self.t = [], T0
        self.nodes = [f"node{i}" for i in range(nodes)]
        self.nproc = nproc
        self.absolute, self.log_progress, self.optimizer = absolute_steps, log_progress, optimizer
        self.losses = losses or (lambda step: 1.0 / step)
        self.restarts = {node: 0 for node in self.nodes}
        self.pid, self.workers, self.step = 100, [], 0
        self.add(type="run", event="start", profile="torch-defaults", target_steps=None, ckpt_interval=None,
                 spec={"name": "sim", "nodes": nodes, "min_nodes": 1, "max_nodes": nodes, "nproc_per_node": nproc,
                       "max_restarts": 3, "rdzv_backend": "etcd-v2", "script": "/u/train.py"})
        for node in self.nodes:
            self.add(type="docker", node=node, action="start")

    def add(self, **record):
        self.records.append({"t": self.t, **record})

    def wait(self, seconds):
        self.t += seconds

    def start_workers(self, resumed_from=0, nodes=None):
        nodes = nodes or self.nodes
        for rank, node in enumerate(nodes):
            self.add(type="agent", node=node, event="rdzv_complete", restart_count=self.restarts[node],
                     group_rank=rank, group_world_size=len(nodes), global_world_size=len(nodes) * self.nproc)
            self.add(type="agent", node=node, event="group_started")
        self.wait(2.0)
        world = len(nodes) * self.nproc
        self.workers = []
        for group_rank, node in enumerate(nodes):
            for local in range(self.nproc):
                self.pid += 1
                worker = dict(node=node, rank=group_rank * self.nproc + local, local_rank=local, world_size=world,
                              restart=self.restarts[node], pid=self.pid, run_id="r")
                self.workers.append(worker)
                self.add(type="worker", event="start", **worker)
        self.wait(1.0)
        for worker in self.workers:
            self.add(type="worker", event="activity", collectives=1, op="broadcast", **worker)
        self.step, self.n = resumed_from, 0

    def train(self, until, step_s=1.0):
        for step in range(self.step + 1, until + 1):
            self.wait(step_s)
            self.n += 1
            for worker in self.workers:
                if self.optimizer:
                    self.add(type="worker", event="step", n=self.n, step=step if self.absolute else None, **worker)
                else:
                    self.add(type="worker", event="activity", collectives=self.n + 1, op="all_reduce", **worker)
            if self.log_progress:
                self.add(type="worker", event="progress", source="log", node=self.workers[0]["node"], step=step,
                         loss=self.losses(step))
            self.step = step

    def kill_worker(self, node):
        self.add(type="fault", op="k1", fault="kill-worker", target=node, phase="invoke", args={})
        self.wait(0.3)
        self.add(type="fault", op="k1", fault="kill-worker", target=node, phase="ok", result={"node": node})
        self.wait(1.0)
        self.add(type="agent", node=node, event="worker_failed", exitcode=-9, local_rank=0, pid=1)
        for each in self.nodes:
            self.add(type="agent", node=each, event="group_failed", attempts_left=3 - self.restarts[each],
                     max_restarts=3)
            self.restarts[each] += 1
        self.wait(3.0)

    def finish(self):
        self.wait(0.5)
        for worker in self.workers:
            self.add(type="worker", event="exit", code=0, **worker)
        for node in self.nodes:
            self.add(type="agent", node=node, event="group_finished")
        self.wait(1.0)
        for node in self.nodes:
            self.add(type="docker", node=node, action="die", exit_code=0)
        self.add(type="run", event="end")

    def verdict(self, **overrides):
        return check_all(self.records, RunSpec.from_history(self.records, **overrides))


def _by_name(verdict):
    return {r.name: r for r in verdict.results}


def test_plain_sgd_script_recovers_timed_by_optimizer_steps():
    run = ScriptRun()
    run.start_workers()
    run.train(20)
    run.kill_worker("node1")
    run.start_workers()
    run.train(15)
    run.finish()
    verdict = run.verdict()
    results = _by_name(verdict)
    assert verdict.valid, [r for r in verdict.results if not r.valid]
    (recovery,) = verdict.recoveries
    # ok at +1.3 s after invoke; 4 s to the new group, 2 s to its workers, 1 s to init, 1 s to the first step.
    assert recovery.recovery_s == 8.0 and recovery.world_after == 2 and recovery.steps_lost is None
    assert recovery.throughput_before == 1.0 and recovery.throughput_after == 1.0
    assert results["completed"].measured and results["completed"].valid
    # SGD keeps no step count: a resume cannot be told from a fresh start, and the checker says so.
    assert not results["progress"].measured and "counted per worker process" in results["progress"].reasons[0]
    assert not results["loss_continuity"].measured and "--progress-regex" in results["loss_continuity"].reasons[0]
    assert results["recovery"].measured and "recovered in 8.0 s" in results["recovery"].reasons[0]
    assert verdict.restarts_per_node == {"node0": 1, "node1": 1}


def test_adam_script_gives_steps_lost_from_the_optimizer_state():
    run = ScriptRun(absolute_steps=True)
    run.start_workers()
    run.train(20)
    run.kill_worker("node0")
    run.start_workers(resumed_from=10)  # the script's own checkpoint was at step 10
    run.train(30)
    run.finish()
    verdict = run.verdict()
    (recovery,) = verdict.recoveries
    assert recovery.steps_lost == 10
    progress = _by_name(verdict)["progress"]
    assert progress.measured and progress.valid
    assert progress.metrics["step_source"] == "optimizer"
    assert progress.metrics["step_efficiency"] == round(30 / 40, 4)


def test_progress_regex_lines_judge_loss_and_steps():
    run = ScriptRun(log_progress=True, losses=lambda step: 1.0 / step)
    run.start_workers()
    run.train(20)
    run.kill_worker("node1")
    run.start_workers(resumed_from=10)
    run.losses = lambda step: 5.0  # a resume that lost its optimizer state: the loss jumps
    run.train(30)
    run.finish()
    verdict = run.verdict()
    results = _by_name(verdict)
    assert results["progress"].metrics["step_source"] == "script"
    assert verdict.recoveries[0].steps_lost == 10
    assert results["loss_continuity"].measured and not results["loss_continuity"].valid
    assert "loss jumped" in results["loss_continuity"].reasons[0]


def test_collectives_only_script_is_timed_by_collective_calls():
    run = ScriptRun(optimizer=False)
    run.start_workers()
    run.train(20)
    run.kill_worker("node1")
    run.start_workers()
    run.train(10)
    run.finish()
    verdict = run.verdict()
    assert verdict.valid
    (recovery,) = verdict.recoveries
    # The first collective of the new group (its broadcast) marks the recovery: 7 s after the ok.
    assert recovery.recovery_s == 7.0
    assert not _by_name(verdict)["progress"].measured


def test_nothing_seen_is_not_measurable_rather_than_failed():
    run = ScriptRun()
    run.start_workers()
    run.records = [r for r in run.records if r["type"] != "worker"]  # --no-instrument, no regex
    run.wait(20)
    run.kill_worker("node1")
    run.start_workers()
    run.records = [r for r in run.records if r["type"] != "worker"]
    run.wait(10)
    run.finish()
    run.records = [r for r in run.records if r["type"] != "worker"]
    verdict = run.verdict(instrumented=False)
    results = _by_name(verdict)
    assert verdict.valid
    for name in ("progress", "loss_continuity", "hang", "recovery"):
        assert not results[name].measured, name
        assert results[name].reasons[0].startswith("not measurable here:"), name
    assert results["completed"].measured and results["completed"].valid
    summary = format_summary(verdict, run.records, title="t", profile=None)
    assert "n/a" in summary and "not measurable: progress" in summary
    # Lanes come from the agents' events: running from "Starting worker group" to the failure.
    lanes = build_timeline(run.records, verdict).lanes
    assert lanes["node0"]["running"] and lanes["node0"]["restarting"]


def test_a_job_that_never_finishes_says_so_without_trainer_words():
    run = ScriptRun()
    run.start_workers()
    run.train(10)
    run.add(type="run", event="end")
    completed = _by_name(run.verdict())["completed"]
    assert not completed.valid
    assert "no agent reported its worker group finished" in completed.reasons[0]


def test_a_zombie_of_an_old_round_is_not_a_step_backwards():
    """freeze-long: node1 frozen; node0 and node2 regroup at world 2; node1's old worker, woken,
    prints step 27 while the new group is at 59. It is a zombie of round 1, not a regression."""
    from tests.unit.test_checkers import HistoryBuilder  # the shipped trainer's histories

    run = HistoryBuilder(nodes=3, nproc=1, steps=80, ckpt=10)
    run.start_workers()
    run.train(27)
    stale = run.workers[1]  # node1's worker, about to freeze
    run.fault("pause", "node1")
    run.wait(5)
    run.group_failure(nodes=["node0", "node2"])
    run.start_workers(resumed_from=20, nodes=["node0", "node2"])
    run.train(59)
    run.fault("unpause", "node1")
    node, local, rank, world = stale
    run.trainer(node, local, rank, world, "progress", step=27, epoch=0, loss=0.5)  # the zombie's line
    run.train(80)
    run.finish()
    verdict = check_all(run.records, run.spec())
    results = {r.name: r for r in verdict.results}
    assert results["progress"].valid, results["progress"].reasons
    assert results["progress"].metrics["zombie_records"] == 1
    model = RunModel(run.records)
    assert [(z["node"], z["step"]) for z in model.zombies] == [("node1", 27)]
    lanes = build_timeline(run.records, verdict).lanes
    assert lanes["node1"]["zombie"]


def test_training_started_from_the_agents_own_event_or_any_worker_record():
    assert _training_started({"type": "agent", "event": "group_started", "node": "node1"}) == \
        "node1 started its worker group"
    assert _training_started({"type": "worker", "event": "start", "node": "node0"})
    assert _training_started({"type": "trainer", "kind": "progress", "node": "node0"})
    assert _training_started({"type": "agent", "event": "rdzv_joined", "node": "node0"}) is None
    assert _training_started({"type": "docker", "action": "start", "node": "node0"}) is None
