"""Privilege audit: what a cluster's containers may do beyond training, as findings.

One pure function over a Compose project (the dict sim/engines/render.py makes, or one rebuilt from the
engine's `docker inspect` of a running cluster), so `sim doctor` and the tests judge the same rules:
no privileged container, no capability but NET_ADMIN and only where a network fault needs it, workers
not root, the user's script read-only, no Docker socket inside, no port published beyond loopback,
and no sharing of the host's network, process or IPC namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sim.core import labels
from sim.core.spec import USER_SCRIPT_DIR

# Network faults (partition, loss, bandwidth, netem) run iptables and tc in node and etcd containers'
# network namespaces, from a short-lived helper container that joins one (labels.NETNS_HELPER): those
# roles may have NET_ADMIN, and nothing needs any other capability.
NET_ADMIN = "NET_ADMIN"
NET_ADMIN_ROLES = ("node", "etcd", labels.NETNS_HELPER)
LOOPBACK = ("127.0.0.1", "::1", "localhost")
ROOT_USERS = ("root", "0")
_HOST_NAMESPACES = ("network_mode", "pid", "ipc", "userns_mode")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One rule a service breaks."""

    service: str
    rule: str  # privileged | cap_add | root | script_writable | docker_socket | port | host_namespace
    detail: str

    def __str__(self) -> str:
        return f"{self.service}: {self.rule}: {self.detail}"


def audit_project(project: Mapping[str, Any]) -> list[Finding]:
    """Every rule each service of a Compose project breaks; empty when it keeps them all."""
    findings: list[Finding] = []
    for name, service in (project.get("services") or {}).items():
        findings += _audit_service(str(name), service or {})
    return findings


def _audit_service(name: str, service: Mapping[str, Any]) -> list[Finding]:
    found = []
    role = (service.get("labels") or {}).get(labels.ROLE, "")
    if service.get("privileged"):
        found.append(Finding(name, "privileged", "runs privileged: every device and capability of the host"))
    for cap in service.get("cap_add") or ():
        if cap.upper().removeprefix("CAP_") != NET_ADMIN:
            found.append(Finding(name, "cap_add", f"adds {cap}; only {NET_ADMIN} is needed (network faults)"))
        elif role not in NET_ADMIN_ROLES:
            found.append(
                Finding(
                    name,
                    "cap_add",
                    f"adds {NET_ADMIN}, but no fault acts on a {role or 'unlabelled'} container's network",
                )
            )
    user = str(service.get("user") or "").split(":")[0]
    if role == "node" and user in ROOT_USERS:
        found.append(Finding(name, "root", f"workers run as {user}; run them as the image's user (sim)"))
    for mount in service.get("volumes") or ():
        source, target, read_only = _mount(mount)
        if "docker.sock" in source or "docker.sock" in target:
            found.append(Finding(name, "docker_socket", f"mounts the Docker socket {source}: root on the host"))
        if target == USER_SCRIPT_DIR and not read_only:
            found.append(Finding(name, "script_writable", f"the user script's folder {source} is mounted writable"))
    for port in service.get("ports") or ():
        host_ip = _port_host_ip(port)
        if host_ip not in LOOPBACK:
            found.append(
                Finding(name, "port", f"publishes {port} on {host_ip or 'every address'}; bind it to 127.0.0.1")
            )
    for key in _HOST_NAMESPACES:
        if str(service.get(key) or "") == "host":
            found.append(Finding(name, "host_namespace", f"{key}: host shares the host's namespace"))
    return found


def _mount(mount: str | Mapping[str, Any]) -> tuple[str, str, bool]:
    """(source, target, read-only) of a Compose volume, long form or short ("src:dst:ro")."""
    if isinstance(mount, Mapping):
        return str(mount.get("source") or ""), str(mount.get("target") or ""), bool(mount.get("read_only"))
    parts = str(mount).split(":")
    if len(parts) == 1:
        return "", parts[0], False
    return parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")


def _port_host_ip(port: str | int | Mapping[str, Any]) -> str:
    """The host address a Compose port is published on ("" for every address)."""
    if isinstance(port, Mapping):
        return str(port.get("host_ip") or "")
    parts = str(port).rsplit(":", 2)
    return parts[0].strip("[]") if len(parts) == 3 else ""


def project_from_inspect(containers: Sequence[Mapping[str, Any]]) -> dict:
    """A Compose-shaped project from `docker inspect` of running containers, for audit_project.
    The user is the container's effective one (the image's USER unless overridden): "" means root."""
    services = {}
    for info in containers:
        config, host = info.get("Config") or {}, info.get("HostConfig") or {}
        container_labels = config.get("Labels") or {}
        name = container_labels.get(labels.NODE) or str(info.get("Name", "?")).lstrip("/")
        services[name] = {
            "labels": container_labels,
            "privileged": bool(host.get("Privileged")),
            "cap_add": list(host.get("CapAdd") or ()),
            "user": config.get("User") or "root",
            "volumes": [
                {"source": m.get("Source", ""), "target": m.get("Destination", ""), "read_only": not m.get("RW", True)}
                for m in info.get("Mounts") or ()
            ],
            "ports": [
                {"host_ip": binding.get("HostIp") or "", "published": binding.get("HostPort"), "target": port}
                for port, bindings in (host.get("PortBindings") or {}).items()
                for binding in bindings or ()
            ],
            "network_mode": host.get("NetworkMode", ""),
            "pid": host.get("PidMode", ""),
            "ipc": host.get("IpcMode", ""),
            "userns_mode": host.get("UsernsMode", ""),
        }
    return {"services": services}
