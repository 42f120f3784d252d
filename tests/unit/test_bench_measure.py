"""bench/recovery.py's repetitions: interleaved sides, medians, and a figure both sides fail not repeated."""

import json

import bench.recovery as recovery
from bench.recovery import Case, Sample, Unrecovered, measure


def _sides(monkeypatch, bare, sim):
    calls = []

    def side(name, outcomes):
        def run(*args):
            calls.append(name)
            outcome = outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return Sample(outcome)

        return run

    monkeypatch.setattr(recovery, "run_bare", side("bare", list(bare)))
    monkeypatch.setattr(recovery, "run_sim", side("sim", list(sim)))
    return calls


def test_sides_alternate_and_the_ratio_is_of_medians(monkeypatch):
    calls = _sides(monkeypatch, bare=[10.0, 12.0, 11.0], sim=[11.0, 13.0, 12.0])
    row = measure(Case("worker-kill", "c10d", "fast"), 3, docker=None, etcd=None)
    assert calls == ["bare", "sim", "sim", "bare", "bare", "sim"]
    assert (row["bare_s"], row["sim_s"], row["ratio"]) == (11.0, 12.0, 1.09)
    assert row["notes"] == []


def test_a_figure_both_sides_fail_is_not_repeated(monkeypatch):
    calls = _sides(monkeypatch, bare=[Unrecovered("no step at world 3")], sim=[Unrecovered("no recovery")])
    row = measure(Case("scale-up", "c10d", "torch-defaults"), 3, docker=None, etcd=None)
    assert calls == ["bare", "sim"]
    assert row["ratio"] is None and row["reps"] == {"bare": 0, "sim": 0}
    assert row["notes"][-1] == "both sides failed in repetition 1: not repeated"


def test_one_side_failing_once_does_not_stop_the_repetitions(monkeypatch):
    calls = _sides(monkeypatch, bare=[Unrecovered("slow"), 10.0, 10.0], sim=[11.0, 11.0, 11.0])
    row = measure(Case("node-loss", "etcd-v2", "fast"), 3, docker=None, etcd=None)
    assert len(calls) == 6 and row["reps"] == {"bare": 2, "sim": 3} and row["ratio"] == 1.1


def test_a_rerun_of_some_figures_replaces_only_their_rows(tmp_path):
    from bench.common import save_results
    from bench.recovery import measures

    out = tmp_path / "results.json"
    row = {"figure": "worker-kill", "backend": "c10d", "profile": "fast", "ratio": 1.0}
    save_results(out, "startup", [{"figure": "start-up"}])
    save_results(out, "recovery", [row, {**row, "backend": "etcd-v2"}], same=measures)
    save_results(out, "recovery", [{**row, "ratio": 0.9}, {**row, "figure": "node-loss"}], same=measures)
    found = json.loads(out.read_text())
    assert found["startup"] == [{"figure": "start-up"}]
    assert [(r["figure"], r["backend"], r["ratio"]) for r in found["recovery"]] == [
        ("worker-kill", "c10d", 0.9),
        ("worker-kill", "etcd-v2", 1.0),
        ("node-loss", "c10d", 1.0),
    ]
