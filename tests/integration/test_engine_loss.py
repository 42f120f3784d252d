"""Leaks and bad input (issue 11) that need the engine's side of things: Docker that dies in the middle
of `up`, and Ctrl-C while `up` builds an image. Real processes, a real engine, a real build.

Killing the real dockerd would take down every other cluster on the machine (and in CI): here the
engine vanishes from `sim`'s point of view only, behind a unix-socket proxy that is then shut."""

from __future__ import annotations

import os
import queue
import secrets
import signal
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from sim.core import labels
from sim.core.history import FILE_NAME
from sim.engines.cluster import Cluster
from sim.engines.images import ImageBuilder
from tests.conftest import run_sim, unique_name
from tests.integration.test_leaks import LONG_JOB, SimProcess, assert_nothing_left, ls_line, ours, wait_for_nodes

pytestmark = pytest.mark.docker

ENGINE_SOCKET = urlparse(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")).path


class EngineProxy:
    """A unix socket forwarding every connection to the engine's, until `cut`: then the listener and every
    forwarded connection close at once, as when dockerd dies. Records which programs connected."""

    def __init__(self, path: Path):
        self.path = path
        self.url = f"unix://{path}"
        self.peers: set[str] = set()  # command lines of the processes that connected
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # cut
            pid = struct.unpack("3i", client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            try:
                self.peers.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(ENGINE_SOCKET)
            with self._lock:
                self._open += [client, engine]
                if self._cut.is_set():
                    self._close_all()
                    return
            for src, dst in ((client, engine), (engine, client)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        self._listener.close()
        self.path.unlink(missing_ok=True)
        with self._lock:
            self._close_all()

    def _close_all(self) -> None:
        for conn in self._open:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # cut


def rest_of_output(proc: SimProcess) -> str:
    """Everything the (ended) process printed, read lines included."""
    while True:
        try:
            proc.seen.append(proc.lines.get(timeout=2))
        except queue.Empty:
            return "".join(proc.seen)


def last_line(output: str) -> str:
    return next((line for line in reversed(output.splitlines()) if line.strip()), "")


def processes_with(*words: str) -> list[int]:
    """Live processes whose command line holds every one of `words`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and state != "Z" and all(word.encode() in argv for word in words):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("phase", ["starting", "waiting"])
def test_docker_dying_in_the_middle_of_up_is_one_line_and_down_removes_the_rest(docker, images, phase):
    name = unique_name(f"t-engineloss{phase[0]}")
    with tempfile.TemporaryDirectory(prefix="sim-engine-") as folder:  # short: a socket path has 108 bytes
        proxy = EngineProxy(Path(folder) / "docker.sock")
        up = SimProcess("up", "--name", name, "--nodes", "2", *LONG_JOB, env={"DOCKER_HOST": proxy.url})
        try:
            up.wait_for_line("[up] starting cluster")
            run_dir = Cluster(name, docker).run_dir
            # Starting: Compose is at work (its first container runs). Waiting: Compose is done (etcd and both
            # nodes run), `up` waits for training to start.
            wait_for_nodes(docker, name, 1 if phase == "starting" else 3, poll=0.1)
            proxy.cut()
            cut_at = time.monotonic()
            code = up.proc.wait(timeout=120)
            took = time.monotonic() - cut_at
        finally:
            proxy.cut()
            if up.proc.poll() is None:
                up.proc.kill()
    output = rest_of_output(up)
    # Both ways to the engine went through the proxy: the SDK (this Python) and the Compose CLI.
    assert any("-m sim up" in peer for peer in proxy.peers), proxy.peers
    assert any("compose" in peer and name in peer for peer in proxy.peers), proxy.peers
    try:
        assert code != 0 and took < 60, (code, took, output[-3000:])
        assert "Traceback" not in output, output[-3000:]
        last = last_line(output)
        assert last.startswith("sim up: error:") and "Docker engine not reachable" in last, output[-3000:]
        assert f"python -m sim down {name}" in last, last  # what to do once the engine is back
        assert "leftover? `up` failed and could not remove it" in ls_line(name)  # the engine still holds it
        assert '"event": "start"' in (run_dir / FILE_NAME).read_text()
    finally:
        down = run_sim("down", name)
    assert down.returncode == 0, down.stderr
    assert_nothing_left(docker, name)


def test_ctrl_c_while_up_builds_an_image_leaves_nothing(docker, images):
    """A real build through `up`'s own path: a copy of the cached base image under a new name
    (SIM_BASE_IMAGE) gives every image above it a new tag, so `up` builds the runtime image; Ctrl-C
    once the build runs its first RUN step (its container at work, the layers before it committed).
    Cheap: the build stops seconds in, and the images the suite uses are not touched. A copy of a new
    id, not a second tag: the build cache is keyed by the parent image's id, and the suite's own
    runtime build would answer every step from the cache before the Ctrl-C lands."""
    name = unique_name("t-buildint")
    repo, tag = "elastic-sim-test/base", secrets.token_hex(4)
    base = f"{repo}:{tag}"
    copy = docker.api.create_container(images.base, command=["true"], labels={labels.IMAGE: "test-base-copy"})
    try:
        docker.api.commit(copy["Id"], repository=repo, tag=tag, changes=[f"LABEL elastic-sim-test.copy={tag}"])
    finally:
        docker.api.remove_container(copy["Id"])
    runtime = ImageBuilder(docker).runtime_tag(base)
    ours_dangling = {"dangling": True, "label": labels.IMAGE}  # every build step of ours inherits the label
    dangling_before = set(docker.api.images(quiet=True, filters=ours_dangling))
    contexts_before = set(Path(tempfile.gettempdir()).glob("elastic-sim-runtime-*"))
    up = SimProcess("up", "--name", name, "--nodes", "1", *LONG_JOB, env={"SIM_BASE_IMAGE": base})
    try:
        up.wait_for_line(f"[runtime] building {runtime}")
        up.wait_for_line(": RUN ")
        assert processes_with("build", runtime), "no `docker build` process seen while the build ran"
        up.proc.send_signal(signal.SIGINT)
        code = up.proc.wait(timeout=60)  # well before the build could end (pip installs torch: minutes)
    finally:
        if up.proc.poll() is None:  # a build that went on would end in `up`'s removal of "stale" images
            for pid in [up.proc.pid, *processes_with("build", runtime)]:
                os.killpg(pid, signal.SIGKILL)
        docker.remove_images([base])  # our name only: the image stays, the suite's base
    output = rest_of_output(up)
    assert code != 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert last_line(output) == "sim up: interrupted", output[-3000:]
    assert processes_with("build", runtime) == []  # the build and its children were stopped
    assert not docker.image_exists(runtime)
    half_built = set(docker.api.images(quiet=True, filters=ours_dangling)) - dangling_before
    docker.remove_images(sorted(half_built))  # (ours: never left behind, even by a failing test)
    assert half_built == set()
    assert set(Path(tempfile.gettempdir()).glob("elastic-sim-runtime-*")) <= contexts_before
    assert ours(docker, name) == {"container": [], "network": [], "volume": []}
    assert_nothing_left(docker, name)
