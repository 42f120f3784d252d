"""`--requirements` on the real engine and the real package index: the packages' build code runs in a throwaway
container of ours, never on this machine (a local package whose setup.py leaves a marker file, named by a
script folder's pyproject.toml); the container is gone after a failed resolve and after Ctrl-C; torchvision,
whose compiled ops were built for the registry's torch, is refused in one line over an image with the CPU torch
build (the real resolve and the real wheel's metadata, before anything is built), and, over our node image,
runs a training job on its compiled ops (roi_align, nms) on the registry's own torch build (`make test-full`:
that image holds 2.6 GB of downloads, see the test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.core import labels
from sim.core.errors import UsageError
from sim.core.spec import ClusterSpec
from sim.engines.cluster import job_images
from sim.engines.images import ImageBuilder
from sim.pytest_plugin import assert_verdict

pytestmark = pytest.mark.docker

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
VISIONJOB = SCRIPTS / "visionjob"
RESOLVER = "requirements-resolver"
REPO = Path(__file__).resolve().parents[2]

SETUP_PY = """\
import os, time
from setuptools import setup
# Build code, as any sdist or local package has: it runs wherever pip prepares the package's metadata.
marker = {marker!r}
os.makedirs(os.path.dirname(marker), exist_ok=True)
with open(marker, "a") as out:
    out.write("setup.py ran on " + os.uname().nodename + "\\n")
time.sleep({sleep})
setup(name="markerpkg", version="1.0", packages=["markerpkg"])
"""


def their_repo(tmp_path: Path, *, sleep: int = 0) -> tuple[Path, Path]:
    """A script's folder with a pyproject.toml naming its requirements, one of them a local package."""
    repo = tmp_path / "their-repo"
    package = repo / "markerpkg"
    (package / "markerpkg").mkdir(parents=True)
    (package / "markerpkg" / "__init__.py").write_text("VALUE = 42\n")
    marker = tmp_path / "host-marker" / "ran"
    (package / "setup.py").write_text(SETUP_PY.format(marker=str(marker), sleep=sleep))
    # An absolute path: the old host-side `pip download` ran from the harness's folder.
    (repo / "requirements.txt").write_text(f"{package}\n")
    (repo / "pyproject.toml").write_text('[tool.elastic-sim]\nrequirements = "requirements.txt"\n')
    (repo / "train.py").write_text((SCRIPTS / "ddp_sgd.py").read_text())
    return repo, marker


def resolvers(docker) -> list:
    session = os.environ[labels.SESSION_ENV]
    return [c for c in docker.containers(f"label={labels.SESSION}={session}") if c.labels.get(labels.ROLE) == RESOLVER]


def test_a_packages_build_code_runs_in_our_container_not_on_this_machine(docker, images, tmp_path):
    repo, marker = their_repo(tmp_path)
    lines: list[str] = []
    spec = ClusterSpec(name="reqs-marker", script=str(repo / "train.py"))  # no --requirements: the config's
    node = job_images(spec, docker, builder=ImageBuilder(docker, progress=lines.append), progress=lines.append).node
    assert not marker.exists(), f"the package's setup.py ran on this machine: {marker.read_text()}"
    # It was built (in the container) and installed in the layer.
    done = docker.run_image(node, "python", ["-c", "import markerpkg; print(markerpkg.VALUE)"])
    assert done.stdout.strip() == "42", done.stderr
    named = [line for line in lines if "named by [tool.elastic-sim] requirements" in line]
    assert named == [
        f"[requirements] {repo / 'requirements.txt'}: named by [tool.elastic-sim] requirements in "
        f"{repo / 'pyproject.toml'} (not given with --requirements); installing its packages"
    ], lines
    assert any("in a throwaway container of" in line for line in lines), lines
    assert resolvers(docker) == []


def test_a_failed_resolve_is_one_line_and_leaves_no_container(docker, images, tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("elastic-sim-no-such-package==1.0\n")
    spec = ClusterSpec(name="reqs-missing", requirements=str(requirements))
    lines: list[str] = []
    with pytest.raises(UsageError) as refused:
        job_images(spec, docker, builder=ImageBuilder(docker, progress=lines.append), progress=lines.append)
    assert any("in a throwaway container of" in line for line in lines), lines  # pip ran there, not here
    assert str(refused.value).startswith(
        f"--requirements '{requirements}': cannot install 'elastic-sim-no-such-package==1.0': pip says:"
    ), refused.value
    assert resolvers(docker) == []


def test_ctrl_c_during_a_resolve_removes_the_container(docker, images, tmp_path):
    repo, marker = their_repo(tmp_path, sleep=300)  # a build that takes its time
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "sim", "up", "--name", "reqs-ctrl-c", "--nodes", "1", "--script",
            str(repo / "train.py"), "--detach"]  # fmt: skip
    log = tmp_path / "up.log"
    with open(log, "w") as out_file:
        proc = subprocess.Popen(argv, env=env, stdout=out_file, stderr=subprocess.STDOUT, text=True)
    try:
        # (its image builds wait for the build lock while another `up` on this machine builds)
        deadline = time.monotonic() + 600
        while not resolvers(docker) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert resolvers(docker), f"no resolver container seen (exit {proc.poll()}): {log.read_text()[-3000:]}"
        time.sleep(3)  # pip is in the package's setup.py now
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert proc.returncode != 0, out
    assert resolvers(docker) == [], out
    assert not marker.exists()


def test_torchvision_built_for_another_torch_is_refused_over_an_image_with_the_cpu_build(docker, images, tmp_path):
    """The real resolve in the container (torchvision 0.28.0 for torch 2.13.0, from the registry) and its real
    wheel: its _C.so needs libtorch_cuda.so, which the CPU build lacks. Over a team image (here our node image
    given with --image: torch 2.13.0+cpu, pip) that is one line before any layer is built; the job's first
    start used to die with `operator torchvision::nms does not exist`."""
    lines: list[str] = []
    spec = ClusterSpec(name="reqs-vision-own", image=images.node, requirements=str(VISIONJOB / "requirements.txt"))
    with pytest.raises(UsageError) as refused:
        job_images(spec, docker, builder=ImageBuilder(docker, progress=lines.append), progress=lines.append)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        f"--requirements '{VISIONJOB / 'requirements.txt'}': torchvision 0.28.0 (requires torch==2.13.0): its "
        f"compiled parts were built for another torch build than --image {images.node}'s torch 2.13.0+cpu"
    ), line
    assert "libtorch_cuda.so" in line and "use --image with an image whose torch is the build" in line, line
    assert not [x for x in lines if x.startswith("[requirements] building")], lines
    assert resolvers(docker) == []


@pytest.mark.full  # cold: the registry's torch build and its CUDA libraries (2.6 GB) downloaded and installed
def test_a_job_on_torchvisions_compiled_ops_trains_on_the_registrys_torch_build(sim_scenario, docker, images, tmp_path):
    """The vision job (roi_align and nms, compiled ops, in its training loop) with `torchvision` in its
    requirements, over our node image: the layer sits on the node image with the registry's own torch 2.13.0
    build, its compiled parts are loaded and nms called at build time, and the job trains under a worker kill."""
    lines: list[str] = []
    requirements = VISIONJOB / "requirements.txt"
    spec = ClusterSpec(name="reqs-vision", script=str(VISIONJOB / "train.py"), requirements=str(requirements))
    started = time.monotonic()
    node = job_images(spec, docker, builder=ImageBuilder(docker, progress=lines.append), progress=lines.append).node
    print(f"vision images ready in {time.monotonic() - started:.0f}s: {node}")
    if any(line.startswith("[requirements] building") for line in lines):
        assert any("torchvision 0.28.0 on torch 2.13.0" in x and "torchvision.ops.nms ran" in x for x in lines), lines
    done = docker.run_image(node, "python", ["-c", "import torch, torchvision; print(torch.__version__)"])
    assert done.stdout.strip() == "2.13.0+cu130", done.stderr
    scenario = tmp_path / "vision.yaml"
    scenario.write_text(f"""\
name: reqs-vision
description: a job on torchvision's compiled ops, its requirements over the registry's torch build
cluster:
  nodes: 2
  nproc_per_node: 1
  max_restarts: 3
  rdzv_backend: etcd-v2
  project_dir: {VISIONJOB}
  script: {VISIONJOB / "train.py"}
  requirements: {requirements}
  # The default CUDA emulation, as a new user gets it: torch's own calls (Adam's graph-capture check asks
  # torch.accelerator for the current stream) get a CPU-only machine's answers, so the registry's CUDA build
  # never reaches for a driver.
  script_args: ["--steps", "60"]
  progress: 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
profile: fast
seed: 3
steps:
  - fault: kill-worker
    target: node1
    at: {{step: 20}}
expect:
  outcome: recovers
timeout: 5m
""")
    (result,) = sim_scenario(str(scenario))
    assert_verdict(result)
    assert result.verdict.recoveries, result.summary
    logs = "\n".join(p.read_text(errors="replace") for p in (result.run_dir / "logs").glob("*"))
    assert "torchvision 0.28.0+cu130 on torch 2.13.0+cu130" in logs and "done: 60 steps" in logs
    assert "operator torchvision::nms does not exist" not in logs
