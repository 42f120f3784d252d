"""Scripts that know nothing of elastic-sim (tests/scripts/: plain text, their own checkpoints,
torch defaults in the script) under real faults, as a user would run them: a scenario file next
to the script with `cluster.script`, a worker SIGKILL then a node loss, then the job runs to its
end. The verdict and the diagnoses must say what happened, from torch's own events and the node
image's instrumentation, with no change to the scripts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.pytest_plugin import assert_verdict

pytestmark = pytest.mark.docker

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
STEP_LOSS = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"


def scenario_file(
    tmp_path: Path,
    name: str,
    script: str,
    *,
    backend: str,
    progress: str | None = None,
    steps: str = "",
    script_args: tuple[str, ...] = ("--steps", "160"),
) -> Path:
    """A scenario as a user writes one beside their script."""
    lines = [
        f"name: {name}",
        f"description: {script} under faults, unchanged",
        "cluster:",
        "  nodes: 3",
        "  nproc_per_node: 1",
        "  max_restarts: 3",
        f"  rdzv_backend: {backend}",
        f"  script: {SCRIPTS / script}",
        f"  script_args: [{', '.join(repr(a) for a in script_args)}]",
    ]
    if progress:
        lines.append(f"  progress: '{progress}'")
    lines += [
        "profile: fast",
        "seed: 3",
        "steps:",
        steps or DEFAULT_STEPS,
        "expect:",
        "  outcome: recovers",
        "timeout: 5m",
    ]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


# A worker crash, then (once training runs again) the loss of a node that is not the c10d store host.
DEFAULT_STEPS = """\
  - fault: kill-worker
    target: node1
    at: {step: 25}
  - fault: kill-node
    target: node2
    at: {after: 15s}"""

# script, progress regex the user passes (None: the zero-change path, instrumentation only)
CORPUS = [
    ("ddp_sgd.py", None),  # SGD keeps no step count: recovery from optimizer hooks, steps lost n/a
    ("dcp_ckpt.py", STEP_LOSS),
    ("collectives_only.py", r"iter (?P<step>\d+)"),  # no optimizer at all
    ("elastic_sampler.py", STEP_LOSS),
]


def _recoveries_measured(result) -> None:
    recovery = result.verdict.result("recovery")
    assert recovery.measured, result.summary
    assert len(result.verdict.recoveries) == 2, result.summary
    for each in result.verdict.recoveries:
        assert each.recovery_s is not None and each.recovery_s < 60, result.summary


# `make test` runs each script once, the backends alternating; `make test-full` every pair.
CASES = [
    pytest.param(
        script,
        progress,
        backend,
        id=f"{script}-{backend}",
        marks=() if (i + j) % 2 == 0 else pytest.mark.full,
    )
    for i, (script, progress) in enumerate(CORPUS)
    for j, backend in enumerate(["etcd-v2", "c10d"])
]


@pytest.mark.parametrize("script, progress, backend", CASES)
def test_plain_script_survives_worker_and_node_loss(sim_scenario, docker, images, tmp_path, script, progress, backend):
    name = "own-" + script.removesuffix(".py").replace("_", "-")
    (result,) = sim_scenario(str(scenario_file(tmp_path, name, script, backend=backend, progress=progress)))
    assert_verdict(result)
    _recoveries_measured(result)
    progress_check = result.verdict.result("progress")
    if progress is None:
        assert not progress_check.measured and "--progress-regex" in progress_check.reasons[0]
    else:
        assert progress_check.measured and progress_check.metrics.step_source == "script"
    assert "Training seen through" in result.summary
    # Devices emulated (no GPU here), but the script asked for gloo: the report says whose timing held.
    assert "failure timing gloo's (at once): the script asked for gloo" in result.summary, result.summary


def test_model_only_checkpoint_is_caught_as_a_loss_jump(sim_scenario, docker, images, tmp_path):
    """Adam's state not saved: the resumed loss jumps, the verdict fails on it and says why."""
    path = scenario_file(
        tmp_path,
        "own-model-only",
        "model_only_ckpt.py",
        backend="etcd-v2",
        progress=STEP_LOSS,
        steps="  - fault: kill-worker\n    target: node1\n    at: {step: 45}",
    )
    (result,) = sim_scenario(str(path))
    loss = result.verdict.result("loss_continuity")
    assert loss.measured and not loss.valid, result.summary
    assert "[loss-jump]" in result.summary, result.summary  # the diagnosis: optimizer state not restored


def test_shared_store_restart_loop_is_diagnosed(sim_scenario, docker, images, tmp_path):
    """torch 2.13 at its defaults (the rendezvous TCP store shared with the workers, no opt-out):
    a plain gloo script with two workers per node loses restarts after one worker's SIGKILL.
    The restarted rounds are refused (connectFullMesh) or hang in init_process_group, each burning a
    restart, and the verdict names the cause and the fix. (With one worker per node and fast
    rendezvous timings the refusal is a start-up race a quiet machine can win: not used here.)"""
    path = tmp_path / "shared-store.yaml"
    path.write_text(f"""\
name: own-shared-store
description: a plain gloo script at torch defaults loses a worker
cluster:
  nodes: 2
  nproc_per_node: 2
  max_restarts: 2
  rdzv_backend: etcd-v2
  script: {SCRIPTS / "ddp_sgd.py"}
  script_args: ["--steps", "200"]
profile: torch-defaults
seed: 3
steps:
  - fault: kill-worker
    target: node1
    at: {{step: 15}}
expect:
  outcome: recovers
timeout: 2m
""")
    (result,) = sim_scenario(str(path))
    # A restarted round that reads the stale store is refused or hangs; a later round can win the race and
    # finish (seen once in CI, its third round), so the outcome is not the claim. Nor is the count of burned
    # restarts: gloo's connect gives up after its own timeout (30 s; 50 s seen under load), so the refused
    # round may still be failing when the scenario ends (seen: refused at +51 s, no restart burned yet).
    # The claim is the restarted round's failure, named with its cause, its evidence and the fix.
    assert "[shared-tcp-store]" in result.summary, result.summary
    refused = "connectFullMesh failed ... Connection refused" in result.summary
    hung = "A restarted worker group never trained" in result.summary
    assert refused or hung, result.summary
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in result.summary, result.summary
