"""A Swarm cluster on several hosts, with fake engines: the host registry, the routing of every fault
to the engine of the host that runs the task (or its refusal), and the collector reading every host.

No real second engine exists on this machine (docs/SWARM.md says why): each host here is a fake
engine that holds its own containers only and fails the test when handed another host's container."""

from __future__ import annotations

import json
import threading

import pytest
import requests

from sim.cli.main import main
from sim.core import labels
from sim.core.errors import DockerUnavailableError, SimError, UnsupportedFaultError, UsageError
from sim.core.history import History
from sim.core.spec import ClusterSpec
from sim.engines import swarm
from sim.engines.cluster import Cluster
from sim.engines.collector import Collector
from sim.engines.docker import Completed, Container, Docker, ExecResult, Labelled, Resources
from sim.engines.engine import choose_engine
from sim.engines.proctable import PROBE_ARGV
from sim.engines.swarm import MergedEvents, SwarmDocker, SwarmHosts
from sim.engines.swarm_hosts import HostDocker, HostEngine, register, registered, unregister
from sim.engines.swarm_render import SwarmLayout
from sim.faults import nodescripts
from sim.faults.catalog import FAULTS
from sim.faults.nemesis import Nemesis
from tests.unit.test_nemesis import PROBE_OUTPUT, oom_answers

NFS = "nfs.example:/srv/ckpt"
TWO_HOSTS = SwarmLayout(hosts=("hosta", "hostb"), ckpt_nfs=NFS)
IN_WRITE = json.dumps({"pid": 40, "file": "/ckpt/ckpt-00000040.pt", "signal": "SIGKILL"})
ANSWERS = {
    "ip -o route get": ExecResult(0, "10.0.0.3 dev eth1 src 10.0.0.4 uid 0\n", ""),
    "faketime": ExecResult(0, "60.0\n", ""),
    nodescripts.CORRUPT: ExecResult(0, json.dumps({"file": "/ckpt/x.pt", "size": 9, "mode": "bitflip"}), ""),
    nodescripts.KILL_IN_WRITE: ExecResult(0, IN_WRITE, ""),
    **oom_answers(died=True),
}


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))


class FakeHost:
    """One host's engine: the containers of the nodes placed on it (ids id-NODE). It answers execs
    as a node would, records every call, and fails on a container of another host."""

    def __init__(self, host: str, nodes: dict[str, str]):
        self.host, self.calls, self.events_ = host, [], []
        self.box = {f"id-{node}": {"node": node, "ip": ip, "state": "running"} for node, ip in nodes.items()}
        self.volumes = {"demo_ckpt"}

    def _own(self, cid: str) -> dict:
        assert cid in self.box, f"{cid} was sent to {self.host}'s engine, which does not run it"
        return self.box[cid]

    def _labels(self, cid: str) -> dict:
        node = self.box[cid]["node"]
        return {
            labels.CLUSTER: "demo",
            labels.NODE: node,
            labels.ROLE: "etcd" if node == "etcd" else "node",
            labels.RUN: "r1",
            swarm.SERVICE_LABEL: f"demo_{node}",
            swarm.SERVICE_ID_LABEL: f"sid-{node}",
        }

    def containers(self, label_filter: str) -> list[Container]:
        key, _, value = label_filter.removeprefix("label=").partition("=")
        found = []
        for cid, box in self.box.items():
            if self._labels(cid).get(key) == value:
                ips = {"demo_cluster": box["ip"]} if box["state"] != "exited" else {}
                found.append(Container(cid, f"c-{box['node']}", self._labels(cid), box["state"], "", None, ips))
        return found

    def labelled(self, kind: str, label_filter: str) -> list[Labelled]:
        assert kind == "volume"
        return [Labelled(name, {labels.CLUSTER: "demo"}) for name in sorted(self.volumes)]

    def remove(self, kind: str, ids) -> None:
        self.calls.append(("remove", kind, list(ids)))
        for cid in ids:
            if kind == "container":
                self._own(cid)
                del self.box[cid]
            else:
                self.volumes.discard(cid)

    def inspect(self, cid: str) -> dict:
        box = self._own(cid)
        return {"Config": {"Labels": self._labels(cid)}, "State": {"Running": box["state"] == "running"}}

    def exec(self, cid, argv, *, user=None, timeout=30, detach=False) -> ExecResult:
        self._own(cid)
        argv = list(argv)
        self.calls.append(("exec", cid, argv[:2]))
        if argv == PROBE_ARGV:
            return ExecResult(0, PROBE_OUTPUT, "")
        if argv[-2:] == ["link", "show"]:
            return ExecResult(0, "2: eth1@if9: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n", "")
        for word, answer in ANSWERS.items():
            if any(word in arg for arg in argv):
                return answer
        return ExecResult(0, "", "")

    def net_exec(self, cid, argv, *, image, labels, timeout=30) -> ExecResult:
        return self.exec(cid, argv)  # the helper runs on the host of the container whose namespace it joins

    def resources(self, cid: str) -> Resources:
        self._own(cid)
        return Resources(0, 0, 0)

    def update_resources(self, cid: str, **limits) -> None:
        self._own(cid)
        self.calls.append(("update", cid, limits))

    def _verb(self, verb: str, cid: str, state: str | None) -> None:
        box = self._own(cid)
        self.calls.append((verb, cid))
        box["state"] = state or box["state"]

    def kill(self, cid, signal="SIGKILL"):
        self._verb("kill", cid, "exited")

    def stop(self, cid, grace):
        self._verb("stop", cid, "exited")

    def start(self, cid):
        self._verb("start", cid, "running")

    def pause(self, cid):
        self._verb("pause", cid, "paused")

    def unpause(self, cid):
        self._verb("unpause", cid, "running")

    def logs(self, cid, *, tail=None, timestamps=False) -> str:
        self._verb("logs", cid, None)
        return f"log of {cid}\n"

    def follow_logs(self, cid, *, since=None):
        self._verb("follow_logs", cid, None)
        yield f"2026-12-01T06:00:00.000000000Z hello from {self.host}"

    def events(self, label_filter: str) -> FakeStream:
        return FakeStream(self.events_)

    def replace_task(self, service: str) -> None:
        """What Swarm does on `docker service update --force`: a new container for the service, on this host."""
        old = next(cid for cid in self.box if self._labels(cid)[swarm.SERVICE_LABEL] == service)
        self.box[f"{old}-new"] = {**self.box[old], "state": "running"}


class FakeStream:
    def __init__(self, events: list[dict]):
        self.events, self.closed = list(events), False

    def __iter__(self):
        yield from self.events

    def close(self) -> None:
        self.closed = True


class FakeManager:
    """The swarm manager's API (this host's engine): services and tasks."""

    def __init__(self, tasks=()):
        self.tasks_, self.removed = list(tasks), []

    def tasks(self, filters=None):
        return self.tasks_

    def services(self, filters=None):
        return [{"ID": "sid-any"}]

    def remove_service(self, sid):
        self.removed.append(sid)


def two_hosts(tasks=(), without=()) -> tuple[SwarmDocker, FakeHost, FakeHost]:
    """node0 here (hosta); etcd and node1 on hostb, the other host."""
    here, there = FakeHost("hosta", {"node0": "10.0.0.3"}), FakeHost("hostb", {"etcd": "10.0.0.2", "node1": "10.0.0.4"})
    hosts = SwarmHosts(
        "hosta", {"hosta": here, "hostb": there}, tuple(without), {"na": "hosta", "nb": "hostb", "nc": "hostc"}
    )
    docker = SwarmDocker(TWO_HOSTS, hosts=hosts)
    docker.__dict__["api"] = FakeManager(tasks)
    docker.cli = []

    def run(argv, timeout):  # the docker CLI: only `docker service update --force SERVICE` is expected here
        assert list(argv[1:4]) == ["service", "update", "--force"], argv
        docker.cli.append(list(argv))
        next(h for h in (here, there) if h.containers(f"label={swarm.SERVICE_LABEL}={argv[-1]}")).replace_task(argv[-1])
        return Completed(tuple(argv), 0, "", "")

    docker._run = run
    return docker, here, there


# What each fault is given, and the state its target is in first (a start needs a stopped node).
CASES = {
    "kill-worker": ({"target": "node1"}, None),
    "kill-agent": ({"target": "node1"}, None),
    "kill-node": ({"target": "node1"}, None),
    "stop-node": ({"target": "node1", "grace": 1.0}, None),
    "restart-node": ({"target": "node1"}, None),
    "start-node": ({"target": "node1"}, "exited"),
    "pause": ({"target": "node1"}, None),
    "unpause": ({"target": "node1"}, "paused"),
    "partition": ({"isolate": ("node1",)}, None),
    "heal": ({"all": True}, "paused"),
    "netem": ({"target": "node1", "loss": 10.0}, None),
    "etcd-kill": ({}, None),
    "etcd-start": ({}, "exited"),
    "etcd-restart": ({}, None),
    "etcd-wipe": ({}, None),
    "etcd-pause": ({}, None),
    "etcd-unpause": ({}, "paused"),
    "etcd-isolate": ({}, None),
    "hang-worker": ({"target": "node1"}, None),
    "hang-collectives": ({"target": "node1"}, None),
    "resume-worker": ({"target": "node1"}, None),
    "slow-node": ({"target": "node1", "cpus": 0.5}, None),
    "skew-clock": ({"target": "node1", "by": 60.0}, None),
    "oom-worker": ({"target": "node1", "local_rank": 0}, None),
    "corrupt-checkpoint": ({"target": "node1"}, None),
    "kill-during-checkpoint": ({"target": "node1", "within": 5.0}, None),
    "freeze-during-checkpoint": ({"target": "node1", "within": 5.0}, None),
    "scale": ({"nodes": 1}, None),
}
REFUSED = {"fill-disk": {"target": "node1"}}
# Faults that act on this machine's cgroups (the engine's containers must run here): refused on any swarm.
NOT_HERE = {"slow-disk": {"target": "node1", "write_rate": 2**20}}
EVERY_HOST = {"partition", "heal", "etcd-isolate"}  # rules in every container's namespace, each on its host


def test_every_fault_is_either_routed_or_refused():
    # a new fault must be classified here and in docs/SWARM.md
    assert set(CASES) | set(REFUSED) | set(NOT_HERE) == set(FAULTS)
    assert set(REFUSED) == set(swarm.REFUSED_ON_SHARED_CKPT)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_fault_on_a_task_of_the_other_host_reaches_that_hosts_engine(name, tmp_path):
    docker, here, there = two_hosts()
    options, before = CASES[name]
    target = "etcd" if name.startswith("etcd") else "node1"
    if before:
        there.box[f"id-{target}"]["state"] = before
    fault = FAULTS[name]
    result = fault.invoke(
        Nemesis(Cluster("demo", docker), history=History(tmp_path / "h.jsonl"), seed=1), fault.make_options(options)
    )
    assert "op" in result
    # Each host's fake engine refuses another host's container: reaching here means every call was routed.
    acted = [c for c in there.calls if c[0] not in ("logs", "follow_logs")]
    assert acted, f"{name}: nothing reached hostb, which runs {target}"
    assert bool(here.calls) == (name in EVERY_HOST), f"{name}: hosta got {here.calls}"
    if name in ("start-node", "restart-node", "etcd-start", "etcd-restart", "etcd-wipe"):
        # Swarm starts a new task (the manager's CLI), and the dead task's container goes on its own host.
        assert docker.cli and ("remove", "container", [f"id-{target}"]) in there.calls
    if name == "scale":
        assert docker.api.removed == ["sid-node1"] and ("remove", "container", ["id-node1"]) in there.calls


def test_a_fault_that_cannot_work_on_several_hosts_is_refused_before_anything(tmp_path):
    docker, here, there = two_hosts()
    history = History(tmp_path / "h.jsonl")
    nemesis = Nemesis(Cluster("demo", docker), history=history, seed=1)
    fault = FAULTS["fill-disk"]
    with pytest.raises(UnsupportedFaultError) as refused:
        fault.invoke(nemesis, fault.make_options(REFUSED["fill-disk"]))
    assert str(refused.value).startswith(
        f"fill-disk on node1: refused on Swarm cluster 'demo': /ckpt is the NFS export {NFS}, which every host shares"
    )
    assert "\n" not in str(refused.value)
    assert here.calls == there.calls == [] and not history.path.exists()


@pytest.mark.parametrize("name", sorted(NOT_HERE))
def test_a_fault_on_this_machines_cgroups_is_refused_on_a_swarm_in_one_line(name, tmp_path):
    docker, here, there = two_hosts()
    nemesis = Nemesis(Cluster("demo", docker), history=History(tmp_path / "h.jsonl"), seed=1)
    fault = FAULTS[name]
    with pytest.raises(UnsupportedFaultError) as refused:
        fault.invoke(nemesis, fault.make_options(NOT_HERE[name]))
    assert str(refused.value) == "throttling a disk needs the Docker engine on this machine (its cgroups)"
    assert nemesis.active() == []  # its intent is forgotten: nothing is in force


def test_fill_disk_is_refused_on_a_shared_checkpoint_folder_too():
    layout = SwarmLayout(hosts=("hosta", "hostb"), ckpt_dir="/mnt/shared/ckpt")
    docker = SwarmDocker(layout, hosts=SwarmHosts("hosta", {"hosta": FakeHost("hosta", {})}))
    reason = Cluster("demo", docker).docker.capabilities.fault_refusal("fill-disk", "node1", "demo")
    assert reason and "/ckpt is the shared folder /mnt/shared/ckpt, which every host shares" in reason


def test_fill_disk_still_works_on_a_one_host_swarm_without_nfs():
    docker = SwarmDocker(SwarmLayout(), hosts=SwarmHosts("hosta", {"hosta": FakeHost("hosta", {})}))
    assert docker.capabilities.fault_refusal("fill-disk", "node1", "demo") is None
    assert Docker().capabilities.fault_refusal("fill-disk", "node1", "demo") is None  # Compose


def test_one_host_is_exactly_the_local_engine():
    """No task lookups: every call goes straight to this host's engine (its events through the merged
    stream, which follows hosts that join later)."""
    here = FakeHost("hosta", {"node0": "10.0.0.3"})
    docker = SwarmDocker(SwarmLayout(), hosts=SwarmHosts("hosta", {"hosta": here}))
    docker.__dict__["api"] = None  # any manager call would fail
    here.events_ = [{"Type": "container", "Action": "start", "id": "id-node0"}]
    assert [c.id for c in docker.containers(labels.cluster_filter("demo"))] == ["id-node0"]
    docker.kill("id-node0")
    assert list(docker.events(labels.cluster_filter("demo"))) == here.events_
    assert here.calls == [("kill", "id-node0")]


def test_a_host_that_joins_while_the_collector_runs_is_followed(monkeypatch):
    """A scale-up may place nodes on a host added to the swarm (or registered) after the run began: its
    events join the merged stream and its containers' verbs go to its engine."""
    monkeypatch.setattr(MergedEvents, "JOIN_CHECK_S", 0.05)
    docker, here, there = two_hosts()
    docker.discover = lambda: SwarmHosts("hosta", {"hosta": here})  # hostb not yet in the swarm
    docker.__dict__.pop("hosts", None)
    held = HeldStream([{"Type": "container", "Action": "start", "id": "id-node0"}])
    here.events = lambda label_filter: held
    there.events_ = [{"Type": "container", "Action": "start", "id": "id-node1"}]
    events = docker.events(labels.cluster_filter("demo"))
    iterator = iter(events)
    assert next(iterator)["id"] == "id-node0"
    docker.discover = lambda: SwarmHosts("hosta", {"hosta": here, "hostb": there})  # hostb joins
    assert next(iterator)["id"] == "id-node1"
    docker.kill("id-node1")
    assert ("kill", "id-node1") in there.calls
    events.close()
    assert list(iterator) == [] and held.closed


class HeldStream(FakeStream):
    """A running engine's event stream: open after its events until closed."""

    def __init__(self, events: list[dict]):
        super().__init__(events)
        self._closing = threading.Event()

    def __iter__(self):
        yield from self.events
        self._closing.wait(10)

    def close(self) -> None:
        super().close()
        self._closing.set()


def test_a_container_never_listed_is_found_through_its_task():
    tasks = [{"NodeID": "nb", "Status": {"ContainerStatus": {"ContainerID": "id-node1"}}}]
    docker, here, there = two_hosts(tasks=tasks)
    assert docker.logs("id-node1") == "log of id-node1\n"
    assert ("logs", "id-node1") in there.calls and here.calls == []


def test_a_task_on_a_host_with_no_engine_is_a_one_line_error_with_the_fix():
    tasks = [{"NodeID": "nc", "Spec": {"ContainerSpec": {"Labels": {labels.NODE: "node2", labels.CLUSTER: "demo"}}}}]
    docker, _, _ = two_hosts(tasks=tasks, without=("hostc",))
    with pytest.raises(SimError) as error:
        docker.containers(labels.cluster_filter("demo"))
    assert str(error.value).startswith(
        "swarm host 'hostc' runs node2 of cluster 'demo', and sim has no engine for it; register one: "
        "`sim swarm add-host hostc --docker-host ssh://USER@hostc`"
    )


def test_up_refuses_a_layout_that_puts_a_node_on_a_host_with_no_engine():
    layout = SwarmLayout(hosts=("hosta", "hostb", "hostc"), ckpt_nfs=NFS)
    hosts = SwarmHosts("hosta", {"hosta": FakeHost("hosta", {}), "hostb": FakeHost("hostb", {})}, ("hostc",))
    with pytest.raises(SimError, match="swarm host 'hostc' runs node2 of cluster 'sw'"):
        swarm.require_engines(SwarmDocker(layout, hosts=hosts), ClusterSpec(name="sw", nodes=3))
    swarm.require_engines(SwarmDocker(layout, hosts=hosts), ClusterSpec(name="sw", nodes=2))  # hostc unused


def test_volumes_are_listed_once_and_removed_on_every_host():
    docker, here, there = two_hosts()
    assert [v.id for v in docker.labelled("volume", labels.cluster_filter("demo"))] == ["demo_ckpt"]
    docker.remove("volume", ["demo_ckpt"])
    assert ("remove", "volume", ["demo_ckpt"]) in here.calls and ("remove", "volume", ["demo_ckpt"]) in there.calls


def test_merged_events_take_every_hosts_stream_and_learn_where_containers_live():
    a = FakeStream([{"Type": "container", "Action": "start", "id": "ca"}, {"Type": "network", "Action": "connect"}])
    b = FakeStream([{"Type": "container", "Action": "die", "Actor": {"ID": "cb"}}])
    seen = []
    merged = MergedEvents({"hosta": a, "hostb": b}, lambda host, cid: seen.append((host, cid)))
    events = list(merged)
    assert sorted(e["Action"] for e in events) == ["connect", "die", "start"]
    assert sorted(seen) == [("hosta", "ca"), ("hostb", "cb")]
    merged.close()
    assert a.closed and b.closed


def test_the_collector_merges_every_hosts_events_and_logs_into_one_history(tmp_path):
    docker, here, there = two_hosts()
    here.events_ = [{"Type": "container", "Action": "start", "id": "id-node0", "timeNano": 1e18}]
    there.events_ = [
        {"Type": "container", "Action": "start", "id": "id-node1", "timeNano": 1e18},
        {"Type": "container", "Action": "die", "id": "id-etcd", "timeNano": 1e18, "Actor": {"Attributes": {}}},
    ]
    history = History(tmp_path / "history.jsonl")
    collector = Collector(Cluster("demo", docker), history)
    for info in collector.cluster.containers():
        collector._nodes[info.id] = info.node
    collector._read_events(docker.events(labels.cluster_filter("demo")))
    for thread in list(collector._followers.values()):
        thread.join(timeout=5)
    records = {(r.node, r.action) for r in history.records() if r.TYPE == "docker"}
    assert records == {("node0", "start"), ("node1", "start"), ("etcd", "die")}
    # Each started container's log is followed on its own host's engine.
    assert ("follow_logs", "id-node0") in here.calls and ("follow_logs", "id-node1") in there.calls


# --- the registry and the clients -------------------------------------------------------------


def test_hosts_are_registered_replaced_and_removed():
    assert registered() == {}
    assert not register(HostEngine("hostb", docker_host="ssh://me@hostb"))
    assert register(HostEngine("hostb", docker_host="ssh://me@10.0.0.8"))
    register(HostEngine("hostc", context="hostc-tls"))
    assert {h: e.address for h, e in registered().items()} == {
        "hostb": "ssh://me@10.0.0.8",
        "hostc": "context hostc-tls",
    }
    assert unregister("hostb").host == "hostb" and list(registered()) == ["hostc"]
    with pytest.raises(UsageError, match="swarm host 'hostx': not registered .registered: hostc."):
        unregister("hostx")


@pytest.mark.parametrize(
    "given, message",
    [
        ({"host": "b c", "docker_host": "ssh://b"}, "not a hostname"),
        ({"host": "b"}, "give --docker-host ADDRESS or --context NAME"),
        ({"host": "b", "docker_host": "ssh://b", "context": "x"}, "one of them"),
        ({"host": "b", "docker_host": "http://b:2375"}, "use ssh://USER@HOST, tcp://HOST:2376"),
        ({"host": "b", "docker_host": "ssh://b", "tls_ca": "ca.pem"}, "TLS is for tcp:// addresses"),
        ({"host": "b", "context": "x", "tls_ca": "ca.pem"}, "holds its own TLS files"),
        ({"host": "b", "docker_host": "tcp://b:2376", "tls_cert": "c.pem"}, "give both"),
        ({"host": "b", "docker_host": "tcp://b:2375"}, "plain tcp:// does not verify the engine.*--insecure"),
        (
            {"host": "b", "docker_host": "tcp://b:2376", "tls_cert": "c.pem", "tls_key": "k.pem"},
            "a client certificate without the CA does not verify the engine",
        ),
    ],
)
def test_bad_host_engines_are_refused(given, message):
    with pytest.raises(UsageError, match=message):
        HostEngine(**given)


def test_client_arguments_for_ssh_tls_and_contexts(tmp_path, monkeypatch):
    ssh = HostEngine("hostb", docker_host="ssh://me@hostb").client_kwargs()
    assert ssh == {"base_url": "ssh://me@hostb", "tls": False, "use_ssh_client": True}  # the ssh client on PATH
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    tls = HostEngine(
        "hostb",
        docker_host="tcp://hostb:2376",
        tls_ca=str(tmp_path / "ca.pem"),
        tls_cert=str(tmp_path / "cert.pem"),
        tls_key=str(tmp_path / "key.pem"),
    ).client_kwargs()["tls"]
    assert tls.cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")) and tls.verify == str(
        tmp_path / "ca.pem"
    )
    with pytest.raises(UsageError, match="TLS file .*nope.pem not found"):
        HostEngine("hostb", docker_host="tcp://hostb:2376", tls_ca=str(tmp_path / "nope.pem")).client_kwargs()

    class Context:
        Host, TLSConfig = "ssh://ops@hostc", None

    monkeypatch.setattr("sim.engines.swarm_hosts.ContextAPI.get_context", lambda name: Context if name == "c" else None)
    assert HostEngine("hostc", context="c").client_kwargs()["use_ssh_client"]
    with pytest.raises(UsageError, match="no Docker context 'd'; `docker context ls` lists them"):
        HostEngine("hostc", context="d").client_kwargs()


def test_an_unreachable_host_engine_is_named_in_one_line():
    with pytest.raises(DockerUnavailableError) as error:
        HostDocker(HostEngine("hostb", docker_host="tcp://127.0.0.1:9", insecure=True)).ping()
    assert str(error.value).startswith("swarm host 'hostb': its engine at tcp://127.0.0.1:9 is not reachable (")
    assert "\n" not in str(error.value)


def test_a_connection_lost_during_an_exec_names_the_host():
    class Gone:
        def exec_create(self, *args, **kwargs):
            raise requests.exceptions.ConnectionError("ssh: connect to host hostb port 22: Connection timed out")

    docker = HostDocker(HostEngine("hostb", docker_host="ssh://me@hostb"))
    docker.__dict__["api"] = Gone()
    with pytest.raises(
        DockerUnavailableError, match="swarm host 'hostb': its engine at ssh://me@hostb is not reachable"
    ):
        docker.exec("id-node1", ["true"])


class FakeSwarmApi:
    def __init__(self, nodes, services=()):
        self.nodes_, self.services_ = nodes, list(services)

    def info(self):
        return {"Swarm": {"LocalNodeState": "active", "NodeID": "na"}}

    def nodes(self):
        return self.nodes_

    def services(self, filters=None):
        return self.services_


def test_discovery_maps_each_swarm_host_to_its_engine():
    register(HostEngine("hostb", docker_host="ssh://me@hostb"))
    docker = Docker()
    docker.__dict__["api"] = FakeSwarmApi(
        [{"ID": i, "Description": {"Hostname": h}} for i, h in (("nb", "hostb"), ("na", "hosta"), ("nc", "hostc"))]
    )
    hosts = swarm.discover_hosts(docker)
    assert hosts.local == "hosta" and hosts.without_engine == ("hostc",)
    assert type(hosts.engines["hosta"]) is Docker and isinstance(hosts.engines["hostb"], HostDocker)
    assert swarm.hosts_table(docker) == [
        f"{'HOST':<24} ENGINE",
        f"{'hosta':<24} this machine's engine (a manager)",
        f"{'hostb':<24} ssh://me@hostb",
        f"{'hostc':<24} none: `sim swarm add-host hostc --docker-host ssh://USER@hostc`",
    ]


def test_a_cluster_is_on_swarm_from_its_spec_before_its_services_exist():
    """The collector starts before `docker stack deploy`: the spec says which provider follows it."""
    docker = Docker()
    docker.__dict__["api"] = FakeSwarmApi([])
    cluster = Cluster("sw", docker)
    cluster.state_dir.mkdir(parents=True)
    (cluster.state_dir / "spec.json").write_text(ClusterSpec(name="sw", engine="swarm").to_json())
    assert isinstance(choose_engine(docker, name="sw").docker, SwarmDocker)
    (cluster.state_dir / "spec.json").write_text(ClusterSpec(name="sw").to_json())
    assert choose_engine(docker, name="sw").docker is docker
    (cluster.state_dir / "spec.json").write_text("{")  # unreadable: `sim down` must still work
    assert choose_engine(docker, name="sw").docker is docker


def test_the_swarm_verbs_register_and_forget_a_host(capsys):
    assert main(["swarm", "add-host", "hostb", "--docker-host", "ssh://me@hostb", "--no-check"]) == 0
    assert main(["swarm", "add-host", "hostb", "--docker-host", "http://hostb"]) == 2
    assert main(["swarm", "remove-host", "hostb"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "registered swarm host 'hostb': ssh://me@hostb",
        "removed swarm host 'hostb' (ssh://me@hostb)",
    ]
    assert (
        err.startswith("sim swarm: error: --docker-host 'http://hostb': use ssh://USER@HOST") and err.count("\n") == 1
    )


def test_routing_is_safe_from_several_threads():
    """The collector lists containers and follows logs from threads of its own."""
    docker, here, there = two_hosts()
    errors = []

    def work():
        try:
            for _ in range(20):
                for c in docker.containers(labels.cluster_filter("demo")):
                    docker.logs(c.id)
        except AssertionError as error:
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
