"""Cluster lifecycle: up (render, start, wait), inspect, down.

Labels are the source of truth (as in kind): a cluster is whatever carries its
label, so `down` works after a crash, without the compose file. A failed `up`
removes what it made unless asked to keep it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sim.core import labels
from sim.core.errors import ClusterError, ClusterNotFoundError, SimError, UsageError
from sim.core.history import FILE_NAME, AgentRecord, History, HistoryTail, Record, TrainerRecord, WorkerRecord
from sim.core.nodes import node_order
from sim.core.paths import ClusterName, check_name, cluster_dir, inside, state_home, valid_name
from sim.core.progress import Progress, to_stderr
from sim.core.sidechannel import NODE_UID, prepare_events_dir
from sim.core.spec import SHIPPED_TRAINER_DEFAULTS, ClusterSpec, check_room_beside, node_need_mib
from sim.core.wait import Check, Condition, wait_for
from sim.engines.docker import NO_MEMORY_LIMIT, RESOURCE_KINDS, Container, DockerError, DockerProvider, ExecResult
from sim.engines.images import ImageBuilder, ImageSet
from sim.engines.locks import engine_lock
from sim.engines.render import render, to_yaml

DEFAULT_START_TIMEOUT = 300.0
# The history collector runs in a process of its own, started by module name: this module
# must not import it (the collector imports this one). Its pid file lets `down` stop it.
COLLECTOR_MODULE = "sim.engines.collector"
COLLECTOR_PID_FILE = "collector.pid"
# The process that made the cluster and will remove it (`chaos run`, a test); gone once a person owns it.
OWNER_PID_FILE = "owner.pid"
# Written when `up` failed and could not remove what it made (the engine gone): `ls` says why it is left.
UP_FAILED_FILE = "up-failed"
COLLECTOR_DRAIN_S = 10.0


@dataclasses.dataclass(frozen=True)
class ContainerInfo:
    """One of the cluster's containers, as its labels name it."""

    id: str
    name: str
    node: str  # node0.. or etcd
    role: str  # node | etcd
    state: str  # created | running | paused | restarting | exited | dead
    status: str  # Docker's human status, e.g. "Exited (0) 3 seconds ago" (shown, never parsed)
    run_id: str
    exit_code: int | None = None  # set once exited or dead
    ips: Mapping[str, str] = dataclasses.field(default_factory=dict)  # network -> address

    @classmethod
    def of(cls, container: Container) -> ContainerInfo:
        tags = container.labels
        return cls(
            id=container.id,
            name=container.name,
            node=tags.get(labels.NODE, ""),
            role=tags.get(labels.ROLE, ""),
            state=container.state,
            status=container.status,
            run_id=tags.get(labels.RUN, ""),
            exit_code=container.exit_code,
            ips=container.ips,
        )


class Cluster:
    """A running (or half-gone) cluster, found by its label."""

    def __init__(self, name: str | ClusterName, docker: DockerProvider, *, source: str = "cluster"):
        # A name becomes a path (its state and run folders) and a label filter: a str from a flag or a Docker
        # label is checked here; a ClusterName (a spec's, a scenario's) was checked where it came in.
        self.name = ClusterName(name, source=source)
        self.docker = docker

    # --- what its name stands for: derived here, once -------------------------------

    @property
    def project(self) -> str:
        """Its Compose project name (and Swarm stack's): the cluster's name."""
        return self.name

    @functools.cached_property
    def label_filter(self) -> str:
        """The Docker filter of everything it is made of (labels.CLUSTER)."""
        return labels.cluster_filter(self.name)

    # --- where its files live ------------------------------------------------

    @functools.cached_property
    def state_dir(self) -> Path:
        return cluster_dir(self.name)

    @property
    def compose_file(self) -> Path:
        return self.state_dir / "compose.yaml"

    @property
    def spec(self) -> ClusterSpec | None:
        path = self.state_dir / "spec.json"
        return ClusterSpec.from_json(path.read_text()) if path.exists() else None

    @property
    def run_id(self) -> str | None:
        """The run `up` started (its state file); `down` falls back to the containers' labels."""
        path = self.state_dir / "run_id"
        return path.read_text().strip() or None if path.exists() else None

    @property
    def run_dir(self) -> Path:
        return run_dir(self.name, self.run_id or "unknown")

    def _run_dir_by_labels(self, infos: Sequence[ContainerInfo]) -> Path:
        """The run folder even when the state folder is gone (a crash): labels are the truth."""
        run_id = self.run_id or next((c.run_id for c in infos if valid_name(c.run_id, what="run id")), None)
        return run_dir(self.name, run_id or "unknown")

    # --- inspection ------------------------------------------------------------

    def containers(self) -> list[ContainerInfo]:
        found = self.docker.containers(self.label_filter)
        infos = [ContainerInfo.of(c) for c in found if c.labels.get(labels.ROLE) != labels.NETNS_HELPER]
        return sorted(infos, key=lambda c: (c.role != "etcd", node_order(c.node)))

    def nodes(self) -> list[ContainerInfo]:
        return [c for c in self.containers() if c.role == "node"]

    def container(self, node: str) -> ContainerInfo:
        for info in self.containers():
            if info.node == node:
                return info
        known = ", ".join(c.node for c in self.containers()) or "none"
        raise UsageError(f"node '{node}': not in cluster '{self.name}' (nodes: {known}); see `sim status {self.name}`")

    def exists(self) -> bool:
        return any(self.docker.ids(kind, self.label_filter) for kind in RESOURCE_KINDS)

    def require_running(self) -> None:
        if not any(c.state in ("running", "paused") for c in self.containers()):
            raise ClusterNotFoundError(
                f"cluster '{self.name}': not running; "
                f"start it with `python -m sim up --name {self.name}` (see `sim ls`)"
            )

    def logs(self, node: str, tail: int | None = None) -> str:
        return self.docker.logs(self.container(node).id, tail=tail)

    def exec(self, node: str, *argv: str, user: str | None = None, timeout: float = 30) -> ExecResult:
        return self.docker.exec(self.container(node).id, argv, user=user, timeout=timeout)

    def net_exec(self, node: str, *argv: str, timeout: float = 30) -> ExecResult:
        """argv (iptables, tc, ip) as root in the node's network namespace, from a short-lived helper container
        of our base image: the node's own image (ours, or the team's from --image) needs none of these tools.
        The helper carries the cluster's labels, so `down` sweeps one that a crash left behind."""
        helper_labels = {**labels.cluster_labels(self.name, self.run_id), labels.ROLE: labels.NETNS_HELPER}
        image = self.helper_image
        return self.docker.net_exec(self.container(node).id, argv, image=image, labels=helper_labels, timeout=timeout)

    @property
    def helper_image(self) -> str:
        """The network helper's image: the cluster's base image (iproute2, iptables), as `up` recorded it."""
        path = self.state_dir / "images.json"
        if path.exists():
            return json.loads(path.read_text())["base"]
        return ImageBuilder(self.docker).base_tag()

    # --- changing it ---------------------------------------------------------------

    def start_nodes(self, names: Sequence[str], *, nodes: int) -> None:
        """Start these node containers (new or stopped) through Compose; when the spec has
        fewer than `nodes` nodes, the project is first re-rendered for `nodes` (same run, same images)."""
        spec = self.spec
        if spec is None:
            raise ClusterError(f"cluster '{self.name}': its spec.json is missing; cannot add nodes")
        with engine_room(self.docker, spec, "scale --nodes", nodes):
            if nodes > spec.nodes:
                images = ImageSet(**json.loads((self.state_dir / "images.json").read_text()))
                write_state(self, spec.with_nodes(nodes), images, self.run_id or "")
            self.docker.compose(
                self.project, self.compose_file, "up", "--detach", "--no-deps", "--no-recreate", "--no-build", *names
            )

    # --- teardown ----------------------------------------------------------------

    def save_logs(self) -> Path:
        """Copy every container's full log into the run folder (it outlives `down`)."""
        infos = self.containers()
        return self._save_logs(infos, self._run_dir_by_labels(infos))

    def _save_logs(self, infos: Sequence[ContainerInfo], run_folder: Path) -> Path:
        target = run_folder / "logs"
        target.mkdir(parents=True, exist_ok=True)
        for info in infos:
            # The node label names the file: one that is no plain name (a crafted label) falls back to the id.
            stem = info.node if valid_name(info.node, what="node name") else f"container-{info.id[:12]}"
            path = inside(target, f"{stem}.log")
            stream = getattr(self.docker, "write_logs", None)  # streamed where the provider can (Docker)
            if stream is None:
                path.write_text(self.docker.logs(info.id, timestamps=True))
                continue
            try:
                stream(info.id, path, timestamps=True)
            except SimError:
                path.write_text("")  # gone since the listing: as `logs` answers then
        secrets = _run_secrets(run_folder)
        for path in target.glob("*.log"):
            if secrets:
                redact_file(path, secrets)
            path.chmod(0o600)  # what the job printed is its owner's to read
        return target

    def down(self, *, save_logs: bool = True) -> dict[str, int]:
        """Remove everything carrying the cluster's label. Idempotent. Under the name's lock: an `up`
        of the same name waits until it is done."""
        with name_lock(self.docker, self.name):
            return self._down(save_logs=save_logs)

    def owners(self) -> set[str]:
        """The owner labels (labels.OWNER) its containers, networks and volumes carry ('' for none)."""
        flt = self.label_filter
        return {r.labels.get(labels.OWNER, "") for kind in RESOURCE_KINDS for r in self.docker.labelled(kind, flt)}

    def foreign_owner(self) -> str | None:
        """Another state home's owner label on any of its resources (None: all of them are this home's)."""
        mine = labels.owner()
        others = sorted(o or "no owner label" for o in self.owners() if o != mine)
        return others[0] if others else None

    def _down(self, *, save_logs: bool) -> dict[str, int]:
        infos = self.containers()
        run_folder = self._run_dir_by_labels(infos)
        if save_logs and infos:
            self._save_logs(infos, run_folder)
        flt = self.label_filter
        if (run_folder / FILE_NAME).exists():
            # Before the teardown: the kills that follow are not the job's own exits.
            History(run_folder / FILE_NAME).append({"type": "run", "event": "end", "cluster": self.name})
        removed = {}
        for kind in RESOURCE_KINDS:
            ids = self.docker.ids(kind, flt)
            self.docker.remove(kind, ids)
            removed[f"{kind}s"] = len(ids)
            if kind == "container":
                self._stop_collector()  # it drains the containers' last events, then ends
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return removed

    # --- the collector process ------------------------------------------------------

    def _start_collector(self) -> None:
        """The collector, detached from this process's session, following this cluster. Ctrl-C (SIGTERM, SIGHUP)
        waits until its pid is written: a collector nobody knows of could not be stopped."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        try:
            log_fd = os.open(self.run_dir / "collector.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with open(log_fd, "ab") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", COLLECTOR_MODULE, self.name],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    env=self.docker.cli_env,  # the engine this process resolved, whatever context is current later
                )
            (self.state_dir / COLLECTOR_PID_FILE).write_text(str(proc.pid))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _pid_file(self, name: str) -> int:
        """A pid from the state folder (0: none written)."""
        try:
            return int((self.state_dir / name).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def release(self) -> None:
        """The process that made the cluster hands it over (to a person, after `up`): its end is no leak."""
        (self.state_dir / OWNER_PID_FILE).unlink(missing_ok=True)

    def leftover_reason(self, infos: Sequence[ContainerInfo]) -> str | None:
        """Why this cluster looks left behind by a harness that died (None: it looks looked after)."""
        if (self.state_dir / UP_FAILED_FILE).exists():
            why = (self.state_dir / UP_FAILED_FILE).read_text(errors="replace").strip()
            return f"`up` failed and could not remove it ({why})" if why else "`up` failed and could not remove it"
        if any(c.state == "created" for c in infos):
            return "half-made: containers created, never started"
        if not self.state_dir.exists():
            return "no state folder here: its harness was killed, or it runs under another SIM_HOME"
        owner = self._pid_file(OWNER_PID_FILE)
        if owner and not _alive(owner):
            return f"the harness that made it (pid {owner}) was killed"
        collector = self._pid_file(COLLECTOR_PID_FILE)
        if collector and not _alive(collector):
            return "its history collector is gone"
        return None

    def _stop_collector(self) -> None:
        """Let the collector drain (it exits once the containers are gone), then make sure."""
        pid = self._pid_file(COLLECTOR_PID_FILE)
        if not pid:
            return
        gone = wait_for(
            Condition("waiting for the collector to drain", lambda: not _alive(pid)),
            timeout=COLLECTOR_DRAIN_S,
            interval=0.2,
            raise_errors=False,
        )
        if not gone.ready and _is_collector(pid, self.name):
            os.kill(pid, signal.SIGTERM)


def _is_collector(pid: int, name: str) -> bool:
    """Whether pid is still this cluster's collector (`python -m sim.engines.collector NAME`), not a process that
    reused the number of one that ended (a stale pid file): read from /proc/PID/cmdline."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return COLLECTOR_MODULE.encode() in argv and name.encode() in argv


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A finished child of ours that nobody reaped is a zombie: not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_dir(name: ClusterName, run_id: str) -> Path:
    name = ClusterName(name, source="cluster")  # as passed down (checked where it came in); a plain str: now
    check_name(run_id, what="run id", source=f"cluster '{name}': run id")
    return inside(state_home() / "runs", f"{name}-{run_id}")


def labelled_clusters(docker: DockerProvider) -> dict[str, set[str]]:
    """Every cluster label value on any container, network or volume, with its owner labels."""
    flt = f"label={labels.CLUSTER}"
    found: dict[str, set[str]] = {}
    for kind in RESOURCE_KINDS:
        for r in docker.labelled(kind, flt):
            found.setdefault(r.labels[labels.CLUSTER], set()).add(r.labels.get(labels.OWNER, ""))
    return found


def list_clusters(docker: DockerProvider, *, owned: bool = False) -> list[ClusterName]:
    """Every cluster name that any container, network or volume is labelled with, made a ClusterName here (a
    label is where it comes in): only valid names (a label that is no name, e.g. `../../x`, names nothing of
    ours); owned=True: only those every resource of which this state home owns (labels.OWNER)."""
    mine = labels.owner()
    names = []
    for label, owners in labelled_clusters(docker).items():
        try:
            name = ClusterName(label, source="label")
        except UsageError:
            continue
        if not owned or owners == {mine}:
            names.append(name)
    return sorted(names)


# --- room on this engine's machine ---------------------------------------------------------

ROOM_STATES = ("running", "paused", "restarting")  # a node that holds (or will soon hold) its memory


def other_clusters_memory(docker: DockerProvider, name: str) -> dict[str, list[int]]:
    """Each other cluster on this engine -> the MiB each of its nodes that runs counts for: its label
    (labels.MEMORY), else its memory limit, else what a node of the default size needs."""
    found: dict[str, list[int]] = {}
    for container in docker.containers(f"label={labels.ROLE}=node"):
        cluster = container.labels.get(labels.CLUSTER, "")
        if cluster == name or container.state not in ROOM_STATES:
            continue
        text = container.labels.get(labels.MEMORY, "")
        if text.isdigit():
            mib = int(text)
        else:  # a node of an older elastic-sim: no label
            try:
                limit = docker.resources(container.id).memory
            except DockerError:  # gone since the listing
                continue
            mib = -(-limit // 2**20) if 0 < limit < NO_MEMORY_LIMIT else node_need_mib(ClusterSpec.nproc_per_node)
        found.setdefault(cluster, []).append(mib)
    return found


def check_engine_room(docker: DockerProvider, spec: ClusterSpec, flag: str, nodes: int) -> None:
    """Refuse `nodes` nodes of `spec` that this machine cannot hold beside the nodes of other clusters
    running on its engine (a local one only: a remote engine's or a swarm's memory is not this machine's)."""
    if getattr(docker, "local", False):
        check_room_beside(flag, nodes, spec.counted_memory_mib, other_clusters_memory(docker, spec.name))


@contextlib.contextmanager
def engine_room(docker: DockerProvider, spec: ClusterSpec, flag: str, nodes: int, progress: Progress | None = None):
    """Check the room for `nodes` nodes and hold it until the caller has made them: the host-wide room
    lock is held from the check until the block ends (Compose's `up` returned, the nodes exist), so two
    clusters' `up` or `scale` cannot both count the same free memory before either has made a node."""
    if not getattr(docker, "local", False):
        yield
        return
    with engine_lock(
        docker.engine_id(), ROOM_LOCK_FILE, progress, "another cluster's nodes are being made on this engine"
    ):
        check_engine_room(docker, spec, flag, nodes)
        yield


# --- one `up` or `down` of a name at a time -------------------------------------------------

# Engine-wide, not per state home nor per TMPDIR: two homes or users on one engine must not race for
# one name either (sim/engines/locks.py).
# Not a cluster name (names have no dot): held while a room check's nodes are made (engine_room).
ROOM_LOCK_FILE = "engine-room.lock"
_held_locks: dict[str, int] = {}
_held_guard = threading.Lock()


@contextlib.contextmanager
def name_lock(docker: DockerProvider, name: ClusterName, progress: Progress | None = None):
    """Hold the cluster name's lock on this engine (locks.engine_lock on NAME.lock): `up` and `down` of
    one name, from any process, user or state home, run one at a time. Re-entrant within a process (a
    failed `up` removes what it made under the lock it holds)."""
    name = ClusterName(name, source="cluster")  # as passed down (checked where it came in); a plain str: now
    with _held_guard:
        if _held_locks.get(name):
            _held_locks[name] += 1
            held = True
        else:
            held = False
    if held:
        try:
            yield
        finally:
            with _held_guard:
                _held_locks[name] -= 1
        return
    waiting_for = f"another `sim up` or `sim down` of '{name}' is under way"
    with engine_lock(docker.engine_id(), f"{name}.lock", progress, waiting_for):
        with _held_guard:
            _held_locks[name] = 1
        try:
            yield
        finally:
            with _held_guard:
                _held_locks.pop(name, None)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class TrainingStarted:
    """Ready once training has started: the first round's worker group is being started (the
    agents' own "Starting worker group"), or the first sign of training (a progress line, an
    instrumented worker), whichever comes first; also ready when every node already exited 0
    (a script that finishes early is a success). Failed when a node exited non-zero first.

    It reads the run's history (the collector already follows every log), so waiting costs one
    `docker ps` a poll, not a `docker logs` per node: start-up is CPU-bound and every process
    the harness runs slows it down. Nothing here depends on what the script prints."""

    description = "waiting for training to start"

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.tail = HistoryTail(cluster.run_dir / FILE_NAME)

    def check(self) -> Check:
        for record in self.tail.poll():
            started = _training_started(record)
            if started:
                return Check(True, detail=started)
        nodes = self.cluster.nodes()
        if not nodes:
            return Check(False, failure="no node containers exist")
        exited = [c for c in nodes if c.state in ("exited", "dead")]
        failed = [c for c in exited if c.exit_code != 0]
        if failed:
            first = failed[0]
            last_line = _last_meaningful_line(self.cluster.logs(first.node, tail=50))
            return Check(False, failure=f"{first.node} exited ({first.status}) before training started: {last_line}")
        if len(exited) == len(nodes):
            return Check(True, detail="every node already finished (exit 0)")
        return Check(False, detail=", ".join(f"{c.node} {c.state}" for c in nodes))


def _training_started(record: Record) -> str | None:
    """What in one history record shows training started (and where), if anything."""
    if isinstance(record, AgentRecord) and record.event == "group_started":
        return f"{record.node or '?'} started its worker group"
    if isinstance(record, TrainerRecord) and record.kind == "progress":
        return f"first step on {record.node or '?'}"
    if isinstance(record, WorkerRecord):
        return f"workers running on {record.node or '?'}"
    return None


class JobFinished:
    """Ready when every node container has exited (the job ended, well or not)."""

    description = "waiting for the job to end"

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def check(self) -> Check:
        nodes = self.cluster.nodes()
        if not nodes:
            return Check(False, failure="no node containers exist")
        running = [c.node for c in nodes if c.state not in ("exited", "dead")]
        return Check(not running, detail=f"still running: {', '.join(running)}" if running else "")


def _last_meaningful_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def up(
    spec: ClusterSpec,
    docker: DockerProvider,
    *,
    builder: ImageBuilder | None = None,
    keep: bool = False,
    wait: bool = True,
    timeout: float = DEFAULT_START_TIMEOUT,
    progress: Progress = to_stderr,
    replace: bool = False,
) -> Cluster:
    """Build images if needed, render and start the compose project, wait until
    training has started. On any failure (Ctrl-C included) remove what was
    made, unless keep=True. All under the name's lock (name_lock): two `up`s of
    one name cannot both pass the check below. replace=True removes a cluster
    that holds the name, whoever owns it."""
    docker.ping()
    check_engine_root(spec, docker)
    _ = docker.compose_argv  # fail now, before anything is made, if Compose v2 is missing
    cluster = Cluster(spec.name, docker, source="--name")
    with name_lock(docker, cluster.name, progress):
        _clear_name(cluster, replace=replace, progress=progress)
        check_engine_room(docker, spec, "--nodes", spec.nodes)
        return _up(cluster, spec, docker, builder=builder, keep=keep, wait=wait, timeout=timeout, progress=progress)


def _clear_name(cluster: Cluster, *, replace: bool, progress: Progress) -> None:
    """Refuse the name if a cluster holds it (another home's, or a live one of ours); sweep what a
    killed harness of this home left. With replace: remove whatever holds it."""
    if not cluster.exists():
        return
    name = cluster.name
    if replace:
        progress(f"[up] --replace: removing the cluster that holds the name '{name}'")
        cluster.down()
        return
    foreign = cluster.foreign_owner()
    if foreign is not None:
        raise UsageError(
            f"--name '{name}': a cluster of that name belongs to another state home ({foreign}); "
            "choose another --name, or add --replace to remove it"
        )
    infos = cluster.containers()
    leftover = cluster.leftover_reason(infos) if infos else "networks or volumes only"
    if leftover is None:
        raise UsageError(
            f"--name '{name}': a cluster of that name already exists; "
            f"remove it with `python -m sim down {name}` (or add --replace) or choose another --name"
        )
    # What a killed harness of this home left behind is swept by label (its logs are kept), not refused.
    progress(f"[up] removing what a killed harness left of '{name}' ({leftover})")
    cluster.down()


def job_images(
    spec: ClusterSpec, docker: DockerProvider, *, builder: ImageBuilder | None = None, progress: Progress = to_stderr
):
    """The images `spec`'s cluster runs, built where missing: ours, and the team's own node image or the
    requirements layer over ours. Before two `up`s at once (sim vet), so that they do not build one image twice."""
    builder = builder or ImageBuilder(docker, progress=progress)
    images = builder.ensure(need_etcd=spec.uses_etcd, etcd_version=spec.etcd_server_version).images
    if spec.image is not None or spec.requirements is not None:
        from sim.engines.userimages import UserImages

        images = dataclasses.replace(images, node=UserImages(builder, docker).node_image(spec, images.node))
    return images


def _up(
    cluster: Cluster,
    spec: ClusterSpec,
    docker: DockerProvider,
    *,
    builder: ImageBuilder | None,
    keep: bool,
    wait: bool,
    timeout: float,
    progress: Progress,
) -> Cluster:
    images = job_images(spec, docker, builder=builder, progress=progress)
    _check_nodes_can_read(spec, node_uid(docker, images.node), node_gids(docker, images.node))
    _say_what_it_brings(spec, progress)

    run_id = new_run_id()
    created = False
    try:
        # Checked again, now held until the nodes exist: another cluster's `up` may have made its own
        # since the first check (while images were built). Refused here, nothing is made yet.
        with engine_room(docker, spec, "--nodes", spec.nodes, progress):
            rdir = write_state(cluster, spec, images, run_id)
            (cluster.state_dir / OWNER_PID_FILE).write_text(str(os.getpid()))
            History(rdir / FILE_NAME).append(run_start_record(spec, run_id))
            progress(f"[up] starting cluster '{spec.name}' ({spec.nodes} nodes, {spec.rdzv_backend}, run {run_id})")
            created = True
            # Before the containers exist, so the history sees them created and started.
            cluster._start_collector()
            docker.compose(cluster.project, cluster.compose_file, "up", "--detach", "--no-build", timeout=600)
        if wait:
            check = wait_for(TrainingStarted(cluster), timeout=timeout)
            progress(f"[up] training started ({check.detail})")
        return cluster
    except BaseException as error:
        if created and not keep:
            reason = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
            progress(f"[up] {reason}: removing what was made (use --keep to keep it for debugging)")
            try:
                saved = cluster.save_logs() if cluster.containers() else None
                cluster.down(save_logs=False)
                if saved:
                    progress(f"[up] container logs saved in {saved}")
            except SimError as cleanup_error:
                progress(f"[up] cleanup failed too: {cleanup_error}")
                with contextlib.suppress(OSError):  # for `ls`: why this cluster was left
                    (cluster.state_dir / UP_FAILED_FILE).write_text(str(error).splitlines()[0] if str(error) else "")
                if isinstance(error, SimError):  # the last line says what is left, and how to remove it
                    raise type(error)(
                        f"{error}; what `up` made is left: `python -m sim down {spec.name}` removes it once fixed"
                    ) from None
        elif not created:
            shutil.rmtree(cluster.state_dir, ignore_errors=True)
        raise


def check_engine_root(spec: ClusterSpec, docker: DockerProvider) -> None:
    """The host paths a spec brings in, checked again beside the engine's own data root, which only the
    engine knows (`dockerd --data-root` may put it anywhere): refused before anything is made."""
    from sim.core.hostpaths import check_exposure

    root = docker.data_root()
    if spec.project_dir is not None:
        fix = "give your job's own folder (keep data out of it; bring that with --mount)"
        check_exposure("--project-dir", spec.project_dir, Path(spec.project_dir), fix, root)
    for host, target, writable in spec.mounts:
        shown = f"--mount '{host}:{target}{':rw' if writable else ''}': host path"
        check_exposure(shown, host, Path(host), "mount only the folder the job needs (e.g. its data folder)", root)


def _check_nodes_can_read(spec: ClusterSpec, uid: int | None, gids: tuple[int, ...] | None) -> None:
    """The project tree and each mount's top, as the nodes' user reads them; refused before anything is made.
    No uid label: ours (sim:sim, 1000:1000, no other group); no gids label: the group the uid names."""
    from sim.core.hostpaths import check_readable_by_nodes

    uid = NODE_UID if uid is None else uid
    if spec.project_dir is not None and spec.script is not None:
        check_readable_by_nodes("project folder", Path(spec.project_dir), uid, gids, walk=True)
    for host, target, _writable in spec.mounts:
        check_readable_by_nodes(f"--mount '{host}:{target}'", Path(host), uid, gids, walk=False)


def _say_what_it_brings(spec: ClusterSpec, progress: Progress) -> None:
    """What of this machine every node gets: the project tree (copied) and the mounts (shared)."""
    from sim.core.hostpaths import PROJECT_DIR_IN_NODE, tree_summary

    if spec.project_dir is not None and spec.script is not None:
        progress(
            f"[up] project {spec.project_dir} ({tree_summary(Path(spec.project_dir))}) -> {PROJECT_DIR_IN_NODE} "
            f"in every node (a node-local writable copy, on PYTHONPATH); script {spec.script_in_node}"
        )
    for host, target, writable in spec.mounts:
        progress(f"[up] mount {host} -> {target} in every node ({'writable' if writable else 'read-only'})")


def run_start_record(spec: ClusterSpec, run_id: str, profile: str | None = None) -> dict:
    """The history's first line: what ran, and what the checkers measure against."""
    args = list(spec.effective_script_args)
    shipped = spec.script is None

    def arg(flag: str, default: int) -> int | None:
        if flag in args[:-1]:
            return int(args[args.index(flag) + 1])
        return default if shipped else None

    return {
        "type": "run",
        "event": "start",
        "cluster": spec.name,
        "run_id": run_id,
        "spec": spec.record_dict(),  # --env values masked (ClusterSpec.masked_env)
        "profile": profile or ("custom" if spec.rdzv_conf else "torch-defaults"),
        "target_steps": arg("--steps", SHIPPED_TRAINER_DEFAULTS["--steps"]),
        "ckpt_interval": arg("--ckpt-interval", SHIPPED_TRAINER_DEFAULTS["--ckpt-interval"]),
    }


def _run_secrets(run_folder: Path) -> list[str]:
    """The --env values the run's saved logs must not show (its spec.json, 0600; none without one)."""
    try:
        return ClusterSpec.from_json((run_folder / "spec.json").read_text()).secret_values()
    except (OSError, ValueError, TypeError, SimError):
        return []


REDACT_CHUNK = 1 << 20


def redact_file(path: Path, values: Sequence[str], *, chunk: int = REDACT_CHUNK) -> None:
    """Replace every one of `values` in the file with ***, streamed (a value split across two reads
    is still found: the tail that may begin one is carried to the next)."""
    needles = sorted({v.encode() for v in values if v}, key=len, reverse=True)
    if not needles:
        return
    keep = max(map(len, needles)) - 1
    tmp = path.with_name(f".{path.name}.redacting")
    tmp.unlink(missing_ok=True)
    out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(path, "rb") as src, open(out_fd, "wb") as out:
        carry = b""
        while block := src.read(chunk):
            data = carry + block
            for needle in needles:
                data = data.replace(needle, b"***")
            cut = max(0, len(data) - keep)
            out.write(data[:cut])
            carry = data[cut:]
        out.write(carry)
    os.replace(tmp, path)


def node_uid(docker: DockerProvider, node_image: str) -> int | None:
    """The uid a node image's processes run as: its labels.NODE_UID label (None without one: ours)."""
    value = _image_labels(docker, node_image).get(labels.NODE_UID, "")
    return int(value) if value.isdigit() else None


def node_gids(docker: DockerProvider, node_image: str) -> tuple[int, ...] | None:
    """The groups of that uid: its labels.NODE_GIDS label (None without one: ours, or an image built before it)."""
    parts = _image_labels(docker, node_image).get(labels.NODE_GIDS, "").split(",")
    return tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else None


def _image_labels(docker: DockerProvider, image: str) -> dict:
    info = docker.image_inspect(image) or {}
    return (info.get("Config") or {}).get("Labels") or {}


def write_state(cluster: Cluster, spec: ClusterSpec, images: ImageSet, run_id: str) -> Path:
    """The cluster's state folder (compose.yaml, spec.json, run_id, images.json) and its run folder; that folder."""
    # The workers' side channel (instrumentation records) lands in the run folder, beside the history.
    rdir = run_dir(cluster.name, run_id)
    events_dir = prepare_events_dir(rdir, node_uid(cluster.docker, images.node))
    project = render(spec, node_image=images.node, etcd_image=images.etcd, run_id=run_id, events_dir=events_dir)
    cluster.state_dir.mkdir(parents=True, exist_ok=True)
    # Written to a temp name first, then renamed: a reader never sees half a file.
    for name, text in (
        ("compose.yaml", to_yaml(project)),
        ("spec.json", spec.to_json()),
        ("run_id", run_id),
        ("images.json", json.dumps(dataclasses.asdict(images), indent=2)),
    ):
        tmp = cluster.state_dir / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        # 0600: compose.yaml and spec.json hold the --env values (and any password in them).
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, cluster.state_dir / name)
    rdir.mkdir(parents=True, exist_ok=True)
    # 0700: the run's logs, history and report are its owner's (a job may print a secret before we mask it).
    rdir.chmod(0o700)
    shutil.copy(cluster.compose_file, rdir / "compose.yaml")
    shutil.copy(cluster.state_dir / "spec.json", rdir / "spec.json")
    return rdir
