"""`sim tune`'s pure parts: the nesting rule, the grid and its budget, the winner, false restarts read from a
history, and the process-group timeout found in a script's source (ours and plain third-party ones)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from sim.cli.main import main
from sim.core.errors import UsageError
from sim.core.spec import ClusterSpec
from sim.vet.gauntlet import FaultScore, plan_vet
from sim.vet.gauntlet import prepare as vet_prepare
from sim.vet.tune import (
    DEFAULT_GRID,
    TORCH_DEFAULTS,
    TUNE_KINDS,
    PgTimeout,
    PointResult,
    Settings,
    choose,
    false_restarts,
    find_pg_timeout,
    fit_budget,
    make_grid,
    nesting_problems,
    parse_grid,
    parse_kinds,
    point_cost_s,
    point_spec,
    vet_line,
)
from tests.unit.histories import HistoryBuilder

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the nesting rule


def test_a_nested_point_breaks_no_rule():
    assert nesting_problems(Settings(2, 3, 1, 60, 0.1, 5.0)) == []


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (Settings(5, 1, 1, 60, 0.1), "keep_alive_max_attempt < 2"),
        (Settings(2, 3, 1, 60, 0.1, 6.0), "pg timeout 6s >= keep-alive 6s"),
        (Settings(2, 3, 10, 31, 0.1, 5.0), "join 31s < 2 x (keep-alive 6s + last call 10s)"),
        (Settings(1, 2, 1, 60, 2.0), "monitor interval 2s >= keep-alive 2s"),
    ],
)
def test_each_rule_of_the_nesting_names_itself(settings, words):
    (problem,) = nesting_problems(settings)
    assert words in problem


def test_torchs_own_defaults_are_read_from_its_sources_and_break_the_pg_rule():
    """torch 2.13: keep-alive 5 x 3, last call 30 s, join 600 s, monitor 0.1 s, gloo's pg timeout 30 min: the
    half-hour process-group timeout lies far above the 15 s keep-alive."""
    torch = pytest.importorskip("torch")
    from torch.distributed.constants import default_pg_timeout
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    timeouts = RendezvousTimeout()
    assert (timeouts.join.total_seconds(), timeouts.last_call.total_seconds()) == (
        TORCH_DEFAULTS.join_timeout,
        TORCH_DEFAULTS.last_call_timeout,
    )
    assert default_pg_timeout.total_seconds() == TORCH_DEFAULTS.pg_timeout
    assert torch.__version__.startswith("2.")
    assert [p.split(":")[0] for p in nesting_problems(TORCH_DEFAULTS)] == ["pg timeout 1800s >= keep-alive 15s"]


def test_settings_refuse_what_torch_cannot_read():
    with pytest.raises(UsageError, match="whole number"):
        Settings(0, 3, 1, 60, 0.1)
    with pytest.raises(UsageError, match="monitor interval"):
        Settings(1, 3, 1, 60, 0.0)


# ---------------------------------------------------------------- the grid and the budget


def test_the_grid_is_every_combination_split_into_safe_and_unsafe_with_the_join_the_nesting_allows():
    safe, unsafe = make_grid([(1, 3), (2, 3)], [1, 3], None, [0.1], [5.0])
    # pg 5 s sits under the 6 s keep-alive only: the 3 s one is unsafe.
    assert [(s.keep_alive_s, s.last_call_timeout, s.join_timeout) for s in safe] == [(6, 1, 60), (6, 3, 60)]
    assert len(unsafe) == 2 and all("pg timeout 5s >= keep-alive 3s" in why[0] for _, why in unsafe)
    # A long keep-alive and last call: the least join the nesting allows, rounded up to 10 s.
    (big,), _ = make_grid([(10, 3)], [20], None, [0.1], None)
    assert big.join_timeout == 100


def test_the_default_grid_is_four_safe_points():
    spec, _ = vet_prepare({}, None, "kill-worker")
    safe, unsafe, pg = parse_grid(spec, {})
    assert len(safe) == 4 and not unsafe and pg.name == "--pg-timeout"
    assert {s.pg_timeout for s in safe} == {float(DEFAULT_GRID["pg_timeout"])}


def test_the_budget_cuts_the_slowest_points_but_keeps_the_most_conservative_and_says_so():
    safe, unsafe = make_grid([(2, 3), (3, 3), (4, 3)], [1, 3], None, [0.1], [5.0])
    whole = fit_budget(safe, unsafe, TUNE_KINDS, 2, 3600)
    assert not whole.cut and len(whole.points) == 6
    # The fastest expected first: the shortest keep-alive and last call.
    assert (whole.points[0].keep_alive_s, whole.points[0].last_call_timeout) == (6, 1)
    one = point_cost_s(whole.points[0], TUNE_KINDS)
    small = fit_budget(safe, unsafe, TUNE_KINDS, 2, 2.5 * one)
    assert len(small.points) + len(small.cut) == 6 and small.cut
    assert small.points[0] == whole.points[0] and small.points[-1] == whole.points[-1]
    assert small.estimate_s <= 2.5 * one


def test_a_budget_that_holds_no_point_is_refused_naming_what_one_takes():
    safe, unsafe = make_grid([(2, 3)], [1], None, [0.1], [5.0])
    with pytest.raises(UsageError, match=r"--budget 60s: not even one point fits .* give --budget \dm"):
        fit_budget(safe, unsafe, TUNE_KINDS, 2, 60)


def test_a_grid_with_no_safe_point_is_refused():
    safe, unsafe = make_grid([(1, 3)], [1], None, [0.1], [5.0])
    with pytest.raises(UsageError, match="no safe point"):
        fit_budget(safe, unsafe, TUNE_KINDS, 2, 600)


# ---------------------------------------------------------------- the winner


def _point(settings: Settings, recoveries, outcome="survived", false=()) -> PointResult:
    scores = tuple(
        FaultScore(kind, kind, outcome if i == 0 else "survived", "", recovery_s=r)
        for i, (kind, r) in enumerate(zip(TUNE_KINDS, recoveries, strict=True))
    )
    return PointResult(settings, "c", scores, tuple(false), ("run",))


def test_the_winner_is_the_fastest_point_that_survived_everything_with_no_false_restart():
    fast_but_false = _point(Settings(2, 3, 1, 60, 0.1, 5.0), [5, 5, 5, 5], false=["control: node1 group failed"])
    fast_but_failed = _point(Settings(2, 3, 3, 60, 0.1, 5.0), [5, 5, 5, 5], outcome="failed")
    slower = _point(Settings(3, 3, 1, 60, 0.1, 5.0), [8, 9, 10, 11])
    slowest = _point(Settings(3, 3, 3, 60, 0.1, 5.0), [9, 9, 10, 11])
    assert choose([fast_but_false, fast_but_failed, slowest, slower]) is slower
    assert fast_but_false.verdict().startswith("FALSE RESTART") and fast_but_failed.verdict().startswith("FAIL")


def test_a_tie_goes_to_the_larger_keep_alive_and_no_qualifier_gives_no_winner():
    a = _point(Settings(2, 3, 1, 60, 0.1, 5.0), [5, 5, 5, 5])
    b = _point(Settings(3, 3, 1, 60, 0.1, 5.0), [5, 5, 5, 5])
    assert choose([a, b]) is b
    missing = _point(Settings(2, 3, 1, 60, 0.1, 5.0), [5, None, 5, 5])
    assert not missing.qualifies and choose([missing]) is None


# ---------------------------------------------------------------- false restarts, from the history


def _plan(nodes=3):
    spec = ClusterSpec(nodes=nodes, nproc_per_node=1, name="t")
    return plan_vet(spec, ("kill-worker", "kill-node"), chosen=True, control_s=20.0)


def _run(control_failure=False, left_out=False):
    h = HistoryBuilder(nodes=3, nproc=1, steps=200)
    h.start_workers()
    h.train(10)
    if control_failure:  # a restart with nothing wrong
        h.group_failure()
        h.start_workers(resumed_from=10)
    h.train(30)
    h.fault("kill-worker", "node2", result={})
    h.group_failure()
    h.start_workers(resumed_from=30, nodes=h.nodes[:2] if left_out else None)
    h.train(50)
    if left_out:
        h.start_workers(resumed_from=50)  # node2 rejoins
        h.train(60)
    h.fault("kill-node", "node2", effects=[{"type": "docker", "node": "node2", "action": "die", "exit_code": 137}])
    h.group_failure(nodes=h.nodes[:2])
    h.start_workers(resumed_from=60, nodes=h.nodes[:2])
    h.train(80)
    h.end()
    return h.model()


def test_a_clean_run_has_no_false_restart():
    assert false_restarts(_run(), _plan(), 1) == []


def test_a_restart_in_the_no_fault_control_window_is_a_false_restart():
    lines = false_restarts(_run(control_failure=True), _plan(), 1)
    assert "control: node0 group failed with no fault" in lines
    assert any(line.startswith("control: 2 rendezvous rounds") for line in lines)


def test_a_round_that_leaves_out_a_survivor_is_a_false_restart_but_the_node_a_fault_took_is_not():
    (line,) = false_restarts(_run(left_out=True), _plan(), 1)
    assert line.startswith("kill-worker node2: round") and "2 node(s), fewer than the 3 it leaves" in line


# ---------------------------------------------------------------- the process-group timeout in the script


def _find(source: str) -> PgTimeout:
    return find_pg_timeout(textwrap.dedent(source), "train.py")


def test_the_shipped_trainer_takes_it_from_its_option_through_its_own_wrapper():
    found = find_pg_timeout((ROOT / "trainer" / "train.py").read_text(), "the shipped trainer")
    assert (found.how, found.name, found.scale) == ("arg", "--pg-timeout", 1.0)


def test_an_option_passed_through_two_functions_and_a_conditional_is_found():
    found = find_pg_timeout((ROOT / "tests" / "scripts" / "multinode_ddp.py").read_text())
    assert (found.how, found.name) == ("arg", "--pg-timeout")


def test_a_plain_script_reading_an_environment_variable_in_minutes():
    found = _find(
        """
        import os
        from datetime import timedelta
        import torch.distributed as dist

        minutes = int(os.environ.get("PG_TIMEOUT_MIN", "30"))
        dist.init_process_group("gloo", timeout=timedelta(minutes=minutes))
        """
    )
    assert (found.how, found.name, found.scale) == ("env", "PG_TIMEOUT_MIN", 60.0)
    assert found.value(120) == "2" and "PG_TIMEOUT_MIN (minutes)" in found.describe()


def test_an_option_given_with_a_dest_and_positionally_to_torch():
    found = _find(
        """
        import argparse, datetime
        from torch.distributed import init_process_group
        p = argparse.ArgumentParser()
        p.add_argument("--timeout-s", "--pg", dest="pg_seconds", type=float, default=60)
        a = p.parse_args()
        init_process_group("gloo", "env://", datetime.timedelta(seconds=a.pg_seconds))
        """
    )
    assert (found.how, found.name) == ("arg", "--timeout-s")


def test_a_hard_coded_timedelta_is_named_and_left_out():
    found = _find(
        """
        from datetime import timedelta
        import torch.distributed as dist
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=30))
        """
    )
    assert not found.tunable and "hard-codes" in found.why and "line 4" in found.why


def test_a_script_with_no_timeout_and_one_with_no_init_at_all():
    none = _find("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    assert not none.tunable and "passes no timeout" in none.why and "30 min" in none.why
    absent = _find("print('hello')\n")
    assert not absent.tunable and "calls no init_process_group" in absent.why
    broken = _find("def f(:\n")
    assert not broken.tunable and "does not parse" in broken.why


def test_a_config_object_is_not_an_option():
    found = _find(
        """
        from datetime import timedelta
        import torch.distributed as dist
        def main(cfg):
            dist.init_process_group("nccl", timeout=timedelta(seconds=cfg.pg_timeout))
        """
    )
    assert not found.tunable and "'pg_timeout', not an argparse option" in found.why


# ---------------------------------------------------------------- a point's spec and command


def test_a_point_sets_the_scripts_option_the_rdzv_conf_and_the_monitor_interval(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print()\n")
    spec, _ = vet_prepare({"script": str(script)}, ["--steps", "9", "--pg-timeout=60"], "kill-worker")
    s = Settings(2, 3, 1, 60, 0.5, 5.0)
    made = point_spec(spec, s, PgTimeout("arg", "--pg-timeout"), "x")
    assert made.script_args == ("--steps", "9", "--pg-timeout", "5")
    conf = dict(made.rdzv_conf)
    assert conf["keep_alive_interval"] == "2" and conf["join_timeout"] == "60" and conf["close_timeout"] == "5"
    assert made.monitor_interval == 0.5 and made.name == "x"
    by_env = point_spec(spec, s, PgTimeout("env", "PG_S"), "x")
    assert dict(by_env.env)["PG_S"] == "5"
    line = vet_line(made, s, PgTimeout("arg", "--pg-timeout"), ("kill-worker",))
    assert "--rdzv-conf keep_alive_interval=2,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60" in line
    assert line.endswith("-- --steps 9 --pg-timeout 5")


def test_the_shipped_trainer_keeps_its_defaults_beside_the_tuned_timeout():
    spec, _ = vet_prepare({}, None, "kill-worker")
    made = point_spec(spec, Settings(2, 3, 1, 60, 0.1, 5.0), PgTimeout("arg", "--pg-timeout"), "x")
    args = made.effective_script_args
    assert args[args.index("--pg-timeout") + 1] == "5" and "--steps" in args


# ---------------------------------------------------------------- bad input: one line each


def test_the_grid_options_are_checked():
    spec, _ = vet_prepare({}, None, "kill-worker")
    with pytest.raises(UsageError, match="--keep-alive '2y3': not INTERVALxATTEMPTS"):
        parse_grid(spec, {"keep_alive": "2y3"})
    with pytest.raises(UsageError, match="--last-call '1.5': torch reads whole seconds"):
        parse_grid(spec, {"last_call": "1.5"})
    with pytest.raises(UsageError, match="--monitor 'x': not a duration"):
        parse_grid(spec, {"monitor": "x"})
    with pytest.raises(UsageError, match="--faults: 'partition' is not one the settings decide"):
        parse_kinds("partition")
    static = ClusterSpec(nodes=3, min_nodes=3, max_nodes=3, rdzv_backend="static", name="t")
    with pytest.raises(UsageError, match="--rdzv-backend static: its handler reads none"):
        parse_grid(static, {})


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--budget", "0"], "--budget 0s: give a time above zero"),
        (["--budget", "soon"], "duration 'soon': not a duration"),
        (["--keep-alive", "3"], "--keep-alive '3': not INTERVALxATTEMPTS"),
        (["--monitor-interval", "1"], "sim tune chooses --monitor-interval"),
        (["--rdzv-conf", "join_timeout=9"], "sim tune chooses --monitor-interval and the keep-alive"),
        (["--faults", "fill-disk"], "--faults: 'fill-disk' is not one the settings decide"),
        (["--budget", "1m"], "--budget 60s: not even one point fits"),
        (["--rdzv-backend", "etcd"], "--rdzv-backend etcd: its handler reads none of the tuned keys"),
    ],
)
def test_bad_input_is_one_line_and_no_cluster(argv, words, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_the_command_states_the_plan_and_prints_the_winner_as_torchrun_and_k8s_flags(capsys, monkeypatch, tmp_path):
    """The command's own part (no cluster): its plan and cost first, then the table, the recommendation in
    torchrun's and Kubernetes' words, tune.json and tune.html. The points' results are made here."""
    import sim.vet.tune as tune

    def fake_run(spec, kinds, grid, pg, **_):
        points = tuple(_point(s, [10 + i, 20 + i, 30 + i, 40 + i]) for i, s in enumerate(grid.points))
        best = tune.choose(points)
        won = tune.point_spec(spec, best.settings, pg, spec.name)
        return tune.TuneResult(
            None, spec.rdzv_backend, spec.nodes, 1, kinds, pg, grid, points, 1.0, best,
            tune.torchrun_flags(won), tune.k8s_form(won, pg), tune.vet_line(won, best.settings, pg, kinds), "x",
        )  # fmt: skip

    monkeypatch.setattr(tune, "run_tune", fake_run)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--out", str(tmp_path), "--", "--steps", "100000"]) == 0
    out = capsys.readouterr().out
    assert "process-group timeout: the script's option --pg-timeout (seconds)" in out
    assert "cost: about" in out and "p4: keep-alive 6x3=18s last-call 5s" in out
    assert "recommended: keep-alive 4x3=12s last-call 2s join 60s monitor 0.1s pg 10s" in out
    assert "--rdzv-conf last_call_timeout=2,join_timeout=60,keep_alive_interval=4,keep_alive_max_attempt=3" in out
    assert "--pg-timeout 10" in out and "- {key: keep_alive_interval, value: '4'}" in out
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["recommended"]["keep_alive_s"] == 12 and len(data["points"]) == 4
    assert "keep-alive 4x3=12s" in (tmp_path / "tune.html").read_text()


def test_the_vet_command_for_the_shipped_trainer_names_its_source():
    spec, _ = vet_prepare({}, None, "kill-worker")
    s = Settings(4, 3, 2, 60, 0.1, 10.0)
    line = vet_line(
        point_spec(spec, s, PgTimeout("arg", "--pg-timeout"), "x"),
        s,
        PgTimeout("arg", "--pg-timeout"),
        ("kill-worker",),
    )
    assert line.startswith(f"python -m sim vet {ROOT / 'trainer' / 'train.py'} ") and "--pg-timeout 10" in line


def test_the_tuners_kinds_are_vetted_kinds_one_for_each_mechanism_the_settings_decide():
    """TUNE_KINDS is the tuner's choice (data): each is a kind `sim vet --faults` takes, and its traits give it a
    recovery of its own (a crash, a node lost, a freeze, a join), so a renamed kind fails here."""
    from sim.vet.tune import PROVOCATIONS, Settings, expected_recovery

    assert set(TUNE_KINDS) <= set(PROVOCATIONS)
    s = Settings(4, 3, 2, 60, 0.1, 10.0)
    assert len({expected_recovery(s, kind) for kind in TUNE_KINDS}) == len(TUNE_KINDS)
