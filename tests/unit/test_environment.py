"""The job's own environment, pure parts: project tree, mounts, requirements, own image (no Docker)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from sim.core.errors import UsageError
from sim.core.hostpaths import PROJECT_DIR_IN_NODE, PROJECT_STAGE_DIR, exposure, tree_summary
from sim.core.paths import IMAGES_DIR
from sim.core.spec import ClusterSpec, image_torch_version, spec_from_options
from sim.engines.images import is_progress_line
from sim.engines.render import PROJECT_COPY, render
from sim.engines.userimages import ImageProbe, UserImages, hook_files, pip_failure
from sim.scenarios.scenario import parse_scenario, scenario_spec_options

IMAGES = {"node_image": "N", "etcd_image": "E", "run_id": "r"}
SEEDJOB = Path(__file__).resolve().parent.parent / "scripts" / "seedjob"


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "scripts").mkdir(parents=True)
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "scripts" / "train.py").write_text("")
    (root / "config.yaml").write_text("a: 1\n")
    return root


def test_project_tree_is_staged_read_only_and_run_from_a_writable_copy(tmp_path):
    root = project(tmp_path)
    spec = ClusterSpec(nodes=1, project_dir=str(root), script="scripts/train.py")  # relative to the project
    assert spec.script == str(root / "scripts" / "train.py")
    assert spec.script_in_node == f"{PROJECT_DIR_IN_NODE}/scripts/train.py"
    node = render(spec, **IMAGES)["services"]["node0"]
    assert {"type": "bind", "source": str(root), "target": PROJECT_STAGE_DIR, "read_only": True} in node["volumes"]
    assert node["command"][:3] == [PROJECT_COPY, PROJECT_STAGE_DIR, PROJECT_DIR_IN_NODE]
    assert node["command"][-1] == f"{PROJECT_DIR_IN_NODE}/scripts/train.py"
    assert node["environment"]["PYTHONPATH"] == PROJECT_DIR_IN_NODE


def test_default_project_is_the_git_root_else_the_folder(tmp_path):
    root = project(tmp_path)
    assert ClusterSpec(script=str(root / "scripts" / "train.py")).project_dir == str(root / "scripts")
    (root / ".git").mkdir()
    spec = ClusterSpec(script=str(root / "scripts" / "train.py"))
    assert spec.project_dir == str(root) and spec.script_in_node.endswith("/project/scripts/train.py")


def test_user_env_pythonpath_wins(tmp_path):
    root = project(tmp_path)
    spec = ClusterSpec(nodes=1, project_dir=str(root), script="scripts/train.py", env=(("PYTHONPATH", "/x"),))
    assert render(spec, **IMAGES)["services"]["node0"]["environment"]["PYTHONPATH"] == "/x"


@pytest.mark.parametrize(
    "folder, reason",
    [("/", "whole file system"), ("/root", "home folder"), ("/tmp", "shared temp"), ("/home", "holds home")],
)
def test_folders_that_expose_the_host_are_refused(folder, reason):
    assert reason in exposure(Path(folder))
    with pytest.raises(UsageError, match=f"--project-dir '{folder}': refused, .*{reason}"):
        ClusterSpec(project_dir=folder, script="x.py")


def test_a_folder_holding_ssh_or_a_socket_is_refused(tmp_path):
    (tmp_path / "a" / ".ssh").mkdir(parents=True)
    assert "holds a .ssh folder" in exposure(tmp_path / "a")
    assert "SSH key folder" in exposure(tmp_path / "a" / ".ssh")
    sock_dir = tmp_path / "s"
    sock_dir.mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_dir / "docker.sock"))
        assert "holds a socket (docker.sock)" in exposure(sock_dir)
        with pytest.raises(UsageError, match="host path .*refused, a socket"):
            ClusterSpec(mounts=(f"{sock_dir / 'docker.sock'}:/var/run/x.sock",))
    if Path("/run/docker.sock").exists():
        assert "Docker socket" in exposure(Path("/var/run").resolve())


def test_a_script_whose_folder_exposes_the_host_says_to_pass_project_dir(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "train.py").write_text("")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(UsageError, match=r"its project folder .* refused, a home folder.*pass --project-dir"):
        ClusterSpec(script=str(home / "train.py"))


def test_project_dir_needs_a_script_inside_it(tmp_path):
    root = project(tmp_path)
    with pytest.raises(UsageError, match="needs --script"):
        ClusterSpec(project_dir=str(root))
    other = tmp_path / "elsewhere.py"
    other.write_text("")
    with pytest.raises(UsageError, match="not inside --project-dir"):
        ClusterSpec(project_dir=str(root), script=str(other))


def test_mounts_are_checked_and_rendered(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    spec = spec_from_options({"nodes": 1, "mounts": [f"{data}:/data", f"{data}:/out:rw"]}, None)
    assert spec.mounts == ((str(data), "/data", False), (str(data), "/out", True))
    volumes = render(spec, **IMAGES)["services"]["node0"]["volumes"]
    assert {"type": "bind", "source": str(data), "target": "/data", "read_only": True} in volumes
    assert {"type": "bind", "source": str(data), "target": "/out", "read_only": False} in volumes
    assert ClusterSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    "mount, message",
    [
        ("nothere:/data", "no such file or folder"),
        ("{d}:data", "not absolute"),
        ("{d}:/ckpt", "cover elastic-sim's /ckpt"),
        ("{d}:/opt", "cover elastic-sim's /opt/sim"),
        ("{d}:/etc", "replace a system folder"),
        ("{d}:/data:xx", "neither ro nor rw"),
        ("justone", "not HOST:CONTAINER"),
    ],
)
def test_bad_mounts_are_one_line(tmp_path, mount, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        spec_from_options({"mounts": [mount.format(d=tmp_path)]}, None)


def test_two_mounts_at_one_node_path_are_refused(tmp_path):
    with pytest.raises(UsageError, match="two mounts at /data"):
        spec_from_options({"mounts": [f"{tmp_path}:/data", f"{tmp_path}:/data/"]}, None)


def test_requirements_torch_pin_must_match_the_image(tmp_path):
    assert image_torch_version() == "2.13.0"
    good = tmp_path / "ok.txt"
    good.write_text("pyyaml\ntorch>=2.5  # ours\n")
    assert ClusterSpec(requirements=str(good)).requirements == str(good)
    bad = tmp_path / "bad.txt"
    bad.write_text("pyyaml\ntorch==2.4.1\n")
    with pytest.raises(UsageError, match=r"line 2: torch==2.4.1 differs .*\(2.13.0\).*--image IMAGE"):
        ClusterSpec(requirements=str(bad))
    assert ClusterSpec(requirements=str(bad), image="team/train:1").image == "team/train:1"  # checked once probed
    with pytest.raises(UsageError, match="no such file"):
        ClusterSpec(requirements=str(tmp_path / "none.txt"))


def test_requirements_from_the_projects_pyproject(tmp_path):
    root = project(tmp_path)
    (root / "reqs.txt").write_text("tqdm\n")
    (root / "pyproject.toml").write_text('[tool.elastic-sim]\nrequirements = "reqs.txt"\n')
    spec = ClusterSpec(project_dir=str(root), script="scripts/train.py")
    assert spec.requirements == str(root / "reqs.txt")
    (root / "pyproject.toml").write_text('[tool.elastic-sim]\nrequirements = "missing.txt"\n')
    with pytest.raises(UsageError, match="missing.txt.*no such file"):
        ClusterSpec(project_dir=str(root), script="scripts/train.py")


def test_image_reference_is_checked():
    with pytest.raises(UsageError, match="--image 'Bad Image'"):
        ClusterSpec(image="Bad Image")


def test_scenario_keys_for_the_environment(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    text = f"""\
name: env
description: the seed job
cluster:
  nodes: 2
  nproc_per_node: 1
  project_dir: {SEEDJOB}
  script: {SEEDJOB / "train.py"}
  requirements: {SEEDJOB / "requirements.txt"}
  mounts: ["data:/data"]
  image: team/train:1
expect:
  outcome: recovers
"""
    scenario = parse_scenario(text, str(tmp_path / "env.yaml"))
    options = scenario_spec_options(scenario, "etcd-v2")
    spec = spec_from_options(options, options.pop("script_args", None))
    assert spec.project_dir == str(SEEDJOB) and spec.mounts == ((str(data), "/data", False),)
    assert spec.requirements == str(SEEDJOB / "requirements.txt") and spec.image == "team/train:1"
    with pytest.raises(UsageError, match=r"env.yaml:\d+: cluster.mounts.*not absolute"):
        parse_scenario(text.replace("data:/data", "data:data"), str(tmp_path / "env.yaml"))


def test_tree_summary_leaves_out_what_the_node_copy_leaves_out(tmp_path):
    root = project(tmp_path)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    (root / "mypkg" / "__pycache__").mkdir()
    (root / "mypkg" / "__pycache__" / "x.pyc").write_text("x")
    assert tree_summary(root).files == 3
    script = (IMAGES_DIR / "node" / "elastic-sim-project").read_text()
    assert "--exclude=$name" in script


def test_pip_failure_names_the_package_and_pips_reason():
    lines = [
        "WARNING: Location ... is ignored",
        "ERROR: Could not find a version that satisfies the requirement nosuchpkg (from versions: none)",
        "ERROR: No matching distribution found for nosuchpkg",
    ]
    assert pip_failure(lines, 1) == (
        "cannot install 'nosuchpkg': pip says: Could not find a version that satisfies the requirement "
        "nosuchpkg (from versions: none); fix its name or version"
    )
    assert pip_failure(["boom"], 2) == "pip failed (exit 2): boom"


def test_own_image_layer_copies_the_node_images_hooks():
    """The --image layer takes the node image's hook files by pattern: a new hook module lands in both."""
    names = {p.name for p in hook_files(IMAGES_DIR / "node")}
    dockerfile = (IMAGES_DIR / "node" / "Dockerfile").read_text()
    copied = set(re.findall(r"(elastic[_-]sim[\w.-]*\.(?:py|pth))", dockerfile))
    assert "elastic-sim.pth" in names and copied <= names


def test_apt_percentages_are_one_updating_line():
    assert is_progress_line("(Reading database ... 5%")
    assert not is_progress_line("(Reading database ... 6512 files and directories currently installed.)")
    assert not is_progress_line("Step 3/7 : RUN dpkg -i /tmp/libfaketime.deb")


class _FakeBuilder:
    """What UserImages.own_image asks of an ImageBuilder: its folders, the runtime wheelhouse and one build."""

    def __init__(self, tmp_path: Path):
        self.images_dir = IMAGES_DIR
        self.cache_dir = tmp_path / "cache"
        (self.cache_dir / "faketime").mkdir(parents=True)
        (self.cache_dir / "faketime" / "libfaketime.so.1").write_bytes(b"\x7fELF")
        self.wheels = tmp_path / "wheels"
        self.wheels.mkdir()
        self.built: list[tuple[str, str, dict]] = []
        self.progress = lambda line: None

    def wheelhouse(self) -> Path:
        return self.wheels

    def _docker_build(self, name: str, tag: str, ctx: Path, args: dict) -> None:
        assert (ctx / "Dockerfile").is_file() and (ctx / "libfaketime.so.1").is_file()
        self.built.append((name, tag, args))


class _FakeImages:
    def __init__(self):
        self.tags: set[str] = set()

    def image_exists(self, tag: str) -> bool:
        return tag in self.tags


def _probe(**fields) -> ImageProbe:
    base = dict(
        image="team/train:1",
        image_id="sha256:" + "ab" * 32,
        user="root",
        uid=0,
        gids=(0,),
        python="/usr/bin/python3",
        version="3.11",
        site="/usr/lib/python3/dist-packages",
        torch="2.13.0",
        torch_error=None,
        dists=("torch",),
        tools={},
        pip=False,
    )
    return ImageProbe(**{**base, **fields})


def test_the_own_image_is_keyed_by_the_team_images_user_and_built_once(tmp_path):
    """The --image layer's tag is a digest of what goes in it, the image's user and uid among them (the events
    folder goes to that uid): built with them as build args once, then found up to date; another uid is
    another image. (A TypeError in this key once reached only the integration test.)"""
    builder, engine = _FakeBuilder(tmp_path), _FakeImages()
    images = UserImages(builder, engine)
    tag = images.own_image(_probe())
    assert [(name, args["RUN_AS"], args["RUN_UID"]) for name, _, args in builder.built] == [("own", "root", "0")]
    assert builder.built[0][1] == tag and tag.split(":")[-1]
    engine.tags.add(tag)
    assert images.own_image(_probe()) == tag and len(builder.built) == 1
    other = images.own_image(_probe(user="trainer", uid=1234))
    assert other != tag and builder.built[-1][2]["RUN_UID"] == "1234"
    grouped = images.own_image(_probe(user="trainer", uid=1234, gids=(100, 1234)))  # the groups are labelled too
    assert grouped not in (tag, other) and builder.built[-1][2]["RUN_GIDS"] == "100,1234"


def test_doctor_says_a_root_team_image_holds_no_capability_in_the_nodes():
    from sim.engines.userimages import user_row

    ok, name, detail = user_row(_probe())
    assert (ok, name) == (False, "user") and "no capability" in detail and "USER in your Dockerfile" in detail
    assert user_row(_probe(user="trainer", uid=1234))[0] is True
