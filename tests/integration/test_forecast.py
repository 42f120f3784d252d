"""`sim vet --forecast` and `sim forecast` end to end: a real vet's measurements (the instrumentation's save
records around the script's own torch.save, its steps, a real recovery) become the forecast at scale.

`sim forecast --check` (a ten-minute soak) is not here: it is run by hand (docs/FORECAST.md, "Measured")."""

from __future__ import annotations

import json

from tests.conftest import ROOT, run_sim, unique_name

SCRIPTS = ROOT / "tests" / "scripts"


def test_vet_forecast_measures_the_saves_and_steps_of_a_plain_script_and_forecasts_it(images, tmp_path):
    """fixed_name_ckpt.py saves every 2 steps of 0.1 s: the forecast must find that interval, a save cost from
    the instrumentation's save records, the step time and the worker crash's recovery, and print the table.
    (Every 10 steps, a loaded CI machine once had the vet strike and end before step 10: no save to measure.)"""
    result = run_sim(
        "vet",
        str(SCRIPTS / "fixed_name_ckpt.py"),
        "--faults",
        "kill-worker",
        "--parallel",
        "1",
        "--forecast",
        "--name",
        unique_name("vet-fc"),
        "--out",
        str(tmp_path),
        "--",
        "--steps",
        "100000",
        "--ckpt-every",
        "2",
        "--pg-timeout",
        "10",
        timeout=420,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "vet.json").read_text())
    measured = data["forecast"]["measured"]
    assert measured["interval_steps"] == 2, measured
    assert 0 < measured["save_s"] < 5, measured  # torch.save + fsync + rename of a small model, measured
    assert measured["save_how"].startswith("os.replace onto ") and measured["saves_timed"] >= 1, measured
    assert 0.1 <= measured["step_s"] < 1.0, measured  # --step-time 0.1 plus the step
    assert [k["kind"] for k in measured["kinds"]] == ["kill-worker"]
    scales = data["forecast"]["scales"]
    assert [s["nodes"] for s in scales] == [64, 512, 2048]
    assert all(0 < s["shares"]["goodput"] < 1 and s["young_s"] and s["levers"] for s in scales)
    assert "biggest lever:" in result.stdout and "Llama 3" in result.stdout
    assert "Forecast at scale" in (tmp_path / "vet.html").read_text()

    again = run_sim(
        "forecast",
        str(tmp_path),
        "--nodes",
        "512",
        "--mtbf-node",
        "100d",
        "--rdzv-conf",
        "torch-defaults",
        "--out",
        str(tmp_path / "f"),
    )
    assert again.returncode == 0, again.stdout + again.stderr
    made = json.loads((tmp_path / "f" / "forecast.json").read_text())
    (scale,) = made["scales"]
    assert abs(scale["per_day"] - 5.12) < 1e-9  # 512 nodes, each failing once in 100 days
    assert made["measured"]["forecast_settings"]["last_call_timeout"] == "30"  # torch's, named beside the vet's
    assert "last_call_timeout=2 (torch's default 30)" in again.stdout
