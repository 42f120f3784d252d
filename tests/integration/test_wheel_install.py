"""A user's own repository: elastic-sim installed from a wheel into a fresh venv (not this
checkout), the user's plain torchrun script, and a pytest test with the `sim_cluster` fixture,
run there as the user runs it. Everything the installed package reads (images/, compose/,
trainer/, scenarios) must come from the wheel, and it must reuse the images built here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim.core import labels
from sim.scenarios.runner import default_cluster_name
from tests.conftest import unique_name
from tests.wheel_build import ROOT, build_wheel

pytestmark = pytest.mark.docker

# The user's script knows nothing of elastic-sim: torchrun's environment, gloo, plain prints.
USER_SCRIPT = textwrap.dedent("""\
    import sys
    import time

    import torch
    import torch.distributed as dist

    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, steps + 1):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        print(f"rank {rank}/{world} step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(0.05)
    print(f"rank {rank}: done after {step} steps", flush=True)
    dist.destroy_process_group()
""")

USER_TEST = textwrap.dedent("""\
    import json
    import subprocess
    import sys
    from pathlib import Path

    from sim.engines.cluster import JobFinished
    from sim.pytest_plugin import assert_verdict
    from sim.core.wait import wait_for


    def test_my_script_trains_on_a_simulated_cluster(sim_cluster):
        cluster = sim_cluster(name="{name}", nodes=2, nproc_per_node=1, rdzv_backend="etcd-v2",
                              script=str(Path(__file__).parent / "train.py"))
        assert sorted(c.node for c in cluster.containers()) == ["etcd", "node0", "node1"]
        wait_for(JobFinished(cluster), timeout=180, interval=2)
        for node in cluster.nodes():
            assert node.exit_code == 0, cluster.logs(node.node, tail=30)
            assert "done after 20 steps" in cluster.logs(node.node)
        # The collector (a `python -m sim.engines.collector` of this venv) turned the agents' logs into history.
        history = [json.loads(line) for line in (cluster.run_dir / "history.jsonl").read_text().splitlines()]
        assert any(r.get("type") == "agent" for r in history), "no agent records in the run's history"
        # The report, with its timeline picture (matplotlib), from this install's CLI.
        report = subprocess.run([sys.executable, "-m", "sim", "report", cluster.name], capture_output=True, text=True)
        print(report.stdout)
        assert "Traceback" not in report.stderr, report.stderr
        assert (cluster.run_dir / "report" / "timeline.png").is_file(), report.stdout + report.stderr


    def test_my_script_survives_a_worker_crash(sim_scenario):
        (result,) = sim_scenario(str(Path(__file__).parent / "worker-crash.yaml"))
        assert_verdict(result)
        assert result.verdict.result("recovery").measured, result.summary
""")

# The same user's scenario, beside the script (the script path is relative to this file).
USER_SCENARIO = textwrap.dedent("""\
    name: my-worker-crash
    description: my script survives one worker crash
    cluster:
      nodes: 2
      nproc_per_node: 1
      max_restarts: 2
      rdzv_backend: etcd-v2
      script: train.py
      script_args: ["--steps", "80"]
    steps:
      - fault: kill-worker
        target: node1
        at: {step: 10}
    expect:
      outcome: recovers
    timeout: 3m
""")


def user_env(venv: Path) -> dict[str, str]:
    """An activated fresh venv: nothing of this checkout on sys.path or PATH. SIM_SESSION (set by
    tests/conftest.py) passes on, so this session's sweep also removes what the user's run made."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT))]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["VIRTUAL_ENV"] = str(venv)
    assert env.get(labels.SESSION_ENV), "tests/conftest.py sets SIM_SESSION for the session's sweep"
    return env


def run(argv: list, cwd: Path, env: dict | None = None, timeout: float = 480) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-4000:]}"
    )
    return done


def test_a_user_repo_runs_its_own_test_with_elastic_sim_from_a_wheel(docker, images, tmp_path):
    wheel = build_wheel(tmp_path / "build")
    venv = tmp_path / "venv"
    # No pip in the venv: this interpreter's pip installs into it (`--python`), which saves the
    # venv's own pip bootstrap; --no-compile skips byte-compiling matplotlib and numpy up front.
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "bin" / "python",
            "install",
            "-q",
            "--no-compile",
            f"{wheel}[test]",
        ],
        tmp_path,
    )

    repo = tmp_path / "user-repo"
    repo.mkdir()
    (repo / "train.py").write_text(USER_SCRIPT)
    name = unique_name("t-wheel")
    (repo / "test_fault_tolerance.py").write_text(USER_TEST.replace("{name}", name))
    (repo / "worker-crash.yaml").write_text(USER_SCENARIO)
    (repo / "pytest.ini").write_text("[pytest]\n")  # the user's rootdir: no conftest above it is read
    env = user_env(venv)

    # The install's own package and data files, and the same image tags as this checkout's build.
    probe = run(
        [
            venv / "bin" / "python",
            "-c",
            "import sim; from sim.engines.images import ImageBuilder; t = ImageBuilder(None).tags(); "
            "print(sim.__file__, t.node, t.etcd)",
        ],
        repo,
        env,
    )
    module, node_tag, etcd_tag = probe.stdout.split()
    assert module.startswith(str(venv)), f"sim imported from {module}, not the fresh venv"
    assert (node_tag, etcd_tag) == (images.node, images.etcd), "the installed package would rebuild the images"

    result = run([venv / "bin" / "python", "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider"], repo, env)
    assert "2 passed" in result.stdout, result.stdout[-4000:]
    for made in (name, default_cluster_name("my-worker-crash", "etcd-v2")):
        assert not docker.ids("container", labels.cluster_filter(made)), f"the user's run left containers of {made}"
