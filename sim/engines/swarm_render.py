"""A rendered Compose project (sim/engines/render.py) -> a stack file for `docker stack deploy`. Pure: no Docker.

The same cluster, adapted to what Swarm takes (docs/SWARM.md has the probe behind each rule):
each node is a service of one replica, pinned to a host by a placement constraint; the network
is an attachable overlay; the restart policy is `none` (faults stay ours, Swarm heals nothing);
names resolve to the task's own address (`endpoint_mode: dnsrr`), so partitions cut real peers;
every service, container, network and volume carries the cluster label. GPUs are reserved as
Swarm generic resources, since `docker stack deploy` takes no `devices` or GPU device requests.
"""

from __future__ import annotations

import dataclasses
import math
import re

from sim.core import labels
from sim.core.errors import UsageError
from sim.core.spec import parse_size
from sim.engines.compose_escape import compose_literal, compose_unliteral

STACK_VERSION = "3.9"
PLACEMENTS = ("spread", "packed")
# The generic resource kind each GPU host announces in its daemon.json (node-generic-resources).
GPU_RESOURCE_KIND = "NVIDIA-GPU"
# Keys `docker stack deploy` refuses (mem_limit, memswap_limit, depends_on with conditions, name) or
# ignores with a warning (container_name, restart, shm_size, pids_limit, security_opt): to_stack replaces
# each with its Swarm form; pids_limit has none in stack files before 3.x of engine 23
# (deploy.resources.limits.pids), security_opt none at all (the audit names that gap: SWARM_GAPS).
COMPOSE_ONLY_KEYS = (
    "container_name",
    "restart",
    "depends_on",
    "mem_limit",
    "memswap_limit",
    "shm_size",
    "pids_limit",
    "security_opt",
)
_NFS_RE = re.compile(r"^(?P<server>[A-Za-z0-9][A-Za-z0-9.-]*):(?P<export>/[^\s,]*)$")
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class SwarmLayout:
    """Where a cluster's services run on a swarm.

    `hosts`: the swarm nodes' hostnames, in order (etcd goes on the first); empty: one host, no
    constraints. `placement`: spread (node i on host i mod H) or packed (hosts filled in order,
    ceil(max_nodes / H) nodes each): both depend on the node's index only, so a scale-up never
    moves a running node. `ckpt_nfs`: SERVER:/EXPORT for the checkpoint volume that every host
    must reach; `ckpt_dir`: instead, a host folder that is one shared file system at the same path on
    every host (an NFS or cluster file system the hosts mount themselves); a local volume serves one
    host only."""

    hosts: tuple[str, ...] = ()
    placement: str = "spread"
    ckpt_nfs: str | None = None
    ckpt_dir: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(self.hosts))
        if self.placement not in PLACEMENTS:
            raise UsageError(f"--placement {self.placement!r}: unknown; use one of {', '.join(PLACEMENTS)}")
        for host in self.hosts:
            if not HOST_RE.fullmatch(host):
                raise UsageError(f"swarm host {host!r}: not a hostname; `docker node ls` lists the swarm's hosts")
        if len(set(self.hosts)) != len(self.hosts):
            raise UsageError(f"swarm hosts {', '.join(self.hosts)}: a host is named twice")
        if self.ckpt_nfs is not None and not _NFS_RE.fullmatch(self.ckpt_nfs):
            raise UsageError(
                f"--ckpt-nfs {self.ckpt_nfs!r}: not SERVER:/EXPORT; use e.g. --ckpt-nfs 10.0.0.5:/srv/ckpt"
            )
        if self.ckpt_nfs is not None and self.ckpt_dir is not None:
            raise UsageError("--ckpt-nfs and --ckpt-dir: both name the shared checkpoint disk; give one of them")
        if self.ckpt_dir is not None and not self.ckpt_dir.startswith("/"):
            raise UsageError(
                f"--ckpt-dir {self.ckpt_dir!r}: not an absolute path; use e.g. --ckpt-dir /mnt/shared/ckpt"
            )
        if len(self.hosts) > 1 and self.shared_ckpt is None:
            raise UsageError(
                f"{len(self.hosts)} swarm hosts: a local checkpoint volume is one per host, so a node moved or "
                "restarted elsewhere would not find the job's checkpoint; give --ckpt-nfs SERVER:/EXPORT, or "
                "--ckpt-dir DIR for a folder every host mounts at that path"
            )

    @property
    def shared_ckpt(self) -> str | None:
        """The checkpoint disk every host shares, in words (None: a local volume)."""
        if self.ckpt_nfs is not None:
            return f"the NFS export {self.ckpt_nfs}"
        if self.ckpt_dir is not None:
            return f"the shared folder {self.ckpt_dir}"
        return None

    def host_of(self, index: int, max_nodes: int) -> str | None:
        """The host node `index` runs on (None: Swarm chooses, on a one-host layout)."""
        if not self.hosts:
            return None
        if self.placement == "spread":
            return self.hosts[index % len(self.hosts)]
        per_host = math.ceil(max(max_nodes, index + 1) / len(self.hosts))
        return self.hosts[min(index // per_host, len(self.hosts) - 1)]


def to_stack(project: dict, layout: SwarmLayout, *, max_nodes: int) -> dict:
    """The stack file for a rendered Compose project (as `render` returns it, or as its YAML reads
    back). `max_nodes` fixes the packed layout, so scaling up keeps every running node in place.
    `docker stack deploy` interpolates as Compose does: the project's strings are taken back to what
    the engine is to get, and the whole stack escaped once, what this adds (an NFS export) included."""
    project = compose_unliteral(project)
    stack = {"version": STACK_VERSION, "services": {}, "networks": {}, "volumes": {}}
    for name, service in project["services"].items():
        stack["services"][name] = _service(service, layout, max_nodes)
    for name, network in project["networks"].items():
        stack["networks"][name] = {**network, "driver": "overlay", "attachable": True}
    for name, volume in project["volumes"].items():
        stack["volumes"][name] = _ckpt_volume(volume, layout) if name == "ckpt" else volume
    return compose_literal(stack)


def _service(service: dict, layout: SwarmLayout, max_nodes: int) -> dict:
    tags = service["labels"]
    deploy = {
        "mode": "replicated",
        "replicas": 1,
        "endpoint_mode": "dnsrr",
        "restart_policy": {"condition": "none"},
        "labels": dict(tags),
    }
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    if reservations.get("devices"):
        deploy["resources"] = {"reservations": {"generic_resources": _gpu_resources(reservations["devices"])}}
    if "mem_limit" in service:
        # Swarm sets no swap limit of its own: the engine allows as much swap again (docs/SWARM.md).
        deploy.setdefault("resources", {})["limits"] = {"memory": str(service["mem_limit"])}
    host = _host(tags, layout, max_nodes)
    if host is not None:
        deploy["placement"] = {"constraints": [f"node.hostname == {host}"]}
    out = {key: value for key, value in service.items() if key not in COMPOSE_ONLY_KEYS and key != "deploy"}
    if "shm_size" in service:
        # Swarm has no shm_size: a tmpfs of that size on /dev/shm is the same thing.
        out["volumes"] = [
            *out.get("volumes", []),
            {"type": "tmpfs", "target": "/dev/shm", "tmpfs": {"size": parse_size("shm_size", service["shm_size"])}},
        ]
    out["deploy"] = deploy
    return out


def _host(tags: dict, layout: SwarmLayout, max_nodes: int) -> str | None:
    if tags.get(labels.ROLE) != "node":
        return layout.hosts[0] if layout.hosts else None  # etcd: beside its local data volume
    return layout.host_of(int(tags[labels.NODE].removeprefix("node")), max_nodes)


def _gpu_resources(devices: list[dict]) -> list[dict]:
    count = 0
    for device in devices:
        if device.get("count") == "all":
            raise UsageError(
                "--gpus all: Swarm reserves GPUs by count (generic resources), not all of a host's; "
                "give a number per node, e.g. --gpus 1"
            )
        count += len(device.get("device_ids") or ()) or int(device.get("count") or 0)
    return [{"discrete_resource_spec": {"kind": GPU_RESOURCE_KIND, "value": count}}]


def _ckpt_volume(volume: dict, layout: SwarmLayout) -> dict:
    if layout.shared_ckpt is None:
        return volume
    if volume.get("driver_opts"):
        flag = "--ckpt-nfs" if layout.ckpt_nfs else "--ckpt-dir"
        raise UsageError(
            f"--ckpt-size with {flag}: the size makes /ckpt a tmpfs on one host, {layout.shared_ckpt} is the "
            "disk every host shares; drop one of them"
        )
    if layout.ckpt_dir is not None:
        # The local driver's bind: each host's engine mounts its own path, which is the shared file system.
        return {**volume, "driver": "local", "driver_opts": {"type": "none", "o": "bind", "device": layout.ckpt_dir}}
    match = _NFS_RE.fullmatch(layout.ckpt_nfs)
    assert match is not None  # SwarmLayout checked it
    return {
        **volume,
        "driver": "local",
        "driver_opts": {"type": "nfs", "o": f"addr={match['server']},rw,nfsvers=4", "device": f":{match['export']}"},
    }
