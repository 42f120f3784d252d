"""`sim tune` end to end, small: two points of the grid on two real clusters at once (real etcd, torchrun, a
plain third-party DDP script whose --pg-timeout the tune finds and sets), a worker crash and a node crash each,
within a budget of a few minutes. The full grid's example run is docs/TUNE.md's."""

from __future__ import annotations

import json

from tests.conftest import ROOT, unique_name

SCRIPT = ROOT / "tests" / "scripts" / "fixed_name_ckpt.py"


def test_tune_tries_two_points_on_real_clusters_and_recommends_the_fastest_safe_one(images, sim_tune, tmp_path):
    result = sim_tune(
        SCRIPT,
        budget="8m",
        faults="kill-worker,kill-node",
        keep_alive="4x3",
        last_call="2,5",
        pg_timeout="10",
        name=unique_name("tune"),
        out_dir=tmp_path,
        script_args=["--steps", "100000"],
    )
    # The script's own option was found and set on every point.
    assert (result.pg.how, result.pg.name) == ("arg", "--pg-timeout")
    assert [p.settings.last_call_timeout for p in result.points] == [2, 5]
    assert all(p.scores and p.run_dirs for p in result.points), [p.verdict() for p in result.points]
    # Each point's figures are the vet's own: every kind scored from its cluster's history.
    for p in result.points:
        assert [f.kind for f in p.scores] == ["kill-worker", "kill-node"], p.verdict()
    assert result.best is not None, "\n".join(f"{p.settings.label()}: {p.verdict()}" for p in result.points)
    qualified = [p for p in result.points if p.qualifies]
    assert result.best.total_s == min(p.total_s for p in qualified)
    s = result.best.settings
    conf = f"last_call_timeout={s.last_call_timeout}"
    assert conf in result.torchrun and "--pg-timeout 10" in result.torchrun
    assert "--monitor-interval 0.1" in result.torchrun
    assert f"{{key: last_call_timeout, value: '{s.last_call_timeout}'}}" in result.k8s
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["recommended"]["last_call_timeout"] == s.last_call_timeout
    assert len(data["points"]) == 2 and all(p["run_dirs"] for p in data["points"])
    assert "Recommended" in (tmp_path / "tune.html").read_text()
