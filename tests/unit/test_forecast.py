"""sim/vet/forecast.py: the model on hand-made measurements against figures worked out by hand, the published
rates, and the measurements read from captured vet histories."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from sim.core.errors import UsageError
from sim.core.history import History
from sim.verdict.runmodel import RunModel
from sim.vet.forecast import (
    LLAMA3,
    FailureRates,
    KindCost,
    Measurements,
    forecast,
    forecast_scale,
    interval_of,
    llama3_rates,
    measure,
    measurements_from,
    parse_mtbf,
    parse_scales,
    render,
    scaled_rates,
    shares,
    soak_measure,
    soak_prediction,
    table_rates,
    with_given,
    young_interval,
)
from sim.vet.gauntlet import FaultScore, VetResult, write_outputs

from .histories import T0

RUNS = Path(__file__).parent.parent / "data" / "runs"

# By hand: one node loss every 10 h for the job (100 nodes, each 0.001 failures per hour = 1/36000 per second),
# each costing 360 s of recovery; a save every 590 s of training, each blocking 10 s (a cycle of 600 s).
#   restarts   = 360 / 36000                         = 0.01
#   re-done    = (600 / 2) / 36000                   = 0.0083333
#   left       = 1 - 0.01 - 0.0083333                = 0.9816667
#   checkpoint = 0.9816667 * 10 / 600                = 0.0163611
#   goodput    = 0.9816667 * 590 / 600               = 0.9653056
#   τ*         = sqrt(2 * 10 * 36000) = sqrt(720000) = 848.528 s
#   at τ*: re-done = (858.528 / 2) / 36000 = 0.0119240; left = 0.9780760;
#          goodput = 0.978076 * 848.528 / 858.528 = 0.978076 * 0.988352 = 0.966683
HAND = Measurements(
    step_s=1.0,
    kinds=(KindCost("kill-node", 360.0, {"detection_s": 60.0, "rendezvous_s": 240.0, "worker_start_s": 60.0}, 295),),
    save_s=10.0,
    interval_steps=590,
    nodes=3,
)
HAND_RATES = FailureRates({"kill-node": 0.001}, "by hand")


def test_the_model_on_hand_made_measurements_matches_the_figures_worked_out_by_hand():
    scale = forecast_scale(HAND, HAND_RATES, nodes=100, gpus_per_node=8)
    assert scale.gpus == 800
    assert scale.per_day == pytest.approx(2.4)
    assert scale.mtbf_h == pytest.approx(10.0)
    assert scale.shares.restarts == pytest.approx(0.01)
    assert scale.shares.redone == pytest.approx(0.0083333, abs=1e-7)
    assert scale.shares.checkpoint == pytest.approx(0.0163611, abs=1e-7)
    assert scale.shares.goodput == pytest.approx(0.9653056, abs=1e-7)
    assert scale.young_s == pytest.approx(848.528, abs=1e-3)
    assert scale.goodput_at_young == pytest.approx(0.966683, abs=1e-6)
    parts = scale.shares
    assert parts.restarts + parts.redone + parts.checkpoint + parts.goodput == pytest.approx(1.0)


def test_youngs_interval_is_the_square_root_of_twice_the_save_cost_times_the_mtbf():
    assert young_interval(10.0, 36000.0) == pytest.approx(848.528, abs=1e-3)
    assert young_interval(30.0, 3 * 3600.0) == pytest.approx(805.0, abs=0.1)  # √(2·30·10800) = √648000


def test_youngs_interval_is_the_best_interval_of_the_model_to_first_order():
    rates, costs = {"kill-node": 1 / 36000}, {"kill-node": HAND.kinds[0]}
    best = max(range(100, 3000, 10), key=lambda tau: shares(rates, costs, tau, 10.0).goodput)
    assert abs(best - 848.5) < 0.05 * 848.5


def test_the_levers_say_the_checkpoint_interval_and_the_biggest_phase_of_the_costliest_kind():
    scale = forecast_scale(HAND, HAND_RATES, nodes=100, gpus_per_node=8)
    text = "\n".join(scale.levers)
    assert "checkpoint every 14 min (Young's τ*) instead of every 10 min: goodput 96.5 % → 96.7 %" in text
    # rendezvous is 240 s of the 360: without it, restarts 120/36000 and the rest as before.
    left = 1 - 120 / 36000 - 300 / 36000
    assert "node loss is 100.0 % of the loss: its 360 s recovery is mostly rendezvous (240 s" in text
    assert f"goodput 96.5 % → {100 * left * 590 / 600:.1f} %" in text  # 97.2 %
    assert scale.levers[0].startswith("node loss")  # the bigger gain first (1.6 points against 0.1)


def test_no_checkpoint_means_every_restart_redoes_the_job():
    m = Measurements(step_s=1.0, kinds=(KindCost("kill-worker", 5.0),))
    scale = forecast_scale(m, FailureRates({"kill-worker": 0.01}, "by hand"), 10, 8)
    assert scale.shares.goodput == 0.0 and scale.young_s is None
    assert scale.levers[0].startswith("checkpoint at all")


def test_a_kind_the_vet_did_not_measure_takes_its_stand_ins_cost_and_says_so():
    rates = FailureRates({"kill-node": 0.001, "partition": 0.001}, "by hand")
    made = forecast(HAND, rates, (100,), 8)
    partition = next(k for k in made.scales[0].kinds if k.kind == "partition")
    assert partition.stand_in == "kill-node" and partition.cost.recovery_s == 360.0
    assert "partition was not vetted: its measured stand-in is kill-node's recovery" in made.assumptions


def test_llama3_rates_are_the_papers_419_interruptions_in_54_days_on_2048_nodes():
    assert sum(c.count for c in LLAMA3) == 419
    rates = llama3_rates()
    assert rates.node_mtbf_h == pytest.approx(54 * 24 * 2048 / 419)
    scale = forecast_scale(HAND, rates, nodes=2048, gpus_per_node=8)
    assert scale.per_day == pytest.approx(419 / 54)  # about one every three hours
    assert scale.mtbf_h == pytest.approx(54 * 24 / 419)
    node_loss = sum(c.count for c in LLAMA3 if c.kind == "kill-node")
    assert rates.per_node_hour["kill-node"] / sum(rates.per_node_hour.values()) == pytest.approx(node_loss / 419)
    assert any("Faulty GPU 148" in line for line in rates.mapping)
    assert "Llama 3" in rates.source


def test_a_node_mtbf_keeps_llama3s_mix_and_a_table_gives_each_kind_its_own():
    hours = parse_mtbf("--mtbf-node", "200d")
    assert hours == 4800.0
    rates = scaled_rates(llama3_rates(), hours, "200d")
    assert rates.node_mtbf_h == pytest.approx(4800.0)
    table = table_rates({"kill-node": "100d", "kill-worker": "2400h"}, "pyproject")
    assert table.per_node_hour == {"kill-node": pytest.approx(1 / 2400), "kill-worker": pytest.approx(1 / 2400)}


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: parse_mtbf("--mtbf-node", "soon"), "--mtbf-node 'soon': not a time between failures"),
        (lambda: parse_mtbf("--mtbf-node", "0d"), "use e.g. 200d"),
        (lambda: parse_scales("64,lots"), "--nodes '64,lots': give node counts"),
        (lambda: parse_scales("0"), "give node counts"),
        (lambda: table_rates({"meteor": "1d"}, "pyproject"), "meteor: not a kind the forecast rates"),
        (lambda: Measurements(step_s=1.0, kinds=()), "the vet recovered from no fault"),
    ],
)
def test_bad_input_is_one_line_naming_it(call, words):
    with pytest.raises(UsageError, match=None) as raised:
        call()
    assert words in str(raised.value) and "\n" not in str(raised.value)


def _vet_dict(run_dir: Path) -> dict:
    return {
        "nodes": 3,
        "nproc_per_node": 1,
        "run_dirs": [str(run_dir)],
        "faults": [
            {
                "kind": "kill-worker",
                "outcome": "survived",
                "recovery_s": 7.5,
                "phases": {"detection_s": 1.0, "rendezvous_s": 2.5, "worker_start_s": 4.0},
                "steps_lost": 6,
                "restarts": 1,
                "throughput_before": 10.0,
                "throughput_after": 6.0,
            },
            {"kind": "kill-node", "outcome": "failed", "recovery_s": 30.0},  # failed: not a measurement
        ],
    }


def test_measurements_come_from_the_vets_histories_saves_steps_and_settings():
    run = RunModel(History(RUNS / "vet_gauntlet" / "history.jsonl").read().records)
    m = measurements_from(_vet_dict(RUNS / "vet_gauntlet"), [run], "captured")
    assert [k.kind for k in m.kinds] == ["kill-worker"]
    # 10 s after the recovery at 6 steps/s against 10 before: 4 s of training short (THROUGHPUT_WINDOW_S is 10 s)
    assert m.kinds[0].slow_s == pytest.approx(4.0) and m.kinds[0].lost_s == pytest.approx(11.5)
    assert m.interval_steps == 10  # fixed_name_ckpt.py's --ckpt-every default
    assert 0.1 <= m.step_s < 0.12  # its --step-time 0.1 plus the step itself
    assert 0.0005 < m.save_s < 0.01  # a small model's torch.save, fsync and rename
    assert m.saves_seen == 40 and m.saves_timed == 40
    assert m.save_how.startswith("os.replace onto ") and m.save_how.endswith("checkpoint.pt")  # traceable
    assert m.settings["last_call_timeout"] == "2"


def test_forecast_reads_vet_json_and_prints_every_figure_with_its_source(tmp_path):
    (tmp_path / "vet.json").write_text(json.dumps(_vet_dict(RUNS / "vet_gauntlet")))
    made = forecast(measure(tmp_path), llama3_rates())
    text = render(made)
    assert "goodput" in text and "τ*" in text and "biggest lever:" in text
    assert "Meta, The Llama 3 Herd of Models" in text
    assert "save cost δ" in text and "measured" in text
    assert "kill-node was not vetted: its measured stand-in is kill-worker's recovery" in text
    data = made.as_dict()
    assert [s["nodes"] for s in data["scales"]] == [64, 512, 2048]
    assert all(0 < s["shares"]["goodput"] < 1 for s in data["scales"])
    json.dumps(data)  # plain data


def test_a_missing_or_wrong_vet_json_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no such file; run `sim vet`"):
        measure(tmp_path)
    (tmp_path / "vet.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a vet.json"):
        measure(tmp_path)


def _soak_history(kills=((20.0, 5.0), (45.0, 5.0), (70.0, 5.0))) -> list[dict]:
    """A job at 1 step/s, a checkpoint every 10 steps, killed at each (t, down): by default at t=20 (step 20), 45
    (step 40) and 70 (step 60, the last), each down 5 s (a recovery of 5.8 s: the fault's ok at +0.2 s, the next
    step at +6 s), resuming from the checkpoint just written."""
    records = [{"t": T0, "type": "run", "event": "start", "spec": {"nodes": 2, "nproc_per_node": 1}}]
    t, step, pid, n = T0, 0, 100, 0

    def start():
        for rank in (0, 1):
            records.append(
                {"t": t, "type": "worker", "event": "start", "node": f"node{rank}", "rank": rank, "pid": pid + rank}
            )

    start()
    for kill_at, down in kills:
        while t < T0 + kill_at - 1e-9:
            t, step, n = t + 1, step + 1, n + 1
            records += [
                {"t": t, "type": "worker", "event": "step", "node": f"node{r}", "rank": r, "pid": pid + r, "step": step}
                | {"n": n}
                for r in (0, 1)
            ]
        records.append({"t": t + 0.1, "type": "fault", "op": f"f{kill_at}", "fault": "kill-worker", "phase": "invoke"})
        records.append({"t": t + 0.2, "type": "fault", "op": f"f{kill_at}", "fault": "kill-worker", "phase": "ok"})
        t, pid, n = t + down, pid + 10, 0
        step = step // 10 * 10
        start()
    return records


def test_the_soak_measure_counts_the_steps_gained_between_the_first_fault_and_the_last():
    measured = soak_measure(RunModel(_soak_history()))
    assert measured.faults == 2
    assert measured.window_s == pytest.approx(50.0, abs=0.01)
    # step 20 at the first kill, 60 at the last: 40 steps of 1 s in 50 s (two recoveries of 5 s, nothing re-done)
    assert measured.step_s == pytest.approx(1.0)
    assert measured.steps == 40
    assert measured.goodput == pytest.approx(0.8)


def test_the_soak_prediction_is_the_model_at_the_soaks_rate():
    m = Measurements(step_s=1.0, kinds=(KindCost("kill-worker", 5.0),), save_s=0.0, interval_steps=10)
    predicted = soak_prediction(m, "kill-worker", faults=2, window_s=50.0)
    # restarts 2*5/50 = 0.2; re-done 2*(10/2)/50 = 0.2; goodput 0.6
    assert predicted.restarts == pytest.approx(0.2)
    assert predicted.redone == pytest.approx(0.2)
    assert predicted.goodput == pytest.approx(0.6)
    assert not math.isnan(predicted.checkpoint)


def test_the_pytest_plugins_sim_forecast_forecasts_a_vet_json(sim_forecast, tmp_path):
    (tmp_path / "vet.json").write_text(json.dumps(_vet_dict(RUNS / "vet_gauntlet")))
    made = sim_forecast(tmp_path / "vet.json", nodes=[512], gpus_per_node=4, mtbf_node="100d")
    (scale,) = made.scales
    assert (scale.nodes, scale.gpus) == (512, 2048)
    assert scale.per_day == pytest.approx(512 / 100)  # one failure per node per 100 days
    assert scale.levers and 0 < scale.shares.goodput < 1


def test_what_the_user_gives_replaces_the_vets_figure_and_is_named_given():
    m = with_given(Measurements(step_s=0.5, kinds=(KindCost("kill-worker", 5.0),)), save_s=20.0, interval_steps=600)
    assert (m.save_s, m.interval_s) == (20.0, 300.0)
    said = "\n".join(forecast(m, HAND_RATES, (100,), 8).assumptions)
    assert "save cost δ 20.000 s: GIVEN (--save-cost)" in said
    assert "checkpoint interval τ 600 steps = 300.0 s: GIVEN (--ckpt-every)" in said
    plain = "\n".join(forecast(with_given(HAND), HAND_RATES, (100,), 8).assumptions)
    assert "GIVEN" not in plain and "save cost δ 10.000 s: measured" in plain


def test_vet_forecast_goes_into_vet_json_and_vet_html(tmp_path):
    score = FaultScore("kill-node", "node crash", "survived", "the job goes on", recovery_s=360.0)
    vet = VetResult("train.py", "etcd-v2", 3, 1, (score,), (), 60.0)
    made = forecast(HAND, HAND_RATES, (100,), 8)
    write_outputs(vet, tmp_path, forecast=made)
    data = json.loads((tmp_path / "vet.json").read_text())
    assert data["forecast"]["scales"][0]["young_s"] == pytest.approx(848.528, abs=1e-3)
    page = (tmp_path / "vet.html").read_text()
    assert "Forecast at scale" in page and "14 min" in page
    write_outputs(vet, tmp_path / "plain")  # without --forecast: no forecast
    assert "forecast" not in json.loads((tmp_path / "plain" / "vet.json").read_text())


def test_check_refuses_a_vet_that_saw_no_save_before_anything_starts():
    from sim.vet.forecast_check import check_inputs

    m = Measurements(step_s=0.1, kinds=(KindCost("kill-worker", 5.0),))
    with pytest.raises(UsageError, match="the vet saw no checkpoint save .*--ckpt-every N"):
        check_inputs(m, "kill-worker", 60.0, 600.0)
    check_inputs(with_given(m, interval_steps=10), "kill-worker", 60.0, 600.0)  # given: it may run


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--nodes", "64,many"], "--nodes '64,many': give node counts"),
        (["--mtbf-node", "often"], "--mtbf-node 'often': not a time between failures"),
        (["--gpus-per-node", "0"], "--gpus-per-node 0: give 1 or more"),
        (["--ckpt-every", "0"], "--ckpt-every 0: give the steps between two saves"),
        (["--save-cost", "fast"], "duration 'fast': not a duration"),
        (["--check", "--every", "2s"], "--every 2s: too often to recover in between"),
        (["--check", "--soak", "1m"], "--soak 60s: shorter than two faults"),
        (["--check", "--check-kind", "partition"], "--check-kind partition: the vet did not measure it"),
        (["--check", "--remeasure", "11"], "--remeasure 11: give the faults that re-measure the inputs"),
        (["--rdzv-conf", "last_call=30"], "--rdzv-conf 'last_call=30': 'last_call=30' is not one of"),
        (["--rdzv-conf", "keep_alive_interval=0"], "--rdzv-conf 'keep_alive_interval=0'"),
    ],
)
def test_sim_forecast_bad_input_is_one_line_and_exit_2(argv, words, tmp_path, capsys, monkeypatch):
    from sim.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vet.json").write_text(json.dumps(_vet_dict(RUNS / "vet_gauntlet")))
    assert main(["forecast", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "forecast.json").exists()  # nothing half-made


def test_sim_forecast_prints_the_table_and_writes_forecast_json(tmp_path, capsys, monkeypatch):
    from sim.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vet.json").write_text(json.dumps(_vet_dict(RUNS / "vet_gauntlet")))
    (tmp_path / "pyproject.toml").write_text('[tool.elastic-sim.mtbf]\nkill-node = "100d"\n')
    assert main(["forecast", "--nodes", "100", "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "pyproject.toml [tool.elastic-sim.mtbf] (per node: kill-node 100d)" in out
    data = json.loads((tmp_path / "forecast.json").read_text())
    assert data["scales"][0]["per_day"] == pytest.approx(1.0)  # 100 nodes, each one loss in 100 days


def test_the_interval_is_the_common_gap_between_saved_steps_or_the_one_saved_step():
    assert interval_of([10, 20, 30, 10, 20, 50]) == 10  # resumed saves repeat a step; a gap over a fault is rare
    assert interval_of([50]) == 50  # the vet struck before the second save
    assert interval_of([]) is None


def test_the_check_judges_the_vets_forecast_and_the_model_given_the_soaks_own_recoveries():
    from sim.vet.forecast_check import judge

    m = Measurements(step_s=1.0, kinds=(KindCost("kill-worker", 1.0),), save_s=0.0, interval_steps=10)
    checked = judge(m, "kill-worker", 25.0, 7, RunModel(_soak_history()), "run")
    assert checked.measured.recovery_s == pytest.approx(5.8)  # the fault's ok (+0.2 s) to the next step (+6 s)
    # the vet's 1 s: restarts 2*1/50 = 0.04, re-done 2*5/50 = 0.2: 0.76 against the measured 0.8 (-5 %)
    assert checked.predicted.goodput == pytest.approx(0.76)
    assert checked.error == pytest.approx(-0.05) and checked.within
    # the soak's own 5.8 s: restarts 2*5.8/50 = 0.232: 0.568
    assert checked.given_soak.goodput == pytest.approx(0.568)
    line = checked.line()
    assert "goodput measured 80.0 %" in line and "forecast 76.0 %" in line and "-5.0 %, within 10 %" in line
    assert "given those, the model says 56.8 % (-29.0 %)" in line and "(the slowest 5.8 s)" in line


def test_each_soak_fault_strikes_a_training_job_a_seeded_gap_after_the_last_recovery():
    """A fault timed from the one before may land inside its recovery (seen: a 59 s "recovery" holding the next
    fault's), a cost the model does not charge that way: every fault waits for the job to be steady again."""
    from sim.vet.forecast_check import soak_scenario

    scenario = soak_scenario(6, "kill-worker", 60, 600, seed=3)
    first, *rest = scenario.steps
    assert (first.trigger.kind, first.trigger.value, first.trigger.lag_s) == ("recovered", 6, 0.0)
    assert rest and all(s.trigger.kind == "recovered" and s.trigger.value == 6 for s in rest)
    gaps = [s.trigger.lag_s for s in rest]
    assert all(30 <= g <= 90 for g in gaps) and sum(gaps[:-1]) < 600 <= sum(gaps)
    assert gaps == [s.trigger.lag_s for s in soak_scenario(6, "kill-worker", 60, 600, seed=3).steps[1:]]


def test_the_shipped_trainers_saves_are_measured_though_its_sgd_keeps_no_step():
    """The trainer's torch.save into its temp file, renamed into place: the instrumentation's save record carries no
    step (SGD's state holds none), so it is the step the job had reached when the save began: 10, 20, 30."""
    from sim.vet.forecast import save_costs

    from .histories import HistoryBuilder

    b = HistoryBuilder(nodes=2, nproc=1, steps=30, ckpt=10)
    b.start_workers()
    b.train(30, step_s=0.5)
    for line in [r for r in b.records if r.get("kind") == "checkpoint"]:
        b.records.append(
            {
                "t": line["t"] + 0.041,  # its rename; the save began after the step's progress line
                "type": "worker",
                "node": "node0",
                "event": "save",
                "rank": 0,
                "local_rank": 0,
                "world_size": 2,
                "restart": 0,
                "pid": 19,
                "run_id": "sim",
                "op": "os.replace",
                "path": line["path"],
                "began": line["t"] + 0.001,
                "seconds": 0.04,
                "n": line["step"],
            }
        )
    seconds, steps = save_costs(b.model())
    assert steps == [10, 20, 30] and seconds == pytest.approx([0.04, 0.04, 0.04])


# By hand: the vet ran the fast profile (last call 2 s, keep-alive 1 s × 3 = 3 s) on 3 of at most 3 nodes.
# At torch's defaults (last call 30 s, keep-alive 5 s × 3 = 15 s):
#   kill-worker: every node stays, the round is full: nothing waits a setting: 10.0 s as measured
#   kill-node:   its node leaves: rendezvous 2.5 + (30 - 2) = 30.5 s, detection 3.0 + (15 - 3) = 15.0 s,
#                recovery 12.0 + 28 + 12 = 52.0 s
#   at 100 nodes, a node loss every 10 h (1/36000 per s): restarts 52 / 36000 = 0.00144444
FAST = {"last_call_timeout": "2", "join_timeout": "120", "keep_alive_interval": "1", "keep_alive_max_attempt": "3"}
SETTINGS_HAND = Measurements(
    step_s=1.0,
    kinds=(
        KindCost("kill-worker", 10.0, {"detection_s": 1.0, "rendezvous_s": 1.0, "worker_start_s": 8.0}, 5),
        KindCost("kill-node", 12.0, {"detection_s": 3.0, "rendezvous_s": 2.5, "worker_start_s": 6.5}, 5),
    ),
    save_s=1.0,
    interval_steps=100,
    nodes=3,
    max_nodes=3,
    settings=FAST,
)


def test_the_phases_torchs_settings_fix_are_moved_to_the_settings_forecast_at():
    from sim.vet.forecast import TORCH_DEFAULTS, at_settings, parse_settings

    assert parse_settings("torch-defaults") == TORCH_DEFAULTS
    assert TORCH_DEFAULTS["last_call_timeout"] == "30" and TORCH_DEFAULTS["keep_alive_interval"] == "5"
    worker, node = at_settings(SETTINGS_HAND, TORCH_DEFAULTS).kinds
    assert (worker.recovery_s, worker.phases, worker.modelled) == (10.0, SETTINGS_HAND.kinds[0].phases, ())
    assert node.recovery_s == pytest.approx(52.0)
    assert node.phases == {"detection_s": 15.0, "rendezvous_s": 30.5, "worker_start_s": 6.5}
    assert node.modelled == (
        "rendezvous 2.5 s measured -> 30.5 s modelled (last call 2 s -> 30 s)",
        "detection 3.0 s measured -> 15.0 s modelled (keep-alive expiry 3 s -> 15 s)",
    )
    # Only the last call given: the keep-alive stays the vet's; a wait cannot take a phase below zero.
    (_, node) = at_settings(SETTINGS_HAND, parse_settings("last_call_timeout=1")).kinds
    assert node.recovery_s == pytest.approx(11.0) and node.phases["detection_s"] == 3.0
    # A vet below its most nodes waits the last call in every round, a worker crash's too.
    below = at_settings(dataclasses.replace(SETTINGS_HAND, max_nodes=4), TORCH_DEFAULTS)
    assert below.kinds[0].recovery_s == pytest.approx(38.0) and below.kinds[0].phases["rendezvous_s"] == 29.0
    # The forecast at them: the moved recovery is what the model charges.
    rates = FailureRates({"kill-node": 0.001}, "by hand")
    made = forecast(SETTINGS_HAND, rates, (100,), 8, TORCH_DEFAULTS)
    assert made.scales[0].shares.restarts == pytest.approx(52.0 / 36000)
    assert forecast(SETTINGS_HAND, rates, (100,), 8).scales[0].shares.restarts == pytest.approx(12.0 / 36000)
    text = render(made)
    assert "last_call_timeout=2 (torch's default 30)" in text and "modelled: rendezvous 2.5 s measured" in text
    assert made.as_dict()["measured"]["forecast_settings"] == TORCH_DEFAULTS


def test_a_slow_start_counts_only_the_seconds_its_throughput_was_measured_over():
    """The vet strikes again as soon as the job is steady: after node1's worker crash the job steps at 21, 22, 23
    (0.5 s apart: 1.0 s of training measured) and node0's worker is killed. By hand: 2 steps/s before, 1 step/s
    measured after; the old reading took that half speed for all of THROUGHPUT_WINDOW_S (10 s): 5.0 s lost; over
    the 1.0 s measured it is 1.0 × (1 - 1/2) = 0.5 s."""
    from sim.vet.forecast import THROUGHPUT_WINDOW_S, after_windows, slow_start

    from .histories import HistoryBuilder

    b = HistoryBuilder(nodes=2, nproc=1, steps=100)
    b.start_workers()
    b.train(20, step_s=0.5)
    b.fault("kill-worker", "node1", take_s=0.4, node="node1")
    invoked = next(r["t"] for r in reversed(b.records) if r.get("phase") == "invoke")
    b.group_failure()
    b.wait(1.0)
    b.start_workers(resumed_from=20)
    b.train(23, step_s=0.5)
    b.wait(0.5)
    b.fault("kill-worker", "node0", take_s=0.4, node="node0")
    b.end()
    run = b.model()
    fault = {"kind": "kill-worker", "t_fault": invoked, "throughput_before": 2.0, "throughput_after": 1.0}
    windows = after_windows({"faults": [fault]}, [run])
    assert windows == {invoked: pytest.approx(1.0)}
    assert slow_start(fault, THROUGHPUT_WINDOW_S) == 5.0  # the old reading
    assert slow_start(fault, windows[invoked]) == pytest.approx(0.5)
    # Without its run, vet.json's own times bound it: first step at t_fault + recovery_s, its end at t_end.
    alone = {**fault, "recovery_s": 4.0, "t_end": invoked + 5.5}
    assert after_windows({"faults": [alone]}, []) == {invoked: pytest.approx(1.5)}


def test_a_short_checkpoint_interval_is_not_said_as_every_0_s():
    """vet.html once read 'checkpoint every 53 s (Young's τ*) instead of every 0 s' for a 0.2 s interval."""
    from sim.vet.forecast import duration

    assert (duration(0.2), duration(9.94), duration(53), duration(600)) == ("0.2 s", "9.9 s", "53 s", "10 min")


def test_a_node_leaves_by_its_kinds_traits_not_a_list_of_names():
    """Issue 38: the kinds whose node leaves the job (the keep-alive expiry and the last call move with the
    settings) are read from the fault kinds: lost to the others, not back at once. A pause (a frozen agent's
    keep-alive stops too; the vet undoes it once the others regrouped, as a partition) was missing from the list."""
    from sim.core.faultkinds import PROVOCATIONS
    from sim.vet.forecast import TORCH_DEFAULTS, at_settings, node_leaves

    leaving = {kind for kind in PROVOCATIONS if node_leaves(kind)}
    assert leaving == {"kill-node", "stop-node", "partition", "kill-agent", "pause", "store-host-loss"}
    assert not node_leaves("restart-node") and not node_leaves("kill-worker") and not node_leaves("no-such-kind")
    pause = KindCost("pause", 12.0, {"detection_s": 3.0, "rendezvous_s": 2.5, "worker_start_s": 6.5}, 5)
    (moved,) = at_settings(dataclasses.replace(SETTINGS_HAND, kinds=(pause,)), TORCH_DEFAULTS).kinds
    assert moved.phases == {"detection_s": 15.0, "rendezvous_s": 30.5, "worker_start_s": 6.5}


def test_every_kind_the_forecasts_tables_name_is_a_vetted_kind():
    """Llama 3's categories, the stand-ins and the words name kinds `sim vet --faults` takes (and a kind there):
    a renamed kind fails here, not as a rate no measurement ever matches."""
    from sim.core.faultkinds import PROVOCATIONS, UNKNOWN, kind_of
    from sim.vet.forecast import KIND_WORDS, STAND_INS

    named = {c.kind for c in LLAMA3} | set(STAND_INS) | {k for ks in STAND_INS.values() for k in ks} | set(KIND_WORDS)
    assert named <= set(PROVOCATIONS), named - set(PROVOCATIONS)
    assert all(kind_of(PROVOCATIONS[name].fault) is not UNKNOWN for name in named)


# The re-measure (kills at steps 10, 20 and 30, down 2, 8 and 3 s: recoveries 2.8, 8.8 and 3.8 s) before a soak like
# _soak_history's (kills at t=53, 78 and 103, at steps 40, 60 and 80, down 5 s each: recoveries 5.8 s); 1 step/s,
# a checkpoint every 10 steps.
REMEASURED_SOAK = ((10.0, 2.0), (22.0, 8.0), (40.0, 3.0), (53.0, 5.0), (78.0, 5.0), (103.0, 5.0))


def test_the_remeasure_is_the_median_of_the_first_faults_recoveries_and_its_segments_step_time():
    from sim.vet.forecast import remeasure

    run = RunModel(_soak_history(REMEASURED_SOAK))
    vet = Measurements(step_s=2.0, kinds=(KindCost("kill-worker", 27.7, {"first_step_s": 9.0}, 3),), interval_steps=10)
    again = remeasure(vet, run, "kill-worker", 3)
    assert again.samples == pytest.approx((2.8, 8.8, 3.8))  # the soak's own 5.8 s recoveries are not in it
    assert again.cost.recovery_s == pytest.approx(3.8)  # the median, not the mean (5.13): one slow restart outvoted
    assert again.cost.slow_s == 0.0 and again.cost.steps_lost == 3  # the vet's restarts and steps lost are kept
    assert again.step_s == pytest.approx(1.0) and again.until == pytest.approx(T0 + 53.1)
    judged = again.applied(vet)
    assert judged.cost("kill-worker")[0].recovery_s == pytest.approx(3.8) and judged.step_s == pytest.approx(1.0)
    assert judged.interval_steps == 10  # the job's own interval, as the vet saw it
    assert remeasure(vet, run, "kill-worker", 0) is None  # --remeasure 0: the vet's inputs stand


def test_the_soaks_goodput_window_begins_after_the_remeasures_faults():
    run = RunModel(_soak_history(REMEASURED_SOAK))
    measured = soak_measure(run, skip=3)
    # from the kill at 53 (step 40) to the one at 103 (step 80): 40 steps of 1 s in 50 s; two faults of 5.8 s
    assert (measured.faults, measured.steps) == (2, 40)
    assert measured.window_s == pytest.approx(50.0, abs=0.01)
    assert measured.goodput == pytest.approx(0.8) and measured.recovery_s == pytest.approx(5.8)
    whole = soak_measure(run)  # the old window: from the re-measure's first kill, its recoveries in it
    assert whole.faults == 5 and whole.recovery_s != pytest.approx(5.8)
    with pytest.raises(UsageError, match=r"struck 1 fault\(s\) after the re-measure's 5: it needs two or more"):
        soak_measure(run, skip=5)


def test_the_check_judges_the_forecast_from_the_remeasured_inputs_and_prints_the_vets_beside_it():
    from sim.vet.forecast_check import judge

    vet = Measurements(step_s=1.0, kinds=(KindCost("kill-worker", 27.7),), save_s=0.0, interval_steps=10)
    checked = judge(vet, "kill-worker", 25.0, 4, RunModel(_soak_history(REMEASURED_SOAK)), "run", 3)
    assert checked.inputs == "remeasured" and checked.remeasured.cost.recovery_s == pytest.approx(3.8)
    # re-measured, 3.8 s: restarts 2*3.8/50 = 0.152, re-done 2*5/50 = 0.2: 0.648 against the measured 0.8 (-19 %)
    assert checked.predicted.goodput == pytest.approx(0.648)
    assert checked.error == pytest.approx(-0.19) and not checked.within
    # the vet's 27.7 s: restarts 2*27.7/50 = 1.108: all the time lost, 0 (-100 %)
    assert checked.vet_predicted.goodput == 0.0 and checked.vet_error == pytest.approx(-1.0)
    line = checked.line()
    assert line.startswith(
        "check: inputs re-measured on the soak's cluster just before it: kill-worker 3.8 s + 0.0 s slow start "
        "(median of 3 of 3: 2.8, 8.8, 3.8 s), step 1.000 s; the vet's: 27.7 s + 0.0 s slow start, step 1.000 s\n"
    )
    assert "check: 2 kill-worker faults in 50 s" in line and "forecast 64.8 %" in line
    assert "-19.0 %, NOT within 10 %" in line
    assert "from the vet's own inputs the forecast is 0.0 % (-100.0 %, not within 10 %; not judged" in line
    data = checked.as_dict()
    assert data["inputs"] == "remeasured" and data["remeasured"]["samples"] == pytest.approx([2.8, 8.8, 3.8])
    assert data["error"] == pytest.approx(-0.19) and data["vet_error"] == pytest.approx(-1.0)
    assert data["measured"]["faults"] == 2 and not data["vet_within"]
    json.dumps(data)  # forecast.json takes it

    plain = judge(vet, "kill-worker", 25.0, 4, RunModel(_soak_history()), "run")  # --remeasure 0
    assert plain.inputs == "vet" and plain.vet_predicted is None and plain.as_dict()["remeasured"] is None
    assert plain.line().startswith("check: inputs: the vet's (kill-worker 27.7 s + 0.0 s slow start, step 1.000 s")
    none_seen = dataclasses.replace(plain, remeasure_asked=3)  # asked, but none of its faults reached a first step
    assert "of the 3 faults struck to re-measure them before the soak, none reached a first step" in none_seen.line()


def test_the_remeasures_faults_come_first_each_after_a_whole_throughput_window_and_keep_the_soaks_gaps():
    from sim.vet.forecast_check import soak_scenario

    plain = soak_scenario(6, "kill-worker", 60, 600, seed=3)
    again = soak_scenario(6, "kill-worker", 60, 600, seed=3, remeasure=3)
    assert len(again.steps) == len(plain.steps) + 3
    assert all((s.trigger.kind, s.trigger.lag_s) == ("recovered", 10.0) for s in again.steps[:4])
    assert [s.trigger.lag_s for s in again.steps[4:]] == [s.trigger.lag_s for s in plain.steps[1:]]
    assert again.timeout_s > plain.timeout_s


def test_check_refuses_a_remeasure_out_of_range_before_anything_starts():
    from sim.vet.forecast_check import check_inputs

    m = Measurements(step_s=0.1, kinds=(KindCost("kill-worker", 5.0),), interval_steps=10)
    with pytest.raises(UsageError, match=r"--remeasure -1: give the faults .* 0 to 10 \(default 3; 0 judges"):
        check_inputs(m, "kill-worker", 60.0, 600.0, -1)
    check_inputs(m, "kill-worker", 60.0, 600.0, 0)
