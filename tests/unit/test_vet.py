"""`sim vet`: the plan built from the fault catalog's provocations, its inputs, and its outputs (pure parts)."""

from __future__ import annotations

import dataclasses
import time
import xml.etree.ElementTree as ET

import pytest

from sim.cli.main import build_parser, main, read_tool_config, vet_options
from sim.core.errors import ClusterError, UsageError
from sim.core.spec import spec_from_options
from sim.faults.catalog import FAULTS, PROVOCATIONS
from sim.scenarios.scenario import Trigger
from sim.verdict.runmodel import RunModel
from sim.vet.gauntlet import (
    DEFAULT_GAUNTLET,
    QUICK_GAUNTLET,
    FaultScore,
    VetResult,
    _told,
    cluster_count,
    clusters_that_fit,
    junit_xml,
    parse_faults,
    plan_lanes,
    plan_vet,
    prepare,
    render_html,
    run_vet,
    scorecard,
    split_kinds,
    vet_spec,
)

SCRIPT = "tests/scripts/ddp_sgd.py"


def _spec(backend="etcd-v2", **options):
    options = {"nodes": 3, "nproc_per_node": 1, "script": SCRIPT, "rdzv_backend": backend, **options}
    return vet_spec(spec_from_options(options, None), DEFAULT_GAUNTLET, restarts_given=False)


def test_every_provocation_names_a_catalog_fault_and_the_issue_gauntlet_is_the_default():
    assert all(p.fault in FAULTS for p in PROVOCATIONS.values())
    # Written out: a kind that declares a provocation joins the whole gauntlet only when it says so (default).
    assert DEFAULT_GAUNTLET == (
        "kill-worker",
        "kill-agent",
        "kill-node",
        "stop-node",
        "restart-node",
        "scale-down",
        "scale-up",
        "pause",
        "partition",
        "netem",
        "etcd-restart",
        "store-host-loss",
        "slow-node",
        "hang-collectives",
        "fill-disk",
        "kill-during-checkpoint",
    )
    assert set(DEFAULT_GAUNTLET) == {name for name, p in PROVOCATIONS.items() if p.default}
    assert len(QUICK_GAUNTLET) == 5


def test_each_fault_fires_once_the_job_is_steady_again_at_the_size_it_should_have():
    plan = plan_vet(_spec(), DEFAULT_GAUNTLET, chosen=False)
    steps = plan.gauntlet
    assert all(step.trigger.kind == "recovered" for step in steps)
    # A node that a fault took away is brought back (a restoring scale, not scored) before the next fault.
    kill_node = next(i for i, s in enumerate(steps) if s.fault == "kill-node")
    assert steps[kill_node].trigger == Trigger("recovered", 3)
    assert steps[kill_node + 1].fault == "scale" and kill_node + 1 in plan.restores
    assert steps[kill_node + 1].trigger == Trigger("recovered", 2)
    # Scale down then up: the node that left joins again; nothing strikes node0 (c10d's store host).
    scored = [s.options.nodes for i, s in enumerate(steps) if s.fault == "scale" and i not in plan.restores]
    assert scored == [2, 3]
    assert all(getattr(s.options, "target", "node2") != "node0" for s in steps)
    # A node-removing fault runs last, where no restoring scale follows it; the scorecard keeps the listed order.
    assert steps[-1].fault == "stop-node" and len(plan.restores) == 2 and plan.final_world == 2
    durations = {s.fault: s.duration_s for s in steps if s.duration_s}
    assert durations["pause"] == 25.0 and durations["partition"] == 20.0
    # A frozen or cut-off node is given back as soon as the others are steady without it (those bounds at most).
    early = {s.fault: s.undo_once_recovered for s in steps if s.undo_once_recovered is not None}
    assert early == {"pause": 2, "partition": 2}


def test_a_job_ending_fault_gets_a_cluster_of_its_own_and_others_are_scored_not_applicable():
    plan = plan_vet(_spec("etcd-v2"), DEFAULT_GAUNTLET, chosen=False)
    by_kind = {f.kind: f for f in plan.faults}
    assert by_kind["etcd-restart"].solo  # torch's etcd-v2 agents end on etcd's downtime
    assert by_kind["store-host-loss"].step is None and "c10d" in by_kind["store-host-loss"].why_not
    c10d = {f.kind: f for f in plan_vet(_spec("c10d"), DEFAULT_GAUNTLET, chosen=False).faults}
    assert c10d["store-host-loss"].solo and c10d["store-host-loss"].step.options.target == "store-host"
    assert c10d["partition"].step is None and "--rdzv-backend etcd-v2" in c10d["partition"].why_not
    v3 = {f.kind: f for f in plan_vet(_spec("etcd-v3"), DEFAULT_GAUNTLET, chosen=False).faults}
    assert not v3["etcd-restart"].solo and v3["etcd-restart"].step is not None


def test_a_scale_up_on_a_job_at_its_maximum_first_makes_room():
    plan = plan_vet(_spec(), ("scale-up",), chosen=True)
    assert [(s.fault, s.options.nodes) for s in plan.gauntlet] == [("scale", 2), ("scale", 3)]
    assert plan.restores == {0}


def test_the_vet_spec_has_the_fast_profile_under_the_users_own_rendezvous_settings():
    spec = vet_spec(
        spec_from_options({"nodes": 3, "script": SCRIPT, "rdzv_conf": "last_call_timeout=7"}, None),
        ("fill-disk",),
        restarts_given=False,
    )
    conf = dict(spec.rdzv_conf)
    assert conf["last_call_timeout"] == "7" and conf["keep_alive_interval"] == "1"
    assert spec.max_restarts == 30 and spec.ckpt_size == "16m"
    assert dict(spec.env)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    given = vet_spec(spec_from_options({"script": SCRIPT, "max_restarts": 2}, None), (), restarts_given=True)
    assert given.max_restarts == 2 and given.ckpt_size is None


@pytest.mark.parametrize(
    ("faults", "quick", "says"),
    [
        ("bogus", False, "unknown kind 'bogus'; use some of: kill-worker"),
        ("oom-worker", False, "a catalog fault the vet has no provocation for"),
        ("kill-worker,kill-worker", False, "named twice"),
        ("kill-worker", True, "--faults and --quick both choose"),
        (" , ", False, "names no fault"),
    ],
)
def test_bad_faults_are_refused_in_one_line(faults, quick, says):
    with pytest.raises(UsageError, match=says):
        parse_faults(faults, quick)


def test_a_fault_the_backend_cannot_host_is_refused_when_named():
    with pytest.raises(UsageError, match="--faults partition: needs the etcd-v2 or etcd-v3 backend, not c10d"):
        plan_vet(_spec("c10d"), ("partition",), chosen=True)


def test_two_clusters_share_the_gauntlet_evenly_each_in_the_listed_order():
    shares = split_kinds(DEFAULT_GAUNTLET, "etcd-v2", 2)
    assert sorted(k for share in shares for k in share) == sorted(DEFAULT_GAUNTLET)
    for share in shares:
        assert list(share) == [k for k in DEFAULT_GAUNTLET if k in share]
    # The pair that restores itself (a node leaves, a node joins) stays on one cluster.
    assert any({"scale-down", "scale-up"} <= set(share) for share in shares)
    # The two longest held faults, and the job-ending one's own cluster, are not all on one side.
    assert not any({"pause", "partition", "etcd-restart"} <= set(share) for share in shares)
    plans = plan_lanes(_spec(), DEFAULT_GAUNTLET, chosen=False, clusters=2)
    assert [p.spec.name for p in plans] == ["sim", "sim-lane2"]
    assert sum(len(p.faults) for p in plans) == len(DEFAULT_GAUNTLET)
    # Each cluster's own node-removing fault runs last, so neither needs a restoring scale after it.
    assert all(p.gauntlet[-1].fault in ("stop-node", "kill-agent", "kill-node") for p in plans)
    assert split_kinds(("kill-worker", "etcd-restart"), "etcd-v2", 2) == [("etcd-restart",), ("kill-worker",)]
    assert split_kinds(("kill-worker",), "etcd-v2", 3) == [("kill-worker",)]
    assert split_kinds(DEFAULT_GAUNTLET, "etcd-v2", 1) == [DEFAULT_GAUNTLET]
    # With two at once, each cluster's progress lines say whose they are.
    said: list[str] = []
    _told(said.append, plans[1], 2)("[chaos] kill-node node2")
    _told(said.append, plans[0], 1)("[chaos] pause node2")
    assert said == ["[sim-lane2] [chaos] kill-node node2", "[chaos] pause node2"]


def test_the_clusters_at_once_are_checked_and_a_swarm_runs_one():
    assert cluster_count(None, _spec()) == 2 and cluster_count(1, _spec()) == 1
    assert cluster_count(None, _spec(engine="swarm")) == 1
    with pytest.raises(UsageError, match="--parallel 0: give 1 to 4 clusters at once"):
        cluster_count(0, _spec())
    with pytest.raises(UsageError, match="--parallel 2: a one-host swarm runs one cluster at a time"):
        cluster_count(2, _spec(engine="swarm"))


def test_as_many_clusters_run_at_once_as_the_machines_memory_holds():
    spec = _spec(memory="2g")  # 3 nodes of 2048 MiB
    assert clusters_that_fit(2, spec, {}, memory_mib=16384) == 2
    assert clusters_that_fit(2, spec, {}, memory_mib=8192) == 1  # 12 GiB of nodes, 7 GiB of room
    assert clusters_that_fit(3, spec, {"other": [2048, 2048]}, memory_mib=20480) == 2  # room for 7 nodes
    assert clusters_that_fit(2, spec, {}, memory_mib=1024) == 1  # the first `up` refuses it itself


def test_vet_takes_every_job_option_of_up(capsys):
    """One definition of the job options: whatever `sim up` takes to shape the job, `sim vet` takes too."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    up = {o for a in sub["up"]._actions for o in a.option_strings}
    vet = {o for a in sub["vet"]._actions for o in a.option_strings}
    up_only = {"--detach", "--verbose", "--timeout", "--replace"}  # how up runs, not what the job is
    assert up - up_only <= vet


def test_bad_input_is_one_line_before_anything_starts(capsys):
    assert main(["vet", SCRIPT, "--faults", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown kind 'nope'" in err
    assert main(["vet", "no-such-script.py"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["vet", SCRIPT, "--parallel", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--parallel 9: give 1 to 4 clusters at once" in err


def test_defaults_come_from_pyproject_and_the_command_line_wins(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.elastic-sim]\nscript = "train.py"\nargs = ["--epochs", "5"]\nnodes = 4\nfaults = ["kill-worker"]\n'
    )
    tool = read_tool_config(tmp_path)
    options, args, faults = vet_options({"vet_script": None, "nodes": None}, None, tool)
    assert options["script"] == str(tmp_path / "train.py") and options["nodes"] == 4
    assert args == ["--epochs", "5"] and faults == "kill-worker"
    spec, kinds = prepare(options, args, faults)
    assert (spec.nodes, spec.nproc_per_node, kinds) == (4, 1, ("kill-worker",))
    options, args, faults = vet_options({"vet_script": SCRIPT, "nodes": 2, "faults": "pause"}, ["-x"], tool)
    assert options["script"] == SCRIPT and options["nodes"] == 2 and args == ["-x"] and faults == "pause"
    (tmp_path / "pyproject.toml").write_text("[tool.elastic-sim]\nnodez = 3\n")
    with pytest.raises(UsageError, match="nodez: unknown key"):
        read_tool_config(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.elastic-sim]\nnodes = "three"\n')
    with pytest.raises(UsageError, match="use e.g. nodes = 3"):
        read_tool_config(tmp_path)
    with pytest.raises(UsageError, match="--no-instrument: the vet must see training steps"):
        prepare({"script": SCRIPT, "instrument": False}, None, None)
    with pytest.raises(UsageError, match="no script"):
        vet_options({"vet_script": None}, None, {})


def _result() -> VetResult:
    survived = FaultScore(
        "kill-worker",
        "worker crash",
        "survived",
        "the job recovers",
        target="node2",
        t_fault=100.0,
        t_end=110.0,
        recovery_s=5.7,
        phases={"detection_s": 0.7, "rendezvous_s": 1.5},
        steps_lost=5,
        restarts=1,
        restarts_used=1,
        restart_budget=30,
        throughput_before=9.1,
        throughput_after=8.7,
    )
    diagnosis = {
        "code": "resumed-apart",
        "title": "Ranks resumed from different points",
        "cause": "c",
        "evidence": ("node2 04:40:01.1  rank 2 loaded nothing",),
        "fix": "every rank must load the same checkpoint",
    }
    failed = dataclasses.replace(
        survived,
        kind="scale-up",
        label="a node joining (scale up)",
        outcome="failed",
        why="the ranks resumed from different points",
        diagnoses=(diagnosis,),
    )
    na = FaultScore("partition", "one node partitioned", "not applicable", "s", "needs the etcd-v2 backend")
    return VetResult("train.py", "etcd-v2", 3, 1, (survived, failed, na), ("/runs/x",), 60.0)


def test_scorecard_is_one_row_per_fault_and_names_the_fix_of_a_failed_one():
    vet = _result()
    text = scorecard(vet)
    lines = text.splitlines()
    assert lines[2].startswith("PASS worker crash") and "5.7s" in lines[2] and "1 (1/30)" in lines[2]
    assert lines[3].startswith("FAIL a node joining") and lines[3].endswith("Ranks resumed from different points")
    assert "    Fix: every rank must load the same checkpoint" in lines
    assert lines[4].startswith("n/a") and "needs the etcd-v2 backend" in lines[4]
    assert "FAIL: 1 survived, 1 failed" in text and not vet.passed
    assert max(map(len, lines)) <= 118


def test_junit_has_one_testcase_per_fault_with_the_diagnosis_as_the_failure_message():
    suite = ET.fromstring(junit_xml(_result()))
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases][0] == "kill-worker: worker crash"
    failure = cases[1].find("failure")
    assert failure.get("message").startswith("Ranks resumed from different points. Fix: every rank")
    assert cases[2].find("skipped") is not None


def test_html_has_the_scorecard_on_top_and_a_section_per_fault():
    page = render_html(_result(), {"kill-worker": b"\x89PNG fake"})
    assert page.index("<table>") < page.index("<h2>")
    assert page.count("<h2>") == 3 and "data:image/png;base64," in page
    assert "detection 0.7s" in page


def test_the_recovered_trigger_waits_for_every_rank_to_train_five_steps_since_its_start(tmp_path):
    import json

    from sim.scenarios.runner import HistoryState
    from sim.scenarios.scenario import parse_scenario

    text = "name: r\ndescription: d\ncluster: {nodes: 3}\nsteps:\n  - fault: kill-worker\n    at: {recovered: 3}\n"
    text += "expect: {outcome: recovers}\n"
    assert parse_scenario(text).steps[0].trigger == Trigger("recovered", 3)
    with pytest.raises(UsageError, match="7 is never reached"):
        parse_scenario(text.replace("recovered: 3", "recovered: 7"))
    path = tmp_path / "history.jsonl"

    def step(t, rank, n, world=3):
        record = {"t": t, "type": "worker", "node": f"node{rank}", "event": "step", "rank": rank}
        return json.dumps({**record, "world_size": world, "n": n}) + "\n"

    path.write_text("".join(step(100 + n, 0, n) for n in range(1, 7)))
    state = HistoryState(path)
    state.update()
    assert not state.steady(3, 0.0)  # one rank only
    with path.open("a") as f:
        f.write(step(107, 1, 1) + step(107, 2, 1) + step(108, 2, 2, world=2))
    state.update()
    assert not state.steady(3, 0.0)  # ranks 1 and 2 stepped once
    with path.open("a") as f:  # the instrumentation's beats are samples: 1 and 6 are six steps
        f.write(step(109, 1, 6) + step(109, 2, 6))
    state.update()
    assert state.steady(3, 0.0) and not state.steady(3, 104.5) and not state.steady(2, 0.0)
    # A worker killed at step 43 beats once more, then its restarted group resumes from 21: steps count from 21.
    path.write_text(
        "".join(step(200, rank, 43) + step(201, rank, 21) for rank in range(3)) + step(202, 0, 26) + step(202, 1, 26)
    )
    state = HistoryState(path)
    state.update()
    assert not state.steady(3, 199.0)  # rank 2 has trained one step since its resume
    with path.open("a") as f:
        f.write(step(202, 2, 25))
    state.update()
    assert state.steady(3, 199.0)


def test_a_held_fault_is_undone_once_the_others_are_steady_without_its_node(tmp_path):
    """Step.undo_once_recovered: the runner undoes the hold at the first poll that finds the job steady at
    that world size since the fault acted, and the next step's steady wait counts from then."""
    import json
    import time

    from sim.scenarios.runner import HistoryState, ScenarioRunner, _Once

    path = tmp_path / "history.jsonl"
    path.write_text("")
    undone = []
    runner = ScenarioRunner.__new__(ScenarioRunner)
    runner.progress = lambda line: None
    fired = time.time()
    undo = _Once(lambda: undone.append(time.time()))
    runner._holds, runner._hold_end = {undo: fired + 25.0}, fired + 25.0
    runner._early_undos = [(undo, 2, fired)]
    state = HistoryState(path)

    def beats(*steps):
        lines = [{"t": fired + 1, "type": "worker", "node": f"node{r}", "event": "step", "rank": r, "world_size": 2,
                  "n": n} for n in steps for r in (0, 1)]  # fmt: skip
        with path.open("a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        state.update()
        runner._end_holds_once_recovered(state)

    beats(1)
    assert not undone and runner._hold_end == fired + 25.0  # one step at world 2: not steady yet
    beats(6)
    assert len(undone) == 1 and runner._hold_end < fired + 25.0 and not runner._early_undos
    undo()  # its timer, later: nothing more
    assert len(undone) == 1


class _LaneRunner:
    """The part of ScenarioRunner a lane uses: the second cluster's run fails at once, the first polls its
    cancel as the real runner does (Ctrl-C's cleanup: KeyboardInterrupt)."""

    def __init__(self, scenario, backend, *, spec, cancel, fired, **_options):
        self.spec, self.cancel, self.fired = spec, cancel, fired

    def run(self):
        if self.fired is not None:
            self.fired.set()  # the first job is steady: the second cluster starts
        if self.spec.name.endswith("-lane2"):
            raise ClusterError("lane2's engine went away")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.cancel.is_set():
                raise KeyboardInterrupt
            time.sleep(0.01)
        raise AssertionError("the first cluster ran on: the second one's error did not stop it")


def test_an_error_on_one_cluster_stops_the_other_and_the_vet_fails_with_it(monkeypatch):
    monkeypatch.setattr("sim.vet.gauntlet.ScenarioRunner", _LaneRunner)
    monkeypatch.setattr("sim.vet.gauntlet.job_images", lambda *args, **kwargs: None)
    engine = type("RemoteEngine", (), {"local": False})()
    with pytest.raises(ClusterError, match="lane2's engine went away"):
        run_vet(_spec(), DEFAULT_GAUNTLET, docker=engine, progress=lambda line: None, parallel=2)


def _shared_run(run_dir) -> tuple[float, float]:
    """One cluster's run with two faults: a worker crash it recovers from, then a node crash it never does
    (both nodes needed). The history goes to run_dir; the two faults' strikes are returned."""
    from sim.core.history import FILE_NAME, History
    from tests.unit.histories import HistoryBuilder

    run = HistoryBuilder(nodes=2, nproc=2, steps=60, ckpt=10, min_nodes=2)
    run.start_workers()
    run.train(15, step_s=0.1)
    worker_struck = run.t
    run.fault("kill-worker", "node1", node="node1", rank=2)
    run.add(type="agent", node="node1", event="worker_failed", local_rank=0, exitcode=-9, pid=41)
    run.group_failure()
    run.wait(1.0)
    run.start_workers(resumed_from=10)
    run.train(40, step_s=0.1)
    node_struck = run.t
    run.fault("kill-node", "node1", node="node1", effects=[{"type": "docker", "node": "node1", "action": "die"}])
    run.wait(8.0)
    run.end()
    history = History(run_dir / FILE_NAME)
    for record in run.records:
        history.append(record)
    return worker_struck, node_struck


def test_each_faults_picture_carries_its_own_verdict_not_the_run_it_shared(tmp_path, monkeypatch):
    """The worker crash was survived in a run the node crash then failed: its picture says PASS (and that the
    run it shared ended FAIL, and why), never the run's FAIL; the node crash's picture says FAIL."""
    from matplotlib.figure import Figure

    from sim.vet.gauntlet import fault_timelines

    worker_t, node_t = _shared_run(tmp_path)
    base = dict(survival="s", run_dir=str(tmp_path), target="node1")
    survived = FaultScore("kill-worker", "worker crash", "survived", t_fault=worker_t, t_end=node_t, **base)
    failed = FaultScore("kill-node", "node crash", "failed", why="never recovered", t_fault=node_t, **base)
    drawn: list[dict] = []
    savefig = Figure.savefig

    def noting_savefig(figure, *args, **kwargs):
        titles = [ax.get_title(loc) for ax in figure.axes for loc in ("left", "center", "right")]
        drawn.append({"title": figure._suptitle.get_text(), "color": figure._suptitle.get_color(), "texts": titles})
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", noting_savefig)
    pictures = fault_timelines(VetResult("train.py", "etcd-v2", 2, 2, (survived, failed), (str(tmp_path),), 60.0))
    assert set(pictures) == {"kill-worker", "kill-node"}
    worker, node = drawn
    assert worker["title"] == "worker crash — PASS" and worker["color"] == "#2e7d32"
    assert any("the run it shared ended FAIL: node crash failed" in text for text in worker["texts"])
    assert node["title"] == "node crash — FAIL" and node["color"] == "#c62828"
    assert not any("the run it shared" in text for text in node["texts"])  # its run ended as it did


def test_the_pages_table_speaks_words_and_keeps_each_figure_on_one_line():
    vet = _result()
    phased = dataclasses.replace(vet.faults[0], phases={"worker_start_s": 10.4, "pg_init_s": 0.5, "ckpt_load_s": 0.0})
    page = render_html(dataclasses.replace(vet, faults=(phased,), clusters=2), {})
    assert "worker start 10.4s, process group init 0.5s, checkpoint load 0.0s" in page
    assert "pg_init" not in page and "_start" not in page
    assert "<td class=n>9.1 → 8.7</td>" in page and "td.n{white-space:nowrap}" in page
    assert "on 3 nodes x 1 worker, etcd-v2, 60 s, 2 clusters at once" in page


def test_a_cropped_picture_labels_only_what_it_shows(tmp_path, monkeypatch):
    """A fault's picture is the run's timeline cropped to its window: a fault or round outside the crop has no
    label hanging cut off in the margin; one that began before the crop and lasts into it is labelled at its edge."""
    from matplotlib.figure import Figure

    from sim.core.history import FILE_NAME, History
    from sim.verdict.checkers import RunSpec, check_all
    from sim.verdict.plot import draw_timeline
    from sim.verdict.timeline import build_timeline, run_origin

    _, node_t = _shared_run(tmp_path)
    run = RunModel(History(tmp_path / FILE_NAME).read().records)
    verdict = check_all(run, RunSpec.from_run(run, expected="recovers"))
    timeline = build_timeline(run, verdict)
    origin = run_origin(run)
    drawn: list[list[tuple[float, str]]] = []
    savefig = Figure.savefig

    def noting_savefig(figure, *args, **kwargs):
        drawn.append([(t.get_position()[0], t.get_text()) for ax in figure.axes for t in ax.texts])
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", noting_savefig)
    into_node_crash = (node_t - origin + 2.0, node_t - origin + 12.0)
    draw_timeline(timeline, tmp_path / "t.png", title="t", verdict=verdict, profile="fast", window=into_node_crash)
    (texts,) = drawn
    labels = [(x, text) for x, text in texts if text.startswith("kill-")]
    assert [text.split("\n")[0] for _, text in labels] == ["kill-node node1"]  # not the worker crash, long over
    assert labels[0][0] == into_node_crash[0]
    assert not any(text.strip().startswith("round") for _, text in texts)  # every round came before the crop
