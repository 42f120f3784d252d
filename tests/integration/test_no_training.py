"""No PASS without training, and an `up` that ends when the job cannot finish: scripts written the way users
write them (tests/scripts/), run as a user runs them (`sim up --script`, a scenario file beside the script,
`sim vet`), on real clusters. Each case is the shape of a job that once got a wrong verdict: PASS for a job that
exited 0 before training, and an `up` that followed a job for minutes after it could no longer finish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_sim, unique_name

pytestmark = pytest.mark.docker

SCRIPTS = ROOT / "tests" / "scripts"


def _run_dir(stdout: str) -> Path:
    """The run folder the report's files are in (its "Files:" lines)."""
    line = next(line for line in stdout.splitlines() if line.strip().endswith("report/report.json"))
    return Path(line.strip()).parent.parent


def test_up_of_a_job_that_exits_0_before_training_is_a_fail_quoting_its_last_line(images):
    """no_data_exit.py looks for /data/train.bin, does not find it, says so and exits 0 on every rank: the old
    verdict was `PASS (expected: the job recovers)`."""
    name = unique_name("t-nodata")
    try:
        result = run_sim(
            "up", "--name", name, "--nodes", "2", "--nproc-per-node", "1", "--script", str(SCRIPTS / "no_data_exit.py"),
            timeout=400,
        )  # fmt: skip
        out = result.stdout
        assert result.returncode == 1, out + result.stderr
        headline = next(line for line in out.splitlines() if "(expected: the job recovers)" in line)
        assert headline.endswith(": FAIL (expected: the job recovers)"), out
        assert "the job ended without training: no optimizer step and no collective call" in out, out
        flat = " ".join(out.split())
        assert "[ended-without-training]: The job ended without training: every rank exited 0 after " in flat, out
        assert "'no data at /data/train.bin, exiting'" in flat and "--mount" in flat, out
        # The logs were saved for the report: a later `sim report` quotes the line too.
        report = json.loads((_run_dir(out) / "report" / "report.json").read_text())
        assert report["verdict"] == "FAIL" and report["diagnoses"][0]["code"] == "ended-without-training"
        again = run_sim("report", name)
        assert again.returncode == 1 and "no data at /data/train.bin, exiting" in again.stdout, again.stdout
    finally:
        run_sim("down", name)


def test_a_scenario_on_a_job_that_never_trains_fails_and_says_the_fault_never_struck(sim_scenario, images, tmp_path):
    """accelerator_gate.py, today's PyTorch-example shape: it asks torch.accelerator for 2 devices per node; with one
    worker per node it gets at most one (emulated or not) and exits 0 at once. A scenario that kills a worker at
    step 5 never fires: the runner's verdict is FAIL, the job never trained, and why the step never struck is in
    words."""
    path = tmp_path / "gate.yaml"
    path.write_text(f"""\
name: accelerator-gate
description: a device-generic trainer whose gate fails on these nodes
cluster:
  nodes: 2
  nproc_per_node: 1
  rdzv_backend: etcd-v2
  script: {SCRIPTS / "accelerator_gate.py"}
profile: fast
steps:
  - fault: kill-worker
    target: node1
    at: {{step: 5}}
expect:
  outcome: recovers
timeout: 3m
""")
    (result,) = sim_scenario(str(path))
    assert not result.passed and not result.verdict.valid, result.summary
    trained = result.verdict.result("trained")
    assert not trained.valid and trained.reasons[0].startswith("the job ended without training"), result.summary
    assert "Unable to locate sufficient 2 gpus to run this example. Exiting." in result.summary
    assert result.unfired.startswith("kill-worker node1 (line 10) never struck: waiting for the job reaching step 5")
    assert "the job never trained" in result.unfired and "trigger" not in result.unfired, result.unfired


def test_vet_of_a_job_that_never_trains_stops_before_the_first_fault_in_one_line(images, tmp_path):
    """The old vet scored its faults against a job that did nothing (a scorecard of MISSes)."""
    script = str(SCRIPTS / "no_data_exit.py")
    name = unique_name("t-vnd")
    result = run_sim(
        "vet", script, "--faults", "kill-worker", "--nodes", "2", "--name", name, "--out", str(tmp_path), timeout=400
    )
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("sim vet: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "sim vet: error: the job never trained, so no fault was run: the job ended without training: every rank "
        "exited 0 after 'no data at /data/train.bin, exiting'; `python -m sim report "
    ), result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "vet.json").exists()
    # No fault was run: the runner's "[chaos] kill-worker node1" (it fires) never came, and it says why in words.
    assert "[chaos] kill-worker node1" not in result.stdout.splitlines(), result.stdout
    assert "[chaos] kill-worker node1 never struck: waiting for training steady at world size 2" in result.stdout


def test_up_ends_when_an_agent_gave_up_and_its_peer_waits_in_init(images):
    """config_keyerror.py: node1 raises KeyError at every start (its host is not in the script's settings table),
    2 nodes, --max-restarts 1, torch defaults. node1's agent uses its restart and exits; node0's worker waits in
    init_process_group for it, up to torch's 30-minute default. The old `up` followed that wait with no verdict;
    now it ends a hang window later: the KeyError and its line first, what node0 waits for, exit 1, the cluster
    kept."""
    name = unique_name("t-keyerr")
    try:
        result = run_sim(
            "up", "--name", name, "--nodes", "2", "--nproc-per-node", "1", "--max-restarts", "1",
            "--script", str(SCRIPTS / "config_keyerror.py"), timeout=480,
        )  # fmt: skip
        out = result.stdout
        assert result.returncode == 1, out + result.stderr
        assert "stopped following: the job cannot finish (its nodes still run)" in out, out
        lines = out.splitlines()
        head = next(i for i, line in enumerate(lines) if line.endswith(": FAIL (expected: the job recovers)"))
        assert lines[head + 1] == "  first cause: The script fails at every start: KeyError: 'node1'", out
        assert "config_keyerror.py:25 in main" in lines[head + 2], out
        assert lines[head + 3].startswith("  the job cannot finish: node1's agent gave up at "), out
        assert lines[head + 4] == (
            "  node0's worker waits in init_process_group for a peer that is gone; torch's default process-group "
            "timeout would let it wait 30 min (unless the script gave one)"
        ), out
        assert "stays as it is (its other nodes still wait)" in out, out
        status = run_sim("status", name)
        assert status.returncode == 0 and "node0" in status.stdout, status.stdout + status.stderr
    finally:
        run_sim("down", name)
