"""Docker Swarm as the engine: `sim up --engine swarm` deploys the rendered cluster as a stack.

An engine is a provider choice, not a fork of the code (DESIGN.md): `SwarmEngine` is the engine
interface's Swarm side (sim/engines/engine.py chooses it), and `SwarmDocker`, the provider its clusters
act through, is the Docker provider with three verbs changed. Compose's `up` becomes `docker stack deploy`
of the stack file that sim/engines/swarm_render.py makes from the rendered project (etcd first, until it
runs: Swarm has no `depends_on`; each node's agent then waits for etcd's health itself, as under Compose); removing a
task's container removes its service (with restart policy `none`, a service with no task would only
linger); starting a stopped task's container makes Swarm start a new task instead (a container
started by hand runs outside Swarm and its DNS). Everything else (containers by label, kill, pause,
exec, logs, events) is the engine's own: a task's container is a plain container on its host.

Several hosts: a task's container lives on the host Swarm placed it on, so every verb that names a
container (kill, pause, exec, inspect, `docker update`, logs) goes to that host's engine: this one's
for the tasks here, a registered one (sim/engines/swarm_hosts.py, `sim swarm add-host`) for the others;
listings (containers, volumes) and events gather every host's, one event thread per host. With one
host nothing changes: the local engine does everything, as before. A fault that cannot work across
hosts is refused before it acts: its provider's `capabilities` say which and why (docs/SWARM.md has the table).

The swarm itself: `ensure_swarm` initialises one on this engine when there is none, and records
that it did; `leave_if_ours` leaves it (and removes the docker_gwbridge network it made) once no
cluster of ours runs on it. A swarm the user had is kept.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import queue
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import requests
import yaml

from sim.core import hostpaths, labels
from sim.core.capabilities import ONE_HOST, SWARM, Capabilities, Placement
from sim.core.errors import SimError, UsageError
from sim.core.faultkinds import names_where
from sim.core.paths import state_home
from sim.core.progress import Progress, to_stderr
from sim.core.sidechannel import NODE_UID
from sim.core.spec import ClusterSpec
from sim.core.wait import Check, Condition, wait_for
from sim.engines.cluster import DEFAULT_START_TIMEOUT, Cluster
from sim.engines.cluster import up as compose_up
from sim.engines.docker import (
    API_TIMEOUT_S,
    Completed,
    Container,
    Docker,
    DockerError,
    DockerProvider,
    EventStream,
    Labelled,
)
from sim.engines.render import render
from sim.engines.swarm_hosts import HostDocker, registered
from sim.engines.swarm_render import SwarmLayout, to_stack

STACK_FILE = "stack.yaml"
LAYOUT_FILE = "swarm-layout.json"  # in the cluster's state folder: how scale-ups place new nodes
INIT_FILE = "swarm-init.json"  # in the state home: this tool initialised the engine's swarm
GWBRIDGE = "docker_gwbridge"
# The labels Swarm puts on a task's container.
SERVICE_LABEL = "com.docker.swarm.service.name"
SERVICE_ID_LABEL = "com.docker.swarm.service.id"
TASK_LABEL = "com.docker.swarm.task.id"
LISTEN_ADDR = "127.0.0.1:2377"  # a swarm made here serves this machine only; multi-host: docs/SWARM.md
ETCD_START_S = 120.0
GONE_S = 60.0
# Faults that cannot work when /ckpt is an NFS export (as on every swarm of several hosts), and why: the kinds
# that fill the checkpoint disk (their trait, sim.core.faultkinds).
REFUSED_ON_SHARED_CKPT = {
    name: "/ckpt is {shared}, which every host shares: filling it fills that disk (and every other "
    "user of it), not a size-limited disk of this cluster; use a one-host swarm or Compose with --ckpt-size"
    for name in names_where(lambda kind: kind.fills_disk)
}


@dataclasses.dataclass(frozen=True)
class SwarmHosts:
    """The swarm's hosts as this tool reaches them: an engine for each (this host's: the local engine;
    another's: the one registered for it), the hosts with none, and each swarm node id's host."""

    local: str
    engines: Mapping[str, DockerProvider]
    without_engine: tuple[str, ...] = ()
    node_hosts: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def engine(self, host: str, what: str) -> DockerProvider:
        if host not in self.engines:
            raise SimError(no_engine(host, what))
        return self.engines[host]


def no_engine(host: str, what: str) -> str:
    return (
        f"swarm host '{host}' runs {what}, and sim has no engine for it; register one: `sim swarm add-host {host} "
        f"--docker-host ssh://USER@{host}` (or tcp://{host}:2376 with --tls-ca/--tls-cert/--tls-key, or --context NAME)"
    )


def discover_hosts(docker: Docker) -> SwarmHosts:
    """`docker node ls` on this engine (a manager): each swarm host's engine, by its hostname."""
    local = Docker(docker.docker_bin)
    state, self_id = swarm_state(docker)
    if state != "active":
        return SwarmHosts("", {"": local})
    hosts = registered()
    engines: dict[str, DockerProvider] = {}
    node_hosts, without, here = {}, [], ""
    for node in docker._call("node ls", docker.api.nodes):
        name = node["Description"]["Hostname"]
        node_hosts[node["ID"]] = name
        if node["ID"] == self_id:
            here, engines[name] = name, local
        elif name in hosts:
            engines[name] = HostDocker(hosts[name], docker.docker_bin)
        else:
            without.append(name)
    return SwarmHosts(here, engines, tuple(sorted(without)), node_hosts)


def _routed(verb: str) -> Callable:
    def call(self: SwarmDocker, container: str, *args, **kwargs):
        return getattr(self._engine(container), verb)(container, *args, **kwargs)

    call.__name__ = verb
    call.__doc__ = f"`{verb}` on the engine of the host that runs the container."
    return call


class SwarmDocker(Docker):
    """The Docker provider for a cluster that runs as a Swarm stack, on one host or several."""

    def __init__(self, layout: SwarmLayout, docker_bin: str = "docker", hosts: SwarmHosts | None = None):
        super().__init__(docker_bin)
        self.layout = layout
        # How the hosts are found: `docker node ls` and the registry, or as given (tests).
        self.discover: Callable[[], SwarmHosts] = (
            (lambda: hosts) if hosts is not None else (lambda: discover_hosts(self))
        )
        self._where: dict[str, DockerProvider] = {}  # container id -> the engine of its host

    @functools.cached_property
    def hosts(self) -> SwarmHosts:
        return self.discover()

    @property
    def local(self) -> bool:
        return False  # its nodes may run on any of the swarm's hosts, not in this machine's memory

    @property
    def capabilities(self) -> Capabilities:
        """Swarm's, and on a /ckpt that every host shares, the faults that would act on that shared disk."""
        shared = self.layout.shared_ckpt
        if shared is None:
            return SWARM
        refused = {fault: reason.format(shared=shared) for fault, reason in REFUSED_ON_SHARED_CKPT.items()}
        return dataclasses.replace(SWARM, refused_faults=refused)

    # --- every host's containers, volumes and events; each container's verbs on its host's engine ---------

    def containers(self, label_filter: str) -> list[Container]:
        if self.hosts.without_engine:
            self._refuse_unreachable_tasks(label_filter)
        found = []
        for engine in self.hosts.engines.values():
            for container in engine.containers(label_filter):
                self._where[container.id] = engine
                found.append(container)
        return found

    def labelled(self, kind: str, label_filter: str) -> list[Labelled]:
        """Volumes are each host's own (one per host, by name); the overlay network is the swarm's."""
        if kind != "volume":
            return super().labelled(kind, label_filter)
        by_name: dict[str, Labelled] = {}
        for engine in self.hosts.engines.values():
            for volume in engine.labelled(kind, label_filter):
                by_name.setdefault(volume.id, volume)
        return list(by_name.values())

    def events(self, label_filter: str) -> EventStream:
        """Every host's events as one stream, including hosts that join the swarm (or get an engine
        registered) while it runs: a scale-up may place new nodes there."""

        def seen(host: str, container: str) -> None:
            engine = self.hosts.engines.get(host)
            if engine is not None:
                self._where[container] = engine

        def joined(followed: set[str]) -> dict[str, EventStream]:
            self.__dict__["hosts"] = self.discover()
            return {h: e.events(label_filter) for h, e in self.hosts.engines.items() if h not in followed}

        streams = {host: engine.events(label_filter) for host, engine in self.hosts.engines.items()}
        return MergedEvents(streams, seen, joined)

    kill = _routed("kill")
    inspect = _routed("inspect")
    pause = _routed("pause")
    unpause = _routed("unpause")
    stop = _routed("stop")
    exec = _routed("exec")
    net_exec = _routed("net_exec")
    resources = _routed("resources")
    update_resources = _routed("update_resources")
    logs = _routed("logs")
    follow_logs = _routed("follow_logs")
    write_logs = _routed("write_logs")

    def _engine(self, container: str) -> DockerProvider:
        """The engine of the host whose task runs `container` (this host's when Swarm knows no such task)."""
        engines = self.hosts.engines
        if len(engines) == 1:
            return next(iter(engines.values()))
        if container not in self._where:
            for task in self._call("service ps", self.api.tasks):
                if ((task.get("Status") or {}).get("ContainerStatus") or {}).get("ContainerID") == container:
                    host = self.hosts.node_hosts.get(task.get("NodeID", ""), "?")
                    self._where[container] = self.hosts.engine(host, f"container {container[:12]}")
        return self._where.get(container) or engines[self.hosts.local]

    def _refuse_unreachable_tasks(self, label_filter: str) -> None:
        """A task of these services on a host with no engine: its container cannot be listed or acted on."""
        value = label_filter.partition("=")[2]
        services = self._call("service ls", self.api.services, filters={"label": value})
        if not services:
            return
        for task in self._call("service ps", self.api.tasks, filters={"service": [s["ID"] for s in services]}):
            host = self.hosts.node_hosts.get(task.get("NodeID", ""), "")
            if host in self.hosts.without_engine:
                tags = ((task.get("Spec") or {}).get("ContainerSpec") or {}).get("Labels") or {}
                what = f"{tags.get(labels.NODE, 'a task')} of cluster '{tags.get(labels.CLUSTER, value)}'"
                raise SimError(no_engine(host, what))

    @property
    def compose_argv(self) -> list[str]:
        """Swarm needs no Compose; `docker stack` comes with the docker CLI."""
        if self._run([self.docker_bin, "stack", "--help"], timeout=20).returncode != 0:
            raise SimError(f"`{self.docker_bin} stack` is missing: the docker CLI deploys Swarm stacks")
        return [self.docker_bin, "stack"]

    def compose(
        self, project: str, compose_file: Path | None, *args: str, check: bool = True, timeout: float | None = 600
    ) -> Completed:
        if not args or args[0] != "up" or compose_file is None:
            raise UsageError(
                f"`compose {' '.join(args[:1])}`: a Swarm cluster has no such verb here; see docs/SWARM.md"
            )
        stack = stack_for(compose_file, self.layout)
        stack_file = compose_file.parent / STACK_FILE
        (compose_file.parent / LAYOUT_FILE).write_text(json.dumps(dataclasses.asdict(self.layout)))
        services = stack["services"]
        first = {name: s for name, s in services.items() if s["labels"].get(labels.ROLE) != "node"}
        if first and len(first) < len(services) and not self._running(project, first):
            self._deploy(project, stack_file, {**stack, "services": first}, check, timeout)
            wait_for(
                Condition("waiting for etcd to run", lambda: self._running(project, first)),
                timeout=ETCD_START_S,
            )
        result = self._deploy(project, stack_file, stack, check, timeout)
        # As `compose up --detach`: back once every service has its container (Swarm makes them later).
        wait_for(_TasksMade(self, project, services), timeout=ETCD_START_S)
        return result

    def start(self, container: str) -> None:
        """Start a stopped node or etcd. Its container started by hand would run outside Swarm: the
        task stays failed, and Swarm's DNS stops naming it (seen: peers could not resolve it). So
        Swarm makes a new task of the service (same hostname, same volumes), and the old container goes."""
        state = self.inspect(container)
        service = state["Config"]["Labels"].get(SERVICE_LABEL)
        if service is None or state["State"]["Running"]:
            self._engine(container).start(container)
            return
        argv = [self.docker_bin, "service", "update", "--force", "--detach", "--no-resolve-image", service]
        result = self._run(argv, timeout=API_TIMEOUT_S)
        if not result.ok:
            raise DockerError(f"`docker service update --force {service}` failed: {_last(result)}")
        replaced = Condition(
            f"waiting for Swarm to start a new task of {service}",
            lambda: any(c.id != container and c.running for c in self.containers(f"label={SERVICE_LABEL}={service}")),
        )
        wait_for(replaced, timeout=ETCD_START_S)
        self._engine(container).remove("container", [container])  # the dead task's container, not the service

    def restart(self, container: str, grace: float) -> None:
        self.stop(container, grace)
        self.start(container)

    def compose_process(
        self, project: str, compose_file: Path | None, *args: str, capture: bool = False
    ) -> subprocess.Popen:
        """`compose logs [-f] [NODE]` as `docker service logs` of each service (Compose sees no Swarm
        task); each line comes prefixed with its task and host, as `docker service logs` writes it."""
        if not args or args[0] != "logs":
            raise UsageError(
                f"`compose {' '.join(args[:1])}`: a Swarm cluster has no such verb here; see docs/SWARM.md"
            )
        follow = [arg for arg in args[1:] if arg == "-f"]
        nodes = [arg for arg in args[1:] if arg != "-f"]
        flt = f"label={labels.CLUSTER}={project}"
        services = sorted({c.labels[SERVICE_LABEL] for c in self.containers(flt) if SERVICE_LABEL in c.labels})
        if nodes:
            services = [f"{project}_{node}" for node in nodes]
        commands = [shlex.join([self.docker_bin, "service", "logs", *follow, service]) for service in services]
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
        # One `docker service logs` per service, side by side, as `compose logs` shows every container;
        # the shell takes its children along when it is told to end (follow_job terminates it).
        started = "".join(f'{command} & pids="$pids $!"; ' for command in commands)
        script = f"pids=''; {started}trap 'kill -KILL $pids 2>/dev/null' TERM INT HUP; wait"
        return subprocess.Popen(["sh", "-c", script], env=self.cli_env, **(pipe if capture else {}))

    def _deploy(self, project: str, path: Path, stack: dict, check: bool, timeout: float | None) -> Completed:
        path.write_text(yaml.safe_dump(stack, sort_keys=False, width=1000))
        # Our images are local: no registry is asked for a digest.
        argv = [self.docker_bin, "stack", "deploy", "--resolve-image", "never", "-c", str(path), project]
        result = self._run(argv, timeout)
        if check and not result.ok:
            raise DockerError(f"`docker stack deploy` failed: {_last(result)}")
        return result

    def _tasks(self, project: str, services: dict) -> list[dict]:
        names = {f"{project}_{name}" for name in services}
        flt = f"label={labels.CLUSTER}={project}"
        return [self.inspect(c.id) for c in self.containers(flt) if c.labels.get(SERVICE_LABEL) in names and c.running]

    def _running(self, project: str, services: dict) -> bool:
        return len(self._tasks(project, services)) == len(services)

    def remove(self, kind: str, ids: Sequence[str]) -> None:
        """A task's container goes with its service (else the service lingers, or heals it), on its host;
        a volume on every host that has one of that name; the overlay network once Swarm has let go of
        the tasks' endpoints on it."""
        if kind == "container":
            services = set()
            for cid in ids:
                try:
                    services.add(self.inspect(cid)["Config"]["Labels"].get(SERVICE_ID_LABEL))
                except DockerError:
                    continue  # already gone
            self._remove_services(services - {None})
            for cid in ids:
                self._engine(cid).remove(kind, [cid])
            return
        if kind == "volume":
            for engine in self.hosts.engines.values():
                engine.remove(kind, ids)  # one missing there is no error
            return
        for nid in ids:
            wait_for(_Removed(lambda nid=nid: super(SwarmDocker, self).remove("network", [nid]), nid), timeout=GONE_S)

    def _remove_services(self, service_ids: set[str]) -> None:
        for sid in service_ids:
            try:
                self._call("service rm", self.api.remove_service, sid)
            except DockerError:
                if self._call("service ls", self.api.services, filters={"id": sid}):
                    raise


class _TasksMade:
    """Ready once every service of the stack has a container; failed when Swarm rejects a task."""

    description = "waiting for Swarm to make every service's container"

    def __init__(self, docker: SwarmDocker, project: str, services: dict):
        self.docker, self.project, self.services = docker, project, services

    def check(self) -> Check:
        flt = f"label={labels.CLUSTER}={self.project}"
        made = {c.labels.get(SERVICE_LABEL) for c in self.docker.containers(flt)}
        missing = sorted(name for name in self.services if f"{self.project}_{name}" not in made)
        if not missing:
            return Check(True)
        tasks = self.docker._call(
            "service ps", self.docker.api.tasks, filters={"service": f"{self.project}_{missing[0]}"}
        )
        errors = [t["Status"].get("Err") for t in tasks if t["Status"].get("Err")]
        detail = f"{missing[0]}: {tasks[0]['Status'].get('Message', 'no task yet') if tasks else 'no task yet'}"
        if errors:
            return Check(False, failure=f"Swarm cannot run {missing[0]}: {errors[0]}")
        return Check(False, detail=detail)


class _Removed:
    """Ready once `remove` succeeds (Swarm lets go of a network's endpoints a moment after its tasks)."""

    def __init__(self, remove: Callable[[], None], what: str):
        self.remove = remove
        self.description = f"removing network {what[:12]}"
        self.last = ""

    def check(self) -> Check:
        try:
            self.remove()
        except DockerError as error:
            self.last = str(error)
            return Check(False, detail=self.last)
        return Check(True)


class MergedEvents:
    """Several hosts' event streams as one: a thread per host puts its events on one queue, in the order
    they come; `seen(host, container)` learns where each container lives. Every JOIN_CHECK_S,
    `joined(followed)` gives the streams of hosts that came since (none: no check). Ends when every
    stream has."""

    _END = object()
    JOIN_CHECK_S = 10.0

    def __init__(
        self,
        streams: Mapping[str, EventStream],
        seen: Callable[[str, str], None],
        joined: Callable[[set[str]], Mapping[str, EventStream]] | None = None,
    ):
        self.streams: dict[str, EventStream] = {}
        self.seen = seen
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._open = 0  # streams not yet ended
        self._closed = threading.Event()
        for host, stream in streams.items():
            self._follow(host, stream)
        if joined is not None:
            threading.Thread(target=self._watch_joins, args=(joined,), daemon=True).start()

    def _follow(self, host: str, stream: EventStream) -> None:
        with self._lock:
            self.streams[host] = stream
            self._open += 1
        threading.Thread(target=self._pump, args=(host, stream), daemon=True).start()

    def _watch_joins(self, joined: Callable[[set[str]], Mapping[str, EventStream]]) -> None:
        while not self._closed.wait(self.JOIN_CHECK_S):
            try:
                new = joined(set(self.streams))
            except (SimError, OSError, requests.exceptions.RequestException):
                continue  # the manager did not answer this time: ask again at the next check
            for host, stream in new.items():
                if self._closed.is_set():
                    stream.close()
                    return
                self._follow(host, stream)

    def _pump(self, host: str, stream: EventStream) -> None:
        try:
            for event in stream:
                self._queue.put((host, event))
        except (OSError, requests.exceptions.RequestException):
            pass  # its engine went away: that host's share ends (a closed stream just stops)
        finally:
            self._queue.put((host, self._END))

    def __iter__(self) -> Iterator[dict]:
        while True:
            with self._lock:
                if self._open == 0:
                    return
            host, event = self._queue.get()
            if event is self._END:
                with self._lock:
                    self._open -= 1
                continue
            actor = event.get("id") or (event.get("Actor") or {}).get("ID")
            if event.get("Type") == "container" and actor:
                self.seen(host, actor)
            yield event

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            streams = list(self.streams.values())
        for stream in streams:
            stream.close()


def stack_for(compose_file: Path, layout: SwarmLayout) -> dict:
    """The stack for the rendered compose file; its spec.json beside it fixes the packed layout."""
    project = yaml.safe_load(compose_file.read_text())
    spec = ClusterSpec.from_json((compose_file.parent / "spec.json").read_text())
    return to_stack(project, layout, max_nodes=spec.max_nodes or spec.nodes)


# --- the swarm on this engine ----------------------------------------------------------


def swarm_state(docker: Docker) -> tuple[str, str]:
    """(LocalNodeState, NodeID): inactive | pending | active | error | locked, and this node's id."""
    swarm = docker._call("info", docker.api.info).get("Swarm") or {}
    return str(swarm.get("LocalNodeState") or "inactive"), str(swarm.get("NodeID") or "")


def ensure_swarm(docker: Docker, progress: Progress = to_stderr) -> None:
    """Initialise a one-host swarm unless the engine is in one; remember that we did."""
    state, _ = swarm_state(docker)
    if state == "active":
        return
    if state != "inactive":
        raise SimError(f"this engine's swarm is {state}; fix it (`docker info`, `docker swarm leave`) and retry")
    gwbridge_before = bool(docker._call("network ls", docker.api.networks, names=[GWBRIDGE]))
    docker._call("swarm init", docker.api.init_swarm, advertise_addr="127.0.0.1", listen_addr=LISTEN_ADDR)
    _, node_id = swarm_state(docker)
    _init_file().parent.mkdir(parents=True, exist_ok=True)
    _init_file().write_text(json.dumps({"node_id": node_id, "gwbridge_before": gwbridge_before}))
    progress(f"[swarm] initialised a one-host swarm on this engine (node {node_id[:12]}); `sim down` leaves it")


def leave_if_ours(docker: Docker, progress: Progress = to_stderr) -> bool:
    """Leave the swarm when this tool made it and no cluster of ours runs on it any more."""
    path = _init_file()
    if not path.exists():
        return False
    made = json.loads(path.read_text())
    state, node_id = swarm_state(docker)
    if state != "active" or node_id != made.get("node_id"):
        path.unlink()  # left already, or the user made a swarm of their own since: not ours to leave
        return False
    if docker._call("service ls", docker.api.services, filters={"label": labels.CLUSTER}):
        return False
    # Leaving breaks Docker's DNS for networks made while in the swarm (docs/SWARM.md): never under
    # a Compose cluster of ours that still runs.
    if docker._call("container ls", docker.api.containers, filters={"label": labels.CLUSTER}):
        progress("[swarm] kept the swarm this tool made: other clusters run (`docker swarm leave --force` later)")
        return False
    docker._call("swarm leave", docker.api.leave_swarm, force=True)
    if not made.get("gwbridge_before"):
        for network in docker._call("network ls", docker.api.networks, names=[GWBRIDGE]):
            if network.get("Name") == GWBRIDGE and not docker.api.inspect_network(network["Id"]).get("Containers"):
                docker._call("network rm", docker.api.remove_network, network["Id"])
    path.unlink()
    progress("[swarm] left the swarm this tool had initialised")
    return True


def swarm_hosts(docker: Docker) -> tuple[str, ...]:
    """The swarm's ready hosts: this one first, then the others by name."""
    _, self_id = swarm_state(docker)
    ready = [n for n in docker._call("node ls", docker.api.nodes) if n["Status"]["State"] == "ready"]
    return tuple(
        n["Description"]["Hostname"]
        for n in sorted(ready, key=lambda n: (n["ID"] != self_id, n["Description"]["Hostname"]))
    )


def remove_services(docker: Docker, name: str) -> int:
    """Remove every service of cluster `name` (one that never got a task has no container to find
    it by), and wait until their containers are gone, so its network and volumes can go."""
    services = docker._call("service ls", docker.api.services, filters={"label": f"{labels.CLUSTER}={name}"})
    for service in services:
        docker._call("service rm", docker.api.remove_service, service["ID"])
    flt = labels.cluster_filter(name)
    wait_for(
        Condition("waiting for the stack's containers to go", lambda: not _task_containers(docker, flt)),
        timeout=GONE_S,
        raise_errors=False,
    )
    return len(services)


def _task_containers(docker: Docker, label_filter: str) -> list:
    return [c for c in docker.containers(label_filter) if TASK_LABEL in c.labels]


def require_engines(docker: SwarmDocker, spec: ClusterSpec) -> None:
    """Every host that the layout gives a node (or etcd) has an engine sim reaches: refused before deploying."""
    max_nodes = spec.max_nodes or spec.nodes
    needed = {docker.layout.hosts[0]: "etcd"} if docker.layout.hosts and spec.uses_etcd else {}
    for index in reversed(range(max_nodes)):
        needed[docker.layout.host_of(index, max_nodes)] = f"node{index}"
    for host, what in needed.items():
        if host in docker.hosts.without_engine:
            raise SimError(no_engine(host, f"{what} of cluster '{spec.name}'"))


def hosts_table(docker: Docker) -> list[str]:
    """`sim swarm hosts`: each swarm host and the engine sim reaches it by, then registered hosts not in the swarm."""
    known = registered()
    rows = [f"{'HOST':<24} ENGINE"]
    state, _ = swarm_state(docker)
    hosts = discover_hosts(docker) if state == "active" else SwarmHosts("", {})
    for host in sorted(hosts.node_hosts.values(), key=lambda h: (h != hosts.local, h)):
        if host == hosts.local:
            rows.append(f"{host:<24} this machine's engine (a manager)")
        elif host in known:
            rows.append(f"{host:<24} {known[host].address}")
        else:
            rows.append(f"{host:<24} none: `sim swarm add-host {host} --docker-host ssh://USER@{host}`")
    for host in sorted(set(known) - set(hosts.node_hosts.values())):
        rows.append(f"{host:<24} {known[host].address} (not in this engine's swarm)")
    if state != "active":
        rows.append(f"(this engine is in no swarm: {state}; `docker swarm init` or `sim up --engine swarm` makes one)")
    return rows


class SwarmEngine:
    """`--engine swarm` (sim/engines/engine.py's interface): a cluster deployed as a stack on this engine's
    swarm, made here if there is none; its clusters act through a SwarmDocker of the cluster's layout."""

    def __init__(self, docker: Docker, provider: SwarmDocker | None = None):
        self.manager = docker  # this machine's engine: it makes, and manages, the swarm
        self._provider = provider  # None until `up` places the cluster (a one-host layout until then)

    @classmethod
    def of_cluster(cls, docker: Docker, name: str) -> SwarmEngine:
        """The engine of an existing cluster: its layout as `up` recorded it (how scale-ups place new nodes)."""
        path = Cluster(name, docker).state_dir / LAYOUT_FILE
        layout = SwarmLayout(**json.loads(path.read_text())) if path.exists() else SwarmLayout()
        return cls(docker, SwarmDocker(layout, docker.docker_bin))

    @property
    def docker(self) -> SwarmDocker:
        if self._provider is None:
            self._provider = SwarmDocker(SwarmLayout(), self.manager.docker_bin)
        return self._provider

    @property
    def capabilities(self) -> Capabilities:
        return self.docker.capabilities

    def cluster(self, name: str) -> Cluster:
        return Cluster(name, self.docker)

    def exists(self, cluster: Cluster) -> bool:
        """Anything of it: labelled things, a service (one that never got a task has no container to find it
        by), or its state folder (its collector starts before the stack is deployed)."""
        services = self.manager._call(
            "service ls", self.manager.api.services, filters={"label": f"{labels.CLUSTER}={cluster.name}"}
        )
        return cluster.exists() or bool(services) or cluster.state_dir.exists()

    def up(
        self,
        spec: ClusterSpec,
        *,
        placement: Placement = ONE_HOST,
        keep: bool = False,
        timeout: float = DEFAULT_START_TIMEOUT,
        progress: Progress = to_stderr,
        replace: bool = False,
    ) -> Cluster:
        """The same `up` as Compose's (render, start, wait, clean up on failure), on a swarm (this engine's, made
        here if there is none) through SwarmDocker. `replace`: a cluster that holds the name goes first, its
        services with it (a service left behind would start its tasks again)."""
        docker = self.manager
        ckpt_dir = hostpaths.check_shared_ckpt_dir(placement.ckpt_dir, NODE_UID) if placement.ckpt_dir else None
        docker.ping()
        # A name already taken is compose_up's error to give; what it made is then not ours to remove.
        existed = Cluster(spec.name, docker).exists()
        # Every input is checked before the swarm is made: the stack of a stand-in rendering.
        stand_in = render(spec, node_image="check", etcd_image="check", run_id="check")
        shared = {"ckpt_nfs": placement.ckpt_nfs, "ckpt_dir": ckpt_dir}
        where = placement.placement
        to_stack(stand_in, SwarmLayout(placement=where, **shared), max_nodes=spec.max_nodes or spec.nodes)
        ensure_swarm(docker, progress)
        try:
            layout = SwarmLayout(hosts=swarm_hosts(docker), placement=where, **shared)
            self._provider = SwarmDocker(layout, docker.docker_bin)
            require_engines(self._provider, spec)
            if replace and existed:
                progress(f"[up] --replace: removing the cluster that holds the name '{spec.name}'")
                Cluster(spec.name, self._provider).down()
                remove_services(docker, spec.name)
                existed = False
            return compose_up(spec, self._provider, keep=keep, timeout=timeout, progress=progress)
        except BaseException:
            if not keep and not existed:
                remove_services(docker, spec.name)
                leave_if_ours(docker, progress)
            raise

    def down(self, cluster: Cluster, progress: Progress = to_stderr) -> dict[str, int]:
        """As for Compose, every labelled thing, each container with its service; then any service that never
        had a task; then the swarm, if this tool made it and nothing of ours runs on it."""
        removed = cluster.down()
        # Through the cluster's provider: the wait for the tasks' containers to go looks at every host.
        removed["services"] = remove_services(cluster.docker, cluster.name)
        leave_if_ours(cluster.docker, progress)
        return removed


def _init_file() -> Path:
    return state_home() / INIT_FILE


def _last(result: Completed) -> str:
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return lines[-1] if lines else f"exit code {result.returncode}"
