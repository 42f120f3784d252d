"""The backend's settings, read from torchrun's ``--rdzv-endpoint`` and ``--rdzv-conf``."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

DEFAULT_PORT = 2379
DEFAULT_KEY_PREFIX = "/torch/elastic"
# etcd-v2 keeps the rendezvous state for two hours after its last write; we do the same.
DEFAULT_TTL_S = 7200

_HOST_RE = re.compile(r"^[\w.:-]+$")


class ConfigError(ValueError):
    """A bad ``--rdzv-endpoint`` or ``--rdzv-conf`` value; the message is one line naming key, problem and fix."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclasses.dataclass(frozen=True)
class EtcdConfig:
    """How to reach etcd and where to keep the rendezvous state and the store's keys."""

    endpoints: tuple[Endpoint, ...]
    protocol: str = "http"
    read_timeout_s: float = 60.0
    connect_timeout_s: float = 10.0
    # How long the client keeps trying to connect while etcd is down (restarting, its name not resolving),
    # counted from the first failed connect of the outage and shared by every call: once etcd has been
    # unreachable that long, calls fail at once until a connect succeeds. Connecting again is always
    # safe: no request of that call reached etcd.
    reconnect_timeout_s: float = 30.0
    key_prefix: str = DEFAULT_KEY_PREFIX
    ttl_s: int = DEFAULT_TTL_S
    ca_cert: str | None = None
    ssl_cert: str | None = None
    ssl_cert_key: str | None = None
    user: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    allow_plain_password: bool = False  # a password over http to a host not on this machine

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ConfigError("rdzv-endpoint is empty: give etcd's client address, e.g. --rdzv-endpoint etcd:2379")
        if self.protocol not in ("http", "https"):
            raise ConfigError(f"rdzv-conf protocol={self.protocol!r} is not supported: use protocol=http or https")
        _require_positive("read_timeout", self.read_timeout_s)
        _require_positive("connect_timeout", self.connect_timeout_s)
        if not 0 <= self.reconnect_timeout_s < float("inf"):
            raise ConfigError(
                f"rdzv-conf reconnect_timeout={self.reconnect_timeout_s} must be seconds >= 0, "
                "e.g. reconnect_timeout=30"
            )
        # etcd refuses leases shorter than its minimum TTL (a few seconds); 2 s is the least we let through.
        if self.ttl_s < 2:
            raise ConfigError(f"rdzv-conf ttl={self.ttl_s} is too short: give whole seconds >= 2, e.g. ttl=7200")
        if not self.key_prefix.startswith("/") or self.key_prefix.endswith("/") and self.key_prefix != "/":
            raise ConfigError(
                f"rdzv-conf key_prefix={self.key_prefix!r} must start with '/' and not end with one, "
                "e.g. key_prefix=/torch/elastic"
            )
        for key in ("ca_cert", "ssl_cert", "ssl_cert_key"):
            path = getattr(self, key)
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"rdzv-conf {key}={path} is not a readable file: give the path of a PEM file")
        if self.ssl_cert_key and not self.ssl_cert:
            raise ConfigError("rdzv-conf ssl_cert_key is set without ssl_cert: give both, or neither")
        if (self.user is None) != (self.password is None):
            raise ConfigError("rdzv-conf user and password go together: give both (or password_file), or neither")
        if self.protocol != "https":
            given = [key for key in ("ca_cert", "ssl_cert", "ssl_cert_key") if getattr(self, key) is not None]
            if given:
                raise ConfigError(
                    f"rdzv-conf {given[0]} is set but protocol={self.protocol}: TLS files are used only with "
                    "protocol=https (or https:// endpoints); add it, or drop them"
                )
            remote = [str(e) for e in self.endpoints if e.host not in LOOPBACK]
            if self.password is not None and remote and not self.allow_plain_password:
                raise ConfigError(
                    f"rdzv-conf password over protocol=http to {remote[0]} would cross the network in clear: use "
                    "protocol=https (or https:// endpoints), or add allow_plain_password=1 for a trusted network"
                )

    @property
    def rendezvous_prefix(self) -> bytes:
        return (self.key_prefix.rstrip("/") + "/rendezvous/").encode()

    @property
    def store_prefix(self) -> bytes:
        return (self.key_prefix.rstrip("/") + "/store/").encode()

    @classmethod
    def from_rdzv(cls, endpoint: str | None, conf: dict[str, Any]) -> EtcdConfig:
        """Build from ``--rdzv-endpoint`` and the ``--rdzv-conf`` mapping (unknown keys belong to the handler)."""
        protocol, endpoints = parse_endpoints(endpoint)
        password = _password(conf)
        return cls(
            endpoints=endpoints,
            protocol=str(conf.get("protocol", protocol)).strip().lower(),
            read_timeout_s=_number(conf, "read_timeout", 60.0),
            connect_timeout_s=_number(conf, "connect_timeout", 10.0),
            reconnect_timeout_s=_number(conf, "reconnect_timeout", 30.0, zero_ok=True),
            key_prefix=str(conf.get("key_prefix", DEFAULT_KEY_PREFIX)).strip(),
            ttl_s=int(_number(conf, "ttl", DEFAULT_TTL_S, whole=True)),
            ca_cert=_optional(conf, "ca_cert"),
            ssl_cert=_optional(conf, "ssl_cert"),
            ssl_cert_key=_optional(conf, "ssl_cert_key"),
            user=_optional(conf, "user"),
            password=password,
            allow_plain_password=str(conf.get("allow_plain_password", "0")).strip().lower() in ("1", "true", "yes"),
        )


def parse_endpoints(endpoint: str | None) -> tuple[str, tuple[Endpoint, ...]]:
    """``host[:port][,host[:port]...]``, each optionally ``http://`` or ``https://``; returns (protocol, endpoints)."""
    schemes = set()
    endpoints = []
    for item in (endpoint or "").split(","):
        item = item.strip().rstrip("/")
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if sep:
            schemes.add(scheme.lower())
            item = rest
        endpoints.append(_parse_host_port(item))
    if len(schemes) > 1:
        raise ConfigError(f"rdzv-endpoint {endpoint!r} mixes http:// and https://: use one scheme for every endpoint")
    return (schemes.pop() if schemes else "http"), tuple(endpoints)


def _parse_host_port(item: str) -> Endpoint:
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif item.count(":") == 1:
        host, port_text = item.split(":")
    else:
        host, port_text = item, ""
    if not host or not _HOST_RE.match(host):
        raise ConfigError(f"rdzv-endpoint {item!r} has no valid host: write HOST:PORT, e.g. etcd:2379")
    if not port_text:
        return Endpoint(host, DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"rdzv-endpoint {item!r} has a bad port: write HOST:PORT with a port in 1-65535")
    return Endpoint(host, int(port_text))


def _password(conf: dict[str, Any]) -> str | None:
    """The password: given as it is, or read from a file or an environment variable (either keeps it out
    of the command line, which every process of the machine can read, and out of torch's log of the conf)."""
    given = {key: _optional(conf, key) for key in ("password", "password_file", "password_env")}
    named = [key for key, value in given.items() if value is not None]
    if len(named) > 1:
        raise ConfigError(f"rdzv-conf has both {named[0]} and {named[1]}: give one")
    if given["password_file"] is not None:
        try:
            return Path(given["password_file"]).read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"rdzv-conf password_file={given['password_file']} cannot be read ({exc.strerror})"
            ) from None
    if given["password_env"] is not None:
        value = os.environ.get(given["password_env"])
        if not value:
            raise ConfigError(
                f"rdzv-conf password_env={given['password_env']}: no such environment variable (or it is empty); "
                "set it in the agent's environment"
            )
        return value
    return given["password"]


def _optional(conf: dict[str, Any], key: str) -> str | None:
    value = conf.get(key)
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def _number(conf: dict[str, Any], key: str, default: float, whole: bool = False, zero_ok: bool = False) -> float:
    value = conf.get(key)
    if value is None or str(value).strip() == "":
        return default
    try:
        number = int(str(value).strip()) if whole else float(str(value).strip())
    except ValueError:
        kind = "a whole number of seconds" if whole else "a number of seconds"
        raise ConfigError(f"rdzv-conf {key}={value!r} is not {kind}: e.g. {key}={int(default)}") from None
    if not (zero_ok and number == 0):
        _require_positive(key, number)
    return number


def _require_positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"rdzv-conf {key}={value} must be greater than 0 (seconds)")
