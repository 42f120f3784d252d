"""Privilege audit: what a cluster's containers may do beyond training, as findings.

One pure function over a Compose project (the dict sim/engines/render.py makes, or one rebuilt from the
engine's `docker inspect` of a running cluster), so `sim doctor` and the tests judge the same rules:
no privileged container, every capability dropped (`cap_drop: [ALL]`) and none added back but those
ALLOWED_CAPS names, each only on the roles whose faults need it, none to gain (no-new-privileges), workers
not root, the user's script read-only, no Docker socket inside, no port published beyond loopback,
and no sharing of the host's network, process or IPC namespace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sim.core import labels
from sim.core.spec import USER_SCRIPT_DIR
from sim.engines.docker import NO_NEW_PRIVILEGES

# Every capability a cluster container may add back after `cap_drop: [ALL]`: the roles it is allowed on,
# and why. Measured (engine 20.10, node image as user sim): the entrypoints, the etcd wait, torchrun and
# its workers, libfaketime and etcd itself run with no capability at all; signals to the workers go as
# their own user (no CAP_KILL); the fault scripts write only files the node's user owns. Network faults run
# iptables and tc in node and etcd network namespaces from a short-lived helper container that joins one
# (labels.NETNS_HELPER): the only container that holds a capability.
NET_ADMIN = "NET_ADMIN"
NET_ADMIN_ROLES = (labels.NETNS_HELPER,)
ALLOWED_CAPS: dict[str, tuple[tuple[str, ...], str]] = {
    NET_ADMIN: (NET_ADMIN_ROLES, "network faults (partition, loss, bandwidth, netem) run iptables and tc as root"),
}
LOOPBACK = ("127.0.0.1", "::1", "localhost")
ROOT_USERS = ("root", "0")
_HOST_NAMESPACES = ("network_mode", "pid", "ipc", "userns_mode")
# Rules a Swarm service cannot keep, and why: the audit names the gap instead of failing on it.
SWARM_GAPS = {
    "no_new_privileges": "Swarm services take no security_opt (`docker stack deploy` ignores it; moby/moby#41371)"
}
SWARM_TASK_LABEL = "com.docker.swarm.task.id"  # on the containers of a Swarm service's tasks


@dataclasses.dataclass(frozen=True)
class Finding:
    """One rule a service breaks."""

    service: str
    # privileged | cap_drop | cap_add | no_new_privileges | root | script_writable | docker_socket | port
    # | host_namespace
    rule: str
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
    dropped = {_cap(cap) for cap in service.get("cap_drop") or ()}
    if "ALL" not in dropped:
        found.append(Finding(name, "cap_drop", "keeps Docker's default capabilities; drop them all (cap_drop: [ALL])"))
    for cap in service.get("cap_add") or ():
        allowed = ALLOWED_CAPS.get(_cap(cap))
        if allowed is None:
            needed = ", ".join(f"{c} ({why})" for c, (_, why) in ALLOWED_CAPS.items())
            found.append(Finding(name, "cap_add", f"adds {cap}; no fault needs it, only {needed}"))
        elif role not in allowed[0]:
            found.append(
                Finding(
                    name,
                    "cap_add",
                    f"adds {cap}, but it is for {allowed[1]}: none on a {role or 'unlabelled'} container",
                )
            )
    if not _keeps_no_new_privileges(service) and not _is_swarm_service(service):
        found.append(
            Finding(
                name,
                "no_new_privileges",
                f"a setuid binary or file capability could gain privileges; add security_opt: [{NO_NEW_PRIVILEGES}]",
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


def _keeps_no_new_privileges(service: Mapping[str, Any]) -> bool:
    # Compose and the engine spell it no-new-privileges, no-new-privileges:true or no-new-privileges=true.
    for option in service.get("security_opt") or ():
        key, _, value = str(option).replace("=", ":").partition(":")
        if key.strip() == "no-new-privileges" and value.strip().lower() in ("", "true"):
            return True
    return False


def _is_swarm_service(service: Mapping[str, Any]) -> bool:
    # A stack's service (it has a deploy section) or a running Swarm task's container.
    return "deploy" in service or SWARM_TASK_LABEL in (service.get("labels") or {})


def swarm_gaps(project: Mapping[str, Any]) -> list[str]:
    """The rules a project's Swarm services are let off, each with its reason (empty for a Compose project)."""
    services = (project.get("services") or {}).values()
    if not any(_is_swarm_service(service or {}) for service in services):
        return []
    return [f"{rule}: {why}" for rule, why in SWARM_GAPS.items()]


def _cap(cap: str) -> str:
    return str(cap).upper().removeprefix("CAP_")


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
            "cap_drop": list(host.get("CapDrop") or ()),
            "security_opt": list(host.get("SecurityOpt") or ()),
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
