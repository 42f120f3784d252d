"""GPU training scripts (tests/scripts/: nccl backend, set_device, device_ids, cuda map_location, AMP,
FSDP2 on a CUDA device mesh), unchanged, on CPU-only nodes with devices emulated, under a worker SIGKILL
then a node loss. Under NCCL's failure timing a node loss holds the survivors in their collective until
the script's timeout=, then the watchdog aborts them and torchrun regroups: the report says the devices
were emulated, lists the emulated calls, and names nccl-dead-peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.pytest_plugin import assert_verdict

pytestmark = pytest.mark.docker

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
STEP_LOSS = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"
EMULATED = "devices emulated on CPU (1 per node), NCCL → gloo"


def test_tutorial_ddp_script_survives_a_worker_kill_and_a_node_loss_with_nccl_timing(sim_scenario, docker, images):
    """multinode_ddp.py passes timeout=20 s: the node loss costs the survivors those 20 s (NCCL's
    timing), not gloo's instant error."""
    (result,) = sim_scenario(str(SCRIPTS / "multinode-ddp-node-loss.yaml"))
    assert_verdict(result)
    kill_worker, kill_node = result.verdict.recoveries
    assert kill_worker.recovery_s is not None and kill_node.recovery_s is not None, result.summary
    assert kill_node.recovery_s >= 19.0, result.summary  # held for the 20 s timeout before the regroup
    assert EMULATED in result.summary and "failure timing NCCL's" in result.summary
    for call in ("init_process_group(nccl)", "torch.cuda.set_device", "DDP(device_ids=)", "Tensor.to(cuda)"):
        assert call in result.summary, result.summary
    assert "torch.load(map_location=cuda)" in result.summary, result.summary  # the snapshot resumed
    assert "[nccl-dead-peer]" in result.summary and "timeout= to init_process_group" in result.summary


def scenario(tmp_path: Path, name: str, script: str, script_args: list[str]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "\n".join(
            [
                f"name: {name}",
                f"description: {script}, a GPU script, unchanged on emulated devices with gloo's failure timing",
                "cluster:",
                "  nodes: 3",
                "  nproc_per_node: 1",
                "  max_restarts: 3",
                "  rdzv_backend: etcd-v2",
                "  failure_timing: gloo",
                f"  script: {SCRIPTS / script}",
                f"  script_args: [{', '.join(repr(a) for a in script_args)}]",
                f"  progress: '{STEP_LOSS}'",
                "profile: fast",
                "seed: 3",
                "steps:",
                "  - fault: kill-worker",
                "    target: node1",
                "    at: {step: 25}",
                "  - fault: kill-node",
                "    target: node2",
                "    at: {after: 15s}",
                "expect:",
                "  outcome: recovers",
                "timeout: 5m",
                "",
            ]
        )
    )
    return path


# In `make test`: the AMP and the device-mesh/FSDP2 scripts each under a worker kill and a node loss.
@pytest.mark.parametrize(
    "script, args, calls",
    [
        ("amp_memory.py", ["--steps", "250", "--step-time", "0.1"], ("autocast(cuda)", "GradScaler(cuda)")),
        ("mesh_fsdp.py", ["--steps", "250", "--step-time", "0.1"], ("init_device_mesh(cuda)",)),
    ],
)
def test_gpu_script_survives_a_worker_kill_and_a_node_loss(sim_scenario, docker, images, tmp_path, script, args, calls):
    name = "dev-" + script.removesuffix(".py").replace("_", "-")
    (result,) = sim_scenario(str(scenario(tmp_path, name, script, args)))
    assert_verdict(result)
    assert len(result.verdict.recoveries) == 2 and all(r.recovery_s for r in result.verdict.recoveries)
    assert result.verdict.result("progress").measured, result.summary
    assert EMULATED in result.summary and "failure timing gloo's" in result.summary
    for call in calls:
        assert call in result.summary, result.summary
