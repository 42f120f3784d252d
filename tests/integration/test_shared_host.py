"""Safe on a shared machine, part two (issue 37), with the real engine, real Compose and real paths:
a host path is given to the engine as it was checked; system, engine and credential folders are
refused by kind; locks are the engine's, not TMPDIR's; one engine for the SDK and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from sim.core import labels
from sim.core.errors import UsageError
from sim.core.spec import ClusterSpec
from sim.engines.cluster import Cluster
from sim.engines.render import render, to_yaml
from tests.conftest import run_sim, unique_name

pytestmark = pytest.mark.docker

UNSET = "SIM_TEST_NEVER_SET"  # `${UNSET-..}` is `..` to Compose's interpolation
PLAIN_JOB = "import time\nprint('started', flush=True)\ntime.sleep(100000)\n"


def dollar_tree(base: Path) -> Path:
    """A folder under `base` nested in as many `${UNSET-..}` folders as `base` is deep: legal names, which
    Compose's interpolation would read as `base/../../..`, that is `/`."""
    folder = base.joinpath(*[f"${{{UNSET}-..}}"] * len(base.parts))
    folder.mkdir(parents=True)
    return folder


def test_a_host_path_with_dollars_reaches_the_engine_as_it_was_checked(docker, images, tmp_path):
    data = dollar_tree(tmp_path / "data")
    (data / "marker").write_text("the folder that was checked")
    project = tmp_path / f"job-$HOME-${{{UNSET}-x}}"
    project.mkdir()
    (project / "train.py").write_text(PLAIN_JOB)
    for folder in (tmp_path, project):
        folder.chmod(0o755)
    name = unique_name("t-dollar")
    up = ["up", "--name", name, "--nodes", "1", "--nproc-per-node", "1", "--detach"]
    try:
        result = run_sim(*up, "--project-dir", str(project), "--script", "train.py", "--mount", f"{data}:/data:rw")
        assert result.returncode == 0, result.stderr[-2000:]
        node = Cluster(name, docker).container("node0")
        binds = {m["Destination"]: m["Source"] for m in docker.inspect(node.id)["Mounts"] if m["Type"] == "bind"}
        assert binds["/data"] == str(data), binds  # not `/`, read-write
        assert binds["/opt/sim/user"] == str(project), binds
        listed = Cluster(name, docker).exec("node0", "cat", "/data/marker")
        assert listed.stdout == "the folder that was checked"
    finally:
        run_sim("down", name)
    assert not Cluster(name, docker).exists()


def test_compose_reads_back_every_string_of_the_rendered_file_as_rendered(docker, tmp_path):
    """Every string that reaches the compose file (command, environment, labels, bind sources) is
    what `docker compose config` (real Compose, its own interpolation) hands on."""
    data = dollar_tree(tmp_path / "data")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(PLAIN_JOB)
    spec = ClusterSpec(
        name="t-dollar",
        nodes=1,
        nproc_per_node=1,
        project_dir=str(tmp_path / "job"),
        script="train.py",
        script_args=("--tag", f"${{{UNSET}-x}}$HOME"),
        env=(("PRICE", "$5 ${HOME}"),),
        mounts=(f"{data}:/data:rw",),
    )
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(to_yaml(render(spec, node_image="node:t", etcd_image="etcd:t", run_id="r1")))
    got = subprocess.run(
        [*docker.compose_argv, "-p", "t-dollar", "-f", str(compose_file), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    # `config` writes its model escaped again (`$$`), to be read by Compose: unescaped, what the engine gets.
    node = json.loads(got.stdout.replace("$$", "$"))["services"]["node0"]
    sources = {v["target"]: v["source"] for v in node["volumes"] if v["type"] == "bind"}
    assert sources["/data"] == str(data)
    assert sources["/opt/sim/user"] == str(tmp_path / "job")
    assert node["environment"]["PRICE"] == "$5 ${HOME}"
    assert f"${{{UNSET}-x}}$HOME" in node["command"]
    assert node["labels"][labels.CLUSTER] == "t-dollar"


SYSTEM_PATHS = ("/etc", "/usr", "/boot", "/proc", "/sys", "/var/log", "/etc/ssl", "/var", "/usr/local/bin")
CREDENTIAL_PATHS = (".docker", ".kube", ".aws", ".config/gcloud", ".ssh", ".gnupg", ".azure", ".config/gh")


@pytest.mark.parametrize("writable", [True, False], ids=["rw", "ro"])
def test_system_engine_and_credential_folders_are_refused_by_kind(docker, tmp_path, monkeypatch, writable):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for folder in CREDENTIAL_PATHS:
        (home / folder).mkdir(parents=True)
    from sim.engines.cluster import check_engine_root  # the engine's root, beside the fixed list

    mode = ":rw" if writable else ""
    root = Path(docker.data_root())  # the engine's own answer: real, whatever --data-root says
    cases = [(p, "a system folder") for p in SYSTEM_PATHS if Path(p).exists()]
    cases += [(str(home / p), "a credential folder") for p in CREDENTIAL_PATHS]
    cases += [(str(root), "the container engine's data root"), (str(root / "volumes"), "data root")]
    cases += [(str(root.parent), "it holds the container engine's data root")]
    for path, kind in cases:
        with pytest.raises(UsageError, match=re.escape(kind)) as refused:
            spec = ClusterSpec(name="t-kind", nodes=1, mounts=(f"{path}:/data{mode}",))
            check_engine_root(spec, docker)
        assert "refused" in str(refused.value) and "\n" not in str(refused.value)


def test_a_writable_etc_mount_is_one_line_and_nothing_is_made(docker):
    name = unique_name("t-etc")
    try:
        result = run_sim("up", "--name", name, "--nodes", "1", "--detach", "--mount", "/etc:/data:rw")
        assert result.returncode == 2, result.stderr[-2000:]
        line = result.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert "'/etc'" in line and "refused, a system folder: /etc" in line
    finally:
        run_sim("down", name)
    assert not Cluster(name, docker).exists()
