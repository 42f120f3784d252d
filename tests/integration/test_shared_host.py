"""Safe on a shared machine, part two (issue 37), with the real engine, real Compose and real paths:
a host path is given to the engine as it was checked; system, engine and credential folders are
refused by kind; locks are the engine's, not TMPDIR's; one engine for the SDK and the CLI."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from sim.core import labels
from sim.core.errors import UsageError
from sim.core.spec import ClusterSpec
from sim.engines.cluster import Cluster
from sim.engines.render import render, to_yaml
from tests.conftest import ROOT, run_sim, unique_name

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
        # etcd is bounded too, as every node is (issue 37, 11).
        assert docker.resources(Cluster(name, docker).container("etcd").id).memory == 512 * 2**20
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


UP_ONE = ("--nodes", "1", "--nproc-per-node", "1", "--detach", "--", "--steps", "100000", "--step-time", "0.1")
NOBODY = 65534
HOLD_AS_NOBODY = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def refused_up(name: str, env: dict) -> subprocess.CompletedProcess:
    """`sim up` of `name`; whatever it made (the old code made a cluster) is removed after."""
    try:
        return run_sim("up", "--name", name, *UP_ONE, env=env, timeout=120)
    finally:
        run_sim("down", name)


def test_the_name_lock_is_the_engines_whatever_tmpdir_says(docker, tmp_path):
    name = unique_name("t-lock")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    holder_code = (
        "import sys, time\n"
        "from sim.engines.cluster import name_lock\n"
        "from sim.engines.docker import Docker\n"
        "with name_lock(Docker(), sys.argv[1]):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, name],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path / "a")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = refused_up(name, {"TMPDIR": str(tmp_path / "b"), "SIM_LOCK_TIMEOUT": "2"})
        assert result.returncode == 1, result.stderr[-2000:]
        line = result.stderr.strip().splitlines()[-1]
        assert f"another `sim up` or `sim down` of '{name}' is under way: pid {holder.pid}" in line, line
        assert "after 2s" in line and "SIM_LOCK_TIMEOUT" in line and "Traceback" not in result.stderr
    finally:
        holder.kill()
        holder.wait()
    assert not Cluster(name, docker).exists()


def test_a_lock_another_user_holds_is_one_line_naming_them_and_has_a_timeout(docker):
    from sim.engines.locks import engine_lock_path

    name = unique_name("t-lock")
    path = engine_lock_path(docker.engine_id(), f"{name}.lock")
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3", "-c"]
    holder = subprocess.Popen([*as_nobody, HOLD_AS_NOBODY, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert path.stat().st_uid == NOBODY
        result = refused_up(name, {"SIM_LOCK_TIMEOUT": "2"})
        assert result.returncode == 1, result.stderr[-2000:]
        line = result.stderr.strip().splitlines()[-1]
        assert f"pid {holder.pid} (user nobody (uid {NOBODY}): /usr/bin/python3 -c" in line, line
        assert "[up] waiting:" in result.stderr and "Traceback" not in result.stderr
    finally:
        holder.kill()
        holder.wait()
        path.unlink(missing_ok=True)
    assert not Cluster(name, docker).exists()


def test_a_lock_folder_another_user_made_first_is_refused_in_one_line(docker, tmp_path):
    folder = tmp_path / "locks"
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)
    name = unique_name("t-lock")
    result = refused_up(name, {"SIM_LOCK_DIR": str(folder)})
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"lock folder {folder}: owned by nobody (uid {NOBODY}), not by root or you" in line
    assert not Cluster(name, docker).exists()


class CountingProxy:
    """A unix socket forwarding to the engine's, noting each connection's HTTP User-Agent: who came through."""

    def __init__(self, path: Path, target: str = "/var/run/docker.sock"):
        self.path, self.target, self.agents = path, target, set()
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, outbound: bool) -> None:
        try:
            while data := src.recv(65536):
                if outbound:
                    self.agents.update(
                        m.decode(errors="replace") for m in re.findall(rb"User-Agent: ([^\r\n/]+)", data)
                    )
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


def test_a_docker_context_is_the_one_engine_of_the_sdk_and_of_compose(docker, tmp_path):
    """The current context (a real one, made by the docker CLI in a config folder of the test's) points at
    a socket of the test's that forwards to the engine: the SDK's calls and Compose's both come through it."""
    config = tmp_path / "docker-config"
    config.mkdir()
    plugins = Path.home() / ".docker" / "cli-plugins"
    if plugins.is_dir():
        (config / "cli-plugins").symlink_to(plugins)
    proxy = CountingProxy(tmp_path / "engine.sock")
    cli = ["docker", "--config", str(config), "context"]
    subprocess.run([*cli, "create", "via-proxy", "--docker", f"host=unix://{proxy.path}"], check=True, timeout=30)
    subprocess.run([*cli, "use", "via-proxy"], check=True, timeout=30, capture_output=True)
    env = {"DOCKER_CONFIG": str(config), "DOCKER_HOST": "", "DOCKER_CONTEXT": ""}
    name = unique_name("t-context")
    try:
        result = run_sim("up", "--name", name, *UP_ONE, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        assert Cluster(name, docker).container("node0").state == "running"
        gone = run_sim("down", name, env=env)
        assert gone.returncode == 0, gone.stderr[-2000:]
        assert not Cluster(name, docker).exists()
        # Both sides of the tool drove the context's engine: the SDK (ping, labels, the collector) and Compose.
        assert "docker-sdk-python" in proxy.agents, proxy.agents
        assert any("compose" in agent.lower() for agent in proxy.agents), proxy.agents
    finally:
        run_sim("down", name)
        proxy.close()


def test_a_plain_tcp_engine_on_another_machine_is_refused_in_one_line():
    result = run_sim("up", "--nodes", "1", "--detach", env={"DOCKER_HOST": "tcp://192.0.2.1:2375"}, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "DOCKER_HOST tcp://192.0.2.1:2375: plain TCP without TLS" in line


def events_dir_as(uid: int, run_dir: Path) -> Path:
    """prepare_events_dir run by a harness of another uid than root's and the nodes' (a forked child)."""
    from sim.core.sidechannel import prepare_events_dir

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setegid(uid)
            os.seteuid(uid)
            prepare_events_dir(run_dir, node_uid=1000)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return run_dir / "events"


def test_the_events_folder_of_a_third_users_harness_is_writable_by_the_nodes_only(docker, images):
    base = Path(tempfile.mkdtemp(prefix="elastic-sim-events-"))
    try:
        os.chown(base, NOBODY, NOBODY)
        events = events_dir_as(NOBODY, base / "run")
        info = events.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (NOBODY, NOBODY, 0o2770), oct(info.st_mode)
        node = render(
            ClusterSpec(name="t-ev", nodes=1), node_image=images.node, etcd_image="e", run_id="r1", events_dir=events
        )["services"]["node0"]
        assert node["group_add"] == [str(NOBODY)]
        # The node's user (1000, no capability) writes its records there through the group, as a node does.
        write = ["run", "--rm", "--user", "1000:1000", "--cap-drop", "ALL", "--network", "none"]
        write += ["--label", f"{labels.SESSION}={os.environ[labels.SESSION_ENV]}", "-v", f"{events}:/sim/events"]
        touch = ["--entrypoint", "sh", images.node, "-c", "echo '{}' > /sim/events/node0.jsonl"]
        ok = subprocess.run(["docker", *write, "--group-add", str(NOBODY), *touch], capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert (events / "node0.jsonl").stat().st_gid == NOBODY
        denied = subprocess.run(["docker", *write, *touch], capture_output=True, text=True)
        assert denied.returncode != 0  # any other uid of the machine, as the nodes without the group
    finally:
        shutil.rmtree(base)


def test_the_image_probe_holds_no_capability(docker, images):
    probe = docker.run_image(images.node, "sh", ["-c", "grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status"])
    assert probe.returncode == 0, probe.stderr
    caps = dict(line.split(":\t") for line in probe.stdout.splitlines())
    assert caps == {"CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapBnd": "0000000000000000"}
