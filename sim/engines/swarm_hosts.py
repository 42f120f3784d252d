"""The engines of a multi-host swarm's other hosts: the registry (`sim swarm add-host`) and their clients.

A Swarm cluster's node containers run on whichever host Swarm placed their task, and a task's
container is a plain container of *that* host's engine: faults (kill, pause, exec, `docker update`),
logs and events must go there. `sim` talks to the local engine (a manager of the swarm) and, for each
other host, to the engine registered here under the host's name as `docker node ls` shows it: an
`ssh://USER@HOST` address (through the `ssh` client on PATH, as the docker CLI does), `tcp://HOST:2376`
with TLS files, `unix:///PATH`, or a Docker context. The registry is one JSON file in the state home.
Which host runs which task, and the routing, are sim/engines/swarm.py's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import docker as docker_sdk
import docker.errors as sdk_errors
from docker.context import ContextAPI

from sim.core.errors import DockerUnavailableError, UsageError
from sim.core.paths import state_home
from sim.engines.docker import API_TIMEOUT_S, Docker, DockerError, ExecResult
from sim.engines.swarm_render import HOST_RE

HOSTS_FILE = "swarm-hosts.json"  # in the state home
SCHEMES = ("ssh", "tcp", "unix")
ADDRESS_HELP = "ssh://USER@HOST, tcp://HOST:2376 (with --tls-ca/--tls-cert/--tls-key) or unix:///PATH"


@dataclasses.dataclass(frozen=True)
class HostEngine:
    """How to reach one swarm host's engine: a Docker address, or the name of a Docker context."""

    host: str  # the swarm node's hostname (`docker node ls`)
    docker_host: str | None = None
    context: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False  # tcp:// without TLS (anyone on the way can drive the engine): only when asked

    def __post_init__(self) -> None:
        if not HOST_RE.fullmatch(self.host):
            raise UsageError(f"swarm host {self.host!r}: not a hostname; `docker node ls` lists the swarm's hosts")
        if (self.docker_host is None) == (self.context is None):
            raise UsageError(f"swarm host '{self.host}': give --docker-host ADDRESS or --context NAME (one of them)")
        tls = (self.tls_ca, self.tls_cert, self.tls_key)
        if self.docker_host is not None:
            scheme = urlparse(self.docker_host).scheme
            if scheme not in SCHEMES or not urlparse(self.docker_host).netloc and scheme != "unix":
                raise UsageError(f"--docker-host {self.docker_host!r}: use {ADDRESS_HELP}")
            if any(tls) and scheme != "tcp":
                raise UsageError(f"--tls-*: TLS is for tcp:// addresses; {self.docker_host} is {scheme}://")
        elif any(tls):
            raise UsageError(f"--tls-* with --context: the context '{self.context}' holds its own TLS files")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise UsageError("--tls-cert and --tls-key: a client certificate and its key go together; give both")
        if self.docker_host is not None and urlparse(self.docker_host).scheme == "tcp":
            if not self.tls_ca and not self.insecure:
                what = "a client certificate without the CA" if self.tls_cert else "plain tcp://"
                raise UsageError(
                    f"--docker-host {self.docker_host}: {what} does not verify the engine; give --tls-ca FILE "
                    "(and --tls-cert/--tls-key), use ssh://USER@HOST, or add --insecure"
                )

    @property
    def address(self) -> str:
        return self.docker_host or f"context {self.context}"

    def client_kwargs(self) -> dict:
        """docker-py's APIClient arguments for this engine."""
        if self.context is not None:
            context = ContextAPI.get_context(self.context)
            if context is None:
                raise UsageError(
                    f"swarm host '{self.host}': no Docker context '{self.context}'; `docker context ls` lists them"
                )
            host = context.Host or ""
            return {"base_url": host, "tls": context.TLSConfig or False, "use_ssh_client": host.startswith("ssh://")}
        assert self.docker_host is not None
        for path in filter(None, (self.tls_ca, self.tls_cert, self.tls_key)):
            if not Path(path).is_file():
                raise UsageError(f"swarm host '{self.host}': TLS file {path} not found")
        tls: docker_sdk.tls.TLSConfig | bool = False
        if self.tls_ca or self.tls_cert:
            cert = (self.tls_cert, self.tls_key) if self.tls_cert else None
            tls = docker_sdk.tls.TLSConfig(client_cert=cert, ca_cert=self.tls_ca, verify=self.tls_ca or None)
        # ssh:// through the ssh client on PATH (the user's keys, agent and ~/.ssh/config), as the docker CLI does.
        return {"base_url": self.docker_host, "tls": tls, "use_ssh_client": self.docker_host.startswith("ssh://")}


class HostDocker(Docker):
    """The Docker provider on one registered host's engine (the same verbs, another client)."""

    def __init__(self, engine: HostEngine, docker_bin: str = "docker"):
        super().__init__(docker_bin)
        self.engine = engine

    @functools.cached_property
    def api(self) -> docker_sdk.APIClient:
        return self._client(timeout=API_TIMEOUT_S)

    @functools.cached_property
    def _stream_api(self) -> docker_sdk.APIClient:
        return self._client(timeout=None, version=self.api.api_version)

    def _client(self, **kwargs) -> docker_sdk.APIClient:
        try:
            return docker_sdk.APIClient(**kwargs, **self.engine.client_kwargs())
        except sdk_errors.DockerException as error:
            raise self._unreachable(str(error)) from None

    def _call(self, what: str, fn: Callable, *args, **kwargs):
        """One request to this host's engine; its errors name the host."""
        try:
            return super()._call(what, fn, *args, **kwargs)
        except DockerUnavailableError as error:
            raise self._unreachable(str(error)) from None
        except DockerError as error:
            raise DockerError(f"{error} (swarm host '{self.engine.host}')") from None

    def exec(self, container: str, argv, **options) -> ExecResult:
        """As the local engine's; a connection lost on the way (SSH, TCP) is one line naming the host."""
        try:
            return super().exec(container, argv, **options)
        except DockerUnavailableError as error:
            raise self._unreachable(str(error)) from None

    def ping(self) -> str:
        return str(self._call("version", self.api.version).get("Version", "?"))

    def _unreachable(self, detail: str) -> DockerUnavailableError:
        reason = re.search(r"not reachable \((.*)\)", detail)
        return DockerUnavailableError(
            f"swarm host '{self.engine.host}': its engine at {self.engine.address} is not reachable "
            f"({reason[1] if reason else detail}); check it with `sim swarm hosts`, or "
            f"`sim swarm add-host {self.engine.host} ...` again"
        )


# --- the registry ---------------------------------------------------------------------------


def registered() -> dict[str, HostEngine]:
    """Every registered host's engine, by host name."""
    path = _hosts_file()
    if not path.exists():
        return {}
    try:
        rows = json.loads(path.read_text())["hosts"]
        return {row["host"]: HostEngine(**row) for row in rows}
    except (ValueError, KeyError, TypeError, UsageError) as error:
        raise UsageError(f"{path}: not a host registry ({error}); remove it and `sim swarm add-host` again") from None


def register(engine: HostEngine) -> bool:
    """Add (or replace) a host's engine; True when it replaced one."""
    hosts = registered()
    replaced = engine.host in hosts
    hosts[engine.host] = engine
    _write(hosts)
    return replaced


def unregister(host: str) -> HostEngine:
    hosts = registered()
    if host not in hosts:
        known = ", ".join(sorted(hosts)) or "none"
        raise UsageError(f"swarm host '{host}': not registered (registered: {known}); `sim swarm hosts` lists them")
    engine = hosts.pop(host)
    _write(hosts)
    return engine


def _write(hosts: dict[str, HostEngine]) -> None:
    path = _hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in dataclasses.asdict(e).items() if v is not None} for _, e in sorted(hosts.items())]
    tmp = path.with_name(f".{path.name}.tmp")  # a reader never sees half a file
    tmp.write_text(json.dumps({"hosts": rows}, indent=2))
    os.replace(tmp, path)


def _hosts_file() -> Path:
    return state_home() / HOSTS_FILE
