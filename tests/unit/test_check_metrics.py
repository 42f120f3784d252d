"""Each checker's metrics are a frozen class of its own that checks its fields' types, read as fields by the
report and the timeline; report.json's "metrics" keep their keys."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim.core.history import History
from sim.verdict import (
    AgentEnd,
    FailsCleanlyMetrics,
    Metrics,
    ProgressMetrics,
    RecoveryMetrics,
    StalledMetrics,
)
from sim.verdict.checkers import CHECKERS, RunSpec, check_all
from sim.verdict.report import build_report
from sim.verdict.runmodel import RunModel

RUNS = Path(__file__).resolve().parent.parent / "data" / "runs"

# report.json's metric keys per check, as they were when metrics were dicts.
KEYS = {
    "trained": {"training_seen", "first_training_t"},
    "completed": {"final_step", "excused_nodes"},
    "restart_budget": {"per_node"},
    "world_size": {"world_sizes"},
    "ranks": {"cohorts"},
    "progress": {"steps_lost", "final_step", "step_source", "step_efficiency", "zombie_records"},
    "loss_continuity": {"relative_jumps"},
    "stale_checkpoint": {"stale_writes", "lost"},
    "single_group": {"split_groups"},
    "hang": {"longest_gap_s"},
    "recovery": {"recoveries"},
    "fails_cleanly": {"exits", "ended"},
    "stalled": {"stalled_s", "after_op"},
}
CHECKPOINT_KEYS = ({"damaged_steps"}, {"damaged_files"})  # by the trainer's steps, or by any script's files


def _run(case: str) -> RunModel:
    return RunModel(History(RUNS / case / "history.jsonl").read().records)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("corrupt_checkpoint", "recovers"),
        ("oom_worker", "fails"),
        ("hang_default_ddp", "hangs"),
        ("vet_gauntlet", None),
    ],
)
def test_every_checker_gives_its_typed_metrics_and_report_json_keeps_their_keys(case, expected):
    run = _run(case)
    spec = RunSpec.from_run(run, **({"expected": expected} if expected else {}))
    verdict = check_all(run, spec, only=tuple(CHECKERS))
    assert all(isinstance(r.metrics, Metrics) for r in verdict.results)
    data = json.loads(json.dumps(build_report(verdict, run, title="t", profile=None).to_json(), default=str))
    for check in data["checks"]:
        keys = set(check["metrics"])
        if check["name"] == "checkpoint_integrity":
            assert keys in CHECKPOINT_KEYS
        elif check["name"] == "fails_cleanly" and "trained_on" in keys:
            assert keys == KEYS["fails_cleanly"] | {"trained_on"}  # nodes that trained on: only then, a key more
        elif check["name"] == "stalled" and check["metrics"]["stalled_s"] is None:
            assert keys == {"stalled_s"}  # no fault: no after_op, as before
        else:
            assert keys == KEYS[check["name"]], check["name"]


def test_fails_cleanly_metrics_are_read_as_fields_by_the_timeline():
    run = _run("oom_worker")
    verdict = check_all(run, RunSpec.from_run(run, expected="fails"))
    ended = verdict.result("fails_cleanly").metrics.ended
    assert ended and all(isinstance(e, AgentEnd) for e in ended.values())
    rows = build_report(verdict, run, title="t", profile=None).job_end
    assert sum(row.agents_ended for row in rows) == sum(e.after_op is not None for e in ended.values())


@pytest.mark.parametrize(
    "build",
    [
        lambda: ProgressMetrics(
            steps_lost={}, final_step="12", step_source="trainer", step_efficiency=None, zombie_records=0
        ),
        lambda: ProgressMetrics(
            steps_lost={"op-1": 1.5}, final_step=12, step_source="trainer", step_efficiency=None, zombie_records=0
        ),
        lambda: RecoveryMetrics(recoveries=[]),  # a list: the metrics are frozen, so tuples
        lambda: FailsCleanlyMetrics(exits={"node0": "exited 1"}, ended={"node0": {"after_op": None}}),
        lambda: StalledMetrics(stalled_s=True),
    ],
)
def test_metrics_refuse_a_value_of_the_wrong_type(build):
    with pytest.raises(TypeError, match="not a"):
        build()


def test_metrics_are_frozen_and_to_json_leaves_out_only_what_it_names():
    metrics = StalledMetrics(stalled_s=12.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        metrics.stalled_s = 1.0  # type: ignore[misc]
    assert metrics.to_json() == {"stalled_s": 12.5}
    assert StalledMetrics(stalled_s=None, after_op="op-1").to_json() == {"stalled_s": None, "after_op": "op-1"}
