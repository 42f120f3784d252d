"""A job's own environment (README "Your own environment"), really run: the seed-style job of
tests/scripts/seedjob/ (a package, a YAML config read with pyyaml, tqdm from its requirements file, a
data folder mounted from the host) from its project folder, under a worker kill and a node loss; a corpus
script on a team image with another Python layout (system Python, no venv, no pip, no ip/iptables/tc) given
with --image; and the seed job from that image, its packages baked in, under a partition."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sim.cli.main import main as sim_main
from sim.pytest_plugin import assert_verdict

pytestmark = pytest.mark.docker

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SEEDJOB = SCRIPTS / "seedjob"
STEP_LOSS = r"step (?P<step>\d+) loss (?P<loss>[\d.]+)"
INPUT_DIM = 16


def write_samples(folder: Path, rows: int = 256) -> None:
    """The job's data, made here and mounted, never part of its tree."""
    import random

    rng = random.Random(0)
    lines = []
    for _ in range(rows):
        x = [rng.uniform(-1, 1) for _ in range(INPUT_DIM)]
        lines.append(",".join(f"{v:.4f}" for v in [*x, sum(x) / INPUT_DIM]))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "samples.csv").write_text("\n".join(lines) + "\n")


def test_seed_job_runs_from_its_project_with_requirements_and_a_mount(sim_scenario, docker, images, tmp_path, capsys):
    data = tmp_path / "data"
    write_samples(data)
    scenario = tmp_path / "seedjob.yaml"
    scenario.write_text(f"""\
name: env-seedjob
description: the seed-style job from its project folder, with requirements and a mounted data folder
cluster:
  nodes: 3
  nproc_per_node: 1
  max_restarts: 3
  rdzv_backend: etcd-v2
  project_dir: {SEEDJOB}
  script: {SEEDJOB / "train.py"}
  requirements: {SEEDJOB / "requirements.txt"}
  mounts: ["{data}:/data"]
  progress: '{STEP_LOSS}'
profile: fast
seed: 3
steps:
  - fault: kill-worker
    target: node1
    at: {{step: 25}}
  - fault: kill-node
    target: node2
    at: {{after: 15s}}
expect:
  outcome: recovers
timeout: 5m
""")
    (result,) = sim_scenario(str(scenario))
    assert_verdict(result)
    assert len(result.verdict.recoveries) == 2, result.summary
    capsys.readouterr()
    assert sim_main(["report", str(result.run_dir)]) == 0, capsys.readouterr().out
    # Relative writes stayed in the nodes' own copies of the tree: the host's tree got none.
    assert not (SEEDJOB / "snapshot.pt").exists()
    logs = "\n".join(p.read_text(errors="replace") for p in (result.run_dir / "logs").glob("*"))
    assert "elastic-sim: project copied from /opt/sim/user to /opt/sim/project" in logs


SYSTEM_PYTHON_DOCKERFILE = """\
# A team image with another Python layout: Debian's system python3, torch (and the seed job's pyyaml and
# tqdm, baked in as a team would) in the system's /usr/local/lib/python3.11/dist-packages (no venv, no pip),
# torchrun a script of its own, root user. No ip, iptables or tc: network faults come from our helper.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY wheels /wheels
RUN python3 -m venv /tmp/pip && /tmp/pip/bin/pip install --no-cache-dir --no-index --find-links /wheels \\
      --target /usr/local/lib/python3.11/dist-packages torch numpy pyyaml tqdm \\
 && rm -rf /tmp/pip /wheels /usr/local/lib/python3.11/dist-packages/bin \\
 && printf '#!/usr/bin/python3\\nimport sys\\nfrom torch.distributed.run import main\\nsys.exit(main())\\n' \\
      > /usr/local/bin/torchrun && chmod 755 /usr/local/bin/torchrun \\
 && for tool in ip tc iptables; do for dir in /usr/sbin /usr/bin /sbin /bin; do rm -f $dir/$tool; done; done \\
 && ! command -v ip && ! command -v tc && ! command -v iptables
"""


@pytest.fixture(scope="module")
def team_image(docker, images, tmp_path_factory):
    """Built from what is here: our base image plus torch from the runtime wheelhouse, and the seed job's
    requirements from their wheelhouse (resolved in a throwaway container of the node image, kept by content), in
    system Python."""
    from sim.core.labels import cluster_labels
    from sim.core.spec import image_torch_version
    from sim.engines.images import ImageBuilder, _digest, _link_or_copy
    from sim.engines.userimages import UserImages

    builder = ImageBuilder(docker)
    seedjob = UserImages(builder, docker).wheelhouse(
        SEEDJOB / "requirements.txt",
        images.node,
        "/opt/venv/bin/python",
        image_torch_version(),
        labels=cluster_labels("env-team-image"),
    )
    wheels = [*builder.wheelhouse().glob("*.whl"), *seedjob.glob("*.whl")]
    key = _digest(images.base, SYSTEM_PYTHON_DOCKERFILE, *sorted(w.name for w in wheels))
    tag = f"elastic-sim-test/team-system-python:{key}"
    if not docker.image_exists(tag):
        ctx = tmp_path_factory.mktemp("team-image")
        (ctx / "Dockerfile").write_text(SYSTEM_PYTHON_DOCKERFILE)
        (ctx / "wheels").mkdir()
        for wheel in wheels:
            _link_or_copy(str(wheel), str(ctx / "wheels" / wheel.name))
        done = subprocess.run(
            ["docker", "build", "-q", "-t", tag, "--label", "elastic-sim.image=test", "--build-arg",
             f"BASE_IMAGE={images.base}", str(ctx)],
            capture_output=True, text=True, env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin:/usr/local/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    return tag


def test_corpus_script_runs_on_a_team_image(sim_scenario, docker, team_image, tmp_path, capsys):
    """ddp_sgd.py on the team's own image (system Python): a worker kill and a lossy link (iptables, from the
    helper: the image has none), recovered; `sim doctor --image` names what that image supports."""
    scenario = tmp_path / "team-image.yaml"
    scenario.write_text(f"""\
name: env-team-image
description: a corpus script on a team image with system Python, under a worker kill and a lossy link
cluster:
  nodes: 2
  nproc_per_node: 1
  max_restarts: 3
  rdzv_backend: etcd-v2
  image: {team_image}
  script: {SCRIPTS / "ddp_sgd.py"}
  script_args: ["--steps", "120"]
profile: fast
seed: 3
steps:
  - fault: kill-worker
    target: node1
    at: {{step: 25}}
  - fault: netem
    target: node1
    loss: 10%
    at: {{step: 60}}
    duration: 10s
expect:
  outcome: recovers
timeout: 5m
""")
    (result,) = sim_scenario(str(scenario))
    assert_verdict(result)
    capsys.readouterr()
    sim_main(["doctor", "--image", team_image])
    out = capsys.readouterr().out
    assert "--image python: /usr/bin/python3" in out and "dist-packages" in out, out
    assert "[ok  ] --image torch: 2.13.0" in out, out
    assert "[ok  ] --image network faults: applied from elastic-sim's helper container" in out, out
    assert "--image iptables" not in out and "--image tc" not in out, out
    # The nodes' user as the project check reads files, probed in the image: root, in root's group only.
    from sim.engines.userimages import probe_image

    probe = probe_image(docker, team_image)
    assert (probe.uid, probe.gids) == (0, (0,)), probe


def test_seed_job_runs_from_a_team_image_under_a_partition(sim_scenario, docker, team_image, tmp_path):
    """The seed job from the team's image (its packages baked in, no pip, no iptables): its project tree and
    mounted data, node1 cut off from everyone (the rules applied from the helper) and back, recovered."""
    data = tmp_path / "data"
    write_samples(data)
    scenario = tmp_path / "seedjob-team-image.yaml"
    scenario.write_text(f"""\
name: env-seedjob-team-image
description: the seed-style job from a team image with its own packages, under a partition
cluster:
  nodes: 3
  nproc_per_node: 1
  max_restarts: 5
  rdzv_backend: etcd-v2
  image: {team_image}
  project_dir: {SEEDJOB}
  script: {SEEDJOB / "train.py"}
  mounts: ["{data}:/data"]
  progress: '{STEP_LOSS}'
profile: fast
seed: 3
steps:
  - fault: partition
    isolate: [node1]
    at: {{step: 25}}
    duration: 20s
expect:
  outcome: recovers
timeout: 5m
""")
    (result,) = sim_scenario(str(scenario))
    assert_verdict(result)
    assert result.verdict.recoveries, result.summary  # the cut was real: the job regrouped
    from sim.core.faultkinds import kind_of
    from sim.core.history import FILE_NAME, FaultRecord, History

    done = [r for r in History(result.run_dir / FILE_NAME).records() if isinstance(r, FaultRecord)]
    # The history keeps what every fault's result has; the partition's own fields are read as its kind's result.
    applied = kind_of("partition").read_result(
        next(r.result for r in done if r.fault == "partition" and r.phase == "ok")
    )
    assert any("-j DROP" in rule for rule in applied.rules["node1"]), applied
