"""GPU training scripts (tests/scripts/: nccl backend, set_device, device_ids, cuda map_location, AMP,
FSDP2 on a CUDA device mesh), unchanged, on CPU-only nodes with devices emulated, under a worker SIGKILL
then a node loss. Under NCCL's failure timing a node loss holds the survivors in their collective until
the script's timeout=, then the watchdog aborts them and torchrun regroups: the report says the devices
were emulated, lists the emulated calls, and names nccl-dead-peer. The device-generic corpus (the current
PyTorch examples' shape: torch.accelerator gate, device_id=, torch.amp, FSDP2 with DCP) trains, is killed
once, and resumes its own checkpoint."""

from __future__ import annotations

import json
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
    # The script passes timeout=20 s: the fix says so, and never tells it to pass one.
    assert "[nccl-dead-peer]" in result.summary, result.summary
    assert "The script gives init_process_group timeout=20 s" in result.summary, result.summary


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


# --- the device-generic corpus: the current PyTorch distributed examples' shape ------------------------


def generic_scenario(tmp_path: Path, name: str, cluster: list[str], kill_at: int, fault: str = "kill-worker") -> Path:
    """2 nodes of 2 workers (the scripts gate on at least 2 accelerators per node), NCCL's failure timing
    (the default), one worker kill (or `fault`). The scenario's time runs from before its cluster is made (a
    requirements layer built, or an image rebuilt on a busy engine, spends it): 8 minutes, not the 5 that a
    start-up and this job need."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        "\n".join(
            [
                f"name: {name}",
                "description: a device-generic script (torch.accelerator), unchanged on emulated devices",
                "cluster:",
                "  nodes: 2",
                "  nproc_per_node: 2",
                "  max_restarts: 3",
                "  rdzv_backend: etcd-v2",
                *(f"  {line}" for line in cluster),
                f"  progress: '{STEP_LOSS}'",
                "profile: fast",
                "seed: 3",
                "steps:",
                f"  - fault: {fault}",
                "    target: node1",
                f"    at: {{step: {kill_at}}}",
                "expect:",
                "  outcome: recovers",
                "timeout: 8m",
                "",
            ]
        )
    )
    return path


GENERIC_CALLS = (
    "torch.accelerator.is_available",
    "torch.accelerator.device_count",
    "torch.accelerator.current_accelerator",
    "torch.accelerator.set_device_index",
    "get_default_backend_for_device(cuda)",
    "init_process_group(nccl)",
    "init_process_group(device_id=)",
)


def assert_trained_and_recovered(result, calls: tuple[str, ...], resumed: str) -> None:
    assert_verdict(result)
    [kill] = result.verdict.recoveries
    assert kill.recovery_s is not None, result.summary
    assert result.verdict.result("progress").measured, result.summary  # training seen, after the kill too
    assert "devices emulated on CPU (2 per node), NCCL → gloo" in result.summary, result.summary
    for call in (*GENERIC_CALLS, *calls):
        assert call in result.summary, (call, result.summary)
    logs = "\n".join(p.read_text(errors="replace") for p in (result.run_dir / "logs").glob("*"))
    assert "Unable to locate sufficient" not in logs  # the accelerator gate let it train
    assert resumed in logs, logs[-4000:]  # the restart resumed the script's own checkpoint


def test_hydra_ddp_amp_trainer_trains_and_resumes_after_a_worker_kill(sim_scenario, docker, images, tmp_path):
    """tests/scripts/ddp_hydra/: hydra (from its requirements), AMP with torch.amp.GradScaler, DataLoader
    workers, a snapshot of its own; device from torch.accelerator, device_id= bound."""
    project = SCRIPTS / "ddp_hydra"
    cluster = [
        f"project_dir: {project}",
        f"script: {project / 'train.py'}",
        f"requirements: {project / 'requirements.txt'}",
        "script_args: ['train.max_epochs=16']",
    ]
    (result,) = sim_scenario(str(generic_scenario(tmp_path, "dev-ddp-hydra", cluster, kill_at=15)))
    calls = ("GradScaler(cuda)", "autocast(cuda)", "DDP(device_ids=)", "DataLoader(pin_memory=True)")
    assert_trained_and_recovered(result, calls, "Resuming training from snapshot at epoch")


def test_fsdp2_meta_init_dcp_trainer_trains_and_resumes_after_a_worker_kill(sim_scenario, docker, images, tmp_path):
    """tests/scripts/fsdp2_dcp.py: meta-device init, fully_shard per layer over init_device_mesh("cuda"),
    to_empty(device="cuda:N"), DCP save and resume."""
    cluster = [
        f"script: {SCRIPTS / 'fsdp2_dcp.py'}",
        "script_args: ['--steps', '80', '--step-time', '0.1', '--ckpt-every', '10']",
    ]
    (result,) = sim_scenario(str(generic_scenario(tmp_path, "dev-fsdp2-dcp", cluster, kill_at=25)))
    calls = ("init_device_mesh(cuda)", "Module.to_empty(cuda)")
    assert_trained_and_recovered(result, calls, "resumed from the DCP checkpoint of step")


def test_fsdp2_trainer_recovers_from_a_hung_collective_at_its_own_timeout(sim_scenario, docker, images, tmp_path):
    """tests/scripts/fsdp2_dcp.py passes timeout=15 s to init_process_group; one worker stops calling collectives.
    Over NCCL its 1-D mesh over the whole world reuses that default group, so the others' collective times out
    at 15 s, the watchdog takes them down and torchrun regroups. The emulation once gave the mesh a gloo group of
    its own with gloo's 30-minute default: the job never recovered (`sim vet ... --faults hang-collectives`
    FAILed, advising a timeout the script passes)."""
    cluster = [
        f"script: {SCRIPTS / 'fsdp2_dcp.py'}",
        "script_args: ['--steps', '80', '--step-time', '0.1', '--ckpt-every', '10', '--pg-timeout', '15']",
    ]
    path = generic_scenario(tmp_path, "dev-fsdp2-hang", cluster, kill_at=25, fault="hang-collectives")
    (result,) = sim_scenario(str(path))
    assert_verdict(result)
    [hang] = result.verdict.recoveries
    assert hang.recovery_s is not None, result.summary
    history = [json.loads(line) for line in (result.run_dir / "history.jsonl").read_text().splitlines()]
    # The history holds the timeout the script gave, and the survivors were let go at it, as NCCL's watchdog does.
    ready = [r for r in history if r.get("event") == "pg_ready"]
    assert ready and {r.get("timeout_s") for r in ready} == {15.0}, ready
    held = [r for r in history if r.get("event") == "nccl_watchdog"]
    assert held and {r["timeout_s"] for r in held} == {15.0}, held
    assert "resumed from the DCP checkpoint of step" in "\n".join(
        p.read_text(errors="replace") for p in (result.run_dir / "logs").glob("*")
    )
