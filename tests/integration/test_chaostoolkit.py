"""experiments/worker-crash.json run for real by the Chaos Toolkit's own CLI (`chaos run`) against a real
elastic-sim cluster (4 nodes x 1 worker, etcd-v2): the journal says completed, not deviated, the steady
state met before and after, and the kill went through the audited path (its `ok` record in the run's
history). Then, on the same cluster, the same experiment with etcd killed instead (torch's etcd-v2 agents
end on their first failed etcd call, etcd-loss.yaml): the hypothesis no longer holds, and the experiment
ends deviated (the journal's `deviated`; chaoslib keeps its `status` to the spec's "completed").
One cluster for both: the first experiment leaves it training at full size."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from sim.core.history import FILE_NAME, FaultRecord, History
from sim.scenarios.scenario import PROFILES

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
CHAOS = Path(sys.executable).parent / "chaos"  # the chaostoolkit console script of this venv
EXPERIMENT = ROOT / "experiments" / "worker-crash.json"
RUN_TIMEOUT_S = 240


def chaos_run(experiment: Path, cluster: str, folder: Path) -> dict:
    """`chaos run` as a user runs it; returns its journal."""
    folder.mkdir(parents=True, exist_ok=True)
    journal = folder / "journal.json"
    path = os.pathsep.join([str(ROOT), str(ROOT / "chaostoolkit-elastic-sim")])
    env = {**os.environ, "PYTHONPATH": path, "SIM_CLUSTER": cluster}
    argv = [str(CHAOS), "--no-version-check", "--log-file", str(folder / "chaostoolkit.log"), "run"]
    done = subprocess.run(
        [*argv, "--journal-path", str(journal), str(experiment)],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert journal.exists(), f"no journal (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    return json.loads(journal.read_text())


def test_worker_crash_experiment_completes_then_etcd_loss_deviates(sim_cluster, tmp_path):
    fast = PROFILES["fast"]
    cluster = sim_cluster(
        name=f"ctk-{secrets.token_hex(3)}",
        nodes=4,
        nproc_per_node=1,
        max_restarts=3,
        rdzv_backend="etcd-v2",
        # read_timeout: an etcd call in flight when etcd dies fails within 3 s (etcd-loss.yaml).
        rdzv_conf=",".join(f"{k}={v}" for k, v in {**fast["rdzv_conf"], "read_timeout": 3}.items()),
        env=[f"{k}={v}" for k, v in fast["env"].items()],
        script_args=["--steps", "4000", "--step-time", "0.1", "--pg-timeout", "15"],
    )

    journal = chaos_run(EXPERIMENT, cluster.name, tmp_path / "worker-crash")
    summary = json.dumps({k: journal.get(k) for k in ("status", "deviated", "steady_states")}, indent=1)[:4000]
    assert journal["status"] == "completed", summary
    assert journal["deviated"] is False, summary
    assert "Experiment ended with status: completed" in (tmp_path / "worker-crash" / "chaostoolkit.log").read_text()
    assert journal["steady_states"]["before"]["steady_state_met"] is True, summary
    assert journal["steady_states"]["after"]["steady_state_met"] is True, summary
    (kill,) = [run for run in journal["run"] if run["activity"]["name"] == "kill-a-worker"]
    assert kill["status"] == "succeeded", kill
    # The action's output is the audited result: its op has an `ok` record in the run's history.
    oks = [r for r in History(cluster.run_dir / FILE_NAME).records() if isinstance(r, FaultRecord) and r.phase == "ok"]
    assert any(r.op == kill["output"]["op"] and r.fault == "kill-worker" for r in oks), oks
    assert journal["rollbacks"] and journal["rollbacks"][0]["status"] == "succeeded", journal["rollbacks"]

    # The same experiment, etcd lost instead: the job ends, so training no longer progresses.
    experiment = json.loads(EXPERIMENT.read_text())
    experiment["title"] = "etcd is lost on etcd-v2: the hypothesis must break"
    experiment["method"] = [
        {
            "type": "action",
            "name": "kill-etcd",
            "provider": {"type": "python", "module": "chaosesim.actions", "func": "etcd_kill", "arguments": {}},
            "pauses": {"after": 10},
        }
    ]
    variant = tmp_path / "etcd-loss.json"
    variant.write_text(json.dumps(experiment))
    journal = chaos_run(variant, cluster.name, tmp_path / "etcd-loss")
    summary = json.dumps({k: journal.get(k) for k in ("status", "deviated", "steady_states")}, indent=1)[:4000]
    # chaoslib keeps the journal's status to the spec's (completed, failed, aborted, interrupted) and
    # marks deviated; its log says "ended with status: deviated".
    assert journal["status"] == "completed" and journal["deviated"] is True, summary
    assert "Experiment ended with status: deviated" in (tmp_path / "etcd-loss" / "chaostoolkit.log").read_text()
    assert journal["steady_states"]["before"]["steady_state_met"] is True, summary
    assert journal["steady_states"]["after"]["steady_state_met"] is False, summary
