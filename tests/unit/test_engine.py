"""The engine, chosen once at the edge (sim/engines/engine.py), and its capabilities as data
(sim/core/capabilities.py): every caller asks the capabilities, and each refusal says the line users see.
Fakes stand in for Docker: no call reaches an engine here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import sim.cli.main as cli
import sim.scenarios.runner
from sim.core.capabilities import CAPABILITIES, COMPOSE, ONE_HOST, SWARM, Capabilities, Placement, Support
from sim.core.errors import UnsupportedFaultError, UsageError
from sim.core.history import History
from sim.core.spec import ENGINES, ClusterSpec
from sim.engines.cluster import Cluster
from sim.engines.docker import Docker
from sim.engines.engine import ComposeEngine, choose_engine
from sim.engines.swarm import LAYOUT_FILE, SwarmDocker, SwarmEngine
from sim.engines.swarm_render import SwarmLayout
from sim.faults.nemesis import Nemesis
from sim.scenarios.runner import ScenarioRunner
from sim.scenarios.scenario import parse_scenario
from tests.unit.test_nemesis import FakeProvider

NFS = "nfs.example:/srv/ckpt"
PLACEMENT_REFUSAL = "--placement, --ckpt-nfs and --ckpt-dir place nodes on Swarm hosts; add --engine swarm or drop them"
IMAGE_REFUSAL = "--image and --requirements build an image on this machine only; use them with --engine compose"


@pytest.fixture(autouse=True)
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))


class NoDocker:
    """An engine nothing may ask: any call but the CLI's name fails the test."""

    docker_bin = "docker"
    capabilities = COMPOSE

    def __getattr__(self, name):
        raise AssertionError(f"Docker was asked for {name!r}")


class FakeApi:
    """docker-py's calls the chooser makes about the swarm: its state and a cluster's services."""

    def __init__(self, state: str, services=()):
        self.state, self.services_ = state, list(services)

    def info(self):
        return {"Swarm": {"LocalNodeState": self.state, "NodeID": "na" if self.state == "active" else ""}}

    def services(self, filters=None):
        if self.state != "active":
            raise AssertionError("the services of an engine in no swarm were asked for")
        return self.services_


def engine_with(api: FakeApi) -> Docker:
    docker = Docker()
    docker.__dict__["api"] = api
    return docker


# ---------------------------------------------------------------- the capabilities, as data


def test_every_engine_a_spec_can_name_has_capabilities_and_is_chosen_with_them():
    assert set(ENGINES) == set(CAPABILITIES) == {"compose", "swarm"}
    for name in ENGINES:
        spec = ClusterSpec(name="c", engine=name)
        engine = choose_engine(NoDocker(), spec=spec)
        assert engine.capabilities == spec.capabilities == CAPABILITIES[name]
        assert engine.capabilities.engine == name


def test_each_refusal_is_the_line_users_see():
    assert COMPOSE.image_builds.ok and COMPOSE.parallel_clusters.ok and not COMPOSE.host_placement.ok
    assert SWARM.host_placement.ok and not SWARM.image_builds.ok and not SWARM.parallel_clusters.ok
    assert COMPOSE.host_placement.refusal == PLACEMENT_REFUSAL
    assert SWARM.image_builds.refusal == IMAGE_REFUSAL
    with pytest.raises(UsageError) as refused:
        ClusterSpec(name="c", engine="swarm", image="team/train:1.4")
    assert str(refused.value) == IMAGE_REFUSAL
    ClusterSpec(name="c", image="team/train:1.4")  # Compose builds it
    with pytest.raises(UsageError, match=r"^--parallel 2: a one-host swarm runs one cluster at a time; drop"):
        SWARM.parallel_clusters.require("--parallel 2: ")
    COMPOSE.parallel_clusters.require("--parallel 2: ")


def test_a_refusal_is_one_line_and_capabilities_name_their_engine():
    with pytest.raises(ValueError, match="one line"):
        Support("first\nsecond")
    with pytest.raises(ValueError, match="one line"):
        dataclasses.replace(COMPOSE, refused_faults={"kill-node": ""})
    with pytest.raises(ValueError, match="name and its title"):
        Capabilities("", "X", Support(), Support(), Support())
    assert ONE_HOST.default and not Placement("packed").default and not Placement(ckpt_dir="/mnt/c").default


def test_a_swarm_on_a_shared_checkpoint_disk_refuses_fill_disk_and_nothing_else():
    shared = SwarmDocker(SwarmLayout(hosts=("hosta", "hostb"), ckpt_nfs=NFS)).capabilities
    assert shared.fault_refusal("fill-disk", "node1", "sw") == (
        f"fill-disk on node1: refused on Swarm cluster 'sw': /ckpt is the NFS export {NFS}, which every host shares: "
        "filling it fills that disk (and every other user of it), not a size-limited disk of this cluster; "
        "use a one-host swarm or Compose with --ckpt-size"
    )
    assert shared.fault_refusal("fill-disk", None, "sw").startswith("fill-disk on the cluster: refused on Swarm")
    assert shared.fault_refusal("kill-node", "node1", "sw") is None
    assert SwarmDocker(SwarmLayout()).capabilities is SWARM  # one host, a local volume: fill-disk works
    assert Docker().capabilities.fault_refusal("fill-disk", "node1", "c") is None


# ---------------------------------------------------------------- chosen once, at the edge


def test_the_chooser_takes_a_new_clusters_spec_or_an_existing_clusters_name():
    for given in ({}, {"spec": ClusterSpec(name="c"), "name": "c"}):
        with pytest.raises(ValueError, match="spec or an existing cluster's name"):
            choose_engine(NoDocker(), **given)


def test_an_existing_cluster_on_an_engine_in_no_swarm_is_compose():
    docker = engine_with(FakeApi("inactive"))
    engine = choose_engine(docker, name="c")
    assert isinstance(engine, ComposeEngine) and engine.docker is docker and engine.capabilities is COMPOSE
    assert engine.cluster("c").docker is docker


def test_an_existing_cluster_with_services_is_swarm_with_its_recorded_layout_and_refusals():
    docker = engine_with(FakeApi("active", services=[{"ID": "s1"}]))
    state = Cluster("sw", docker).state_dir
    state.mkdir(parents=True)
    layout = SwarmLayout(hosts=("hosta", "hostb"), placement="packed", ckpt_nfs=NFS)
    (state / LAYOUT_FILE).write_text(json.dumps(dataclasses.asdict(layout)))
    engine = choose_engine(docker, name="sw")
    assert isinstance(engine, SwarmEngine) and engine.docker.layout == layout
    assert engine.cluster("sw").docker is engine.docker
    assert engine.capabilities.engine == "swarm" and set(engine.capabilities.refused_faults) == {"fill-disk"}
    assert choose_engine(engine_with(FakeApi("active")), name="other").capabilities is COMPOSE  # no services


# ---------------------------------------------------------------- callers ask the engine


class FakeCluster:
    def __init__(self, name: str):
        self.name, self.released = name, False
        self.compose_file = self.run_dir = Path("/nowhere") / name

    def release(self):
        self.released = True


class FakeEngine:
    """The engine interface, faked whole: records what it was asked to do."""

    def __init__(self, capabilities: Capabilities = COMPOSE):
        self.capabilities, self.docker = capabilities, NoDocker()
        self.ups: list[tuple[ClusterSpec, Placement]] = []
        self.downs: list[str] = []
        self.made: list[FakeCluster] = []

    def cluster(self, name):
        self.made.append(FakeCluster(name))
        return self.made[-1]

    def exists(self, cluster):
        return True

    def up(self, spec, *, placement=ONE_HOST, keep=False, timeout=0.0, progress=print, replace=False):
        self.ups.append((spec, placement))
        return self.cluster(spec.name)

    def down(self, cluster, progress=print):
        self.downs.append(cluster.name)
        return {"containers": 0, "networks": 0, "volumes": 0}


def test_sim_up_starts_the_specs_engine_and_hands_the_cluster_to_the_user_on_swarm_too(monkeypatch, capsys):
    """`sim up --engine swarm --detach` left the owner pid of the process that ended: `sim ls` then called the
    cluster left behind by a killed harness. One `up` for both engines releases it for both."""
    engine, chosen = FakeEngine(SWARM), []
    monkeypatch.setattr(cli, "_docker", NoDocker)
    monkeypatch.setattr(cli, "choose_engine", lambda docker, spec: chosen.append(spec.engine) or engine)
    argv = ["up", "--engine", "swarm", "--name", "sw", "--placement", "packed", "--ckpt-nfs", NFS, "--detach"]
    assert cli.main(argv) == 0
    assert chosen == ["swarm"] and engine.ups[0][1] == Placement("packed", NFS, None)
    assert engine.made[0].released
    assert "cluster 'sw' is training" in capsys.readouterr().out


def test_compose_refuses_swarm_placement_before_any_docker_call(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_docker", NoDocker)
    assert cli.main(["up", "--ckpt-nfs", NFS, "--detach"]) == 2
    assert capsys.readouterr().err.strip() == f"sim up: error: {PLACEMENT_REFUSAL}"
    with pytest.raises(UsageError) as refused:
        ComposeEngine(NoDocker()).up(ClusterSpec(name="c"), placement=Placement("packed"))
    assert str(refused.value) == PLACEMENT_REFUSAL


def test_sim_down_removes_through_the_engine_chosen_for_each_cluster(monkeypatch, capsys):
    engine = FakeEngine(SWARM)
    docker = NoDocker()
    docker.__dict__["ping"] = lambda: "fake"
    monkeypatch.setattr(cli, "_docker", lambda: docker)
    monkeypatch.setattr(cli, "choose_engine", lambda d, name: engine)
    assert cli.main(["down", "sw"]) == 0
    assert engine.downs == ["sw"] and "removed cluster 'sw'" in capsys.readouterr().out


def test_the_nemesis_refuses_what_its_clusters_engine_cannot_do_before_recording_anything(tmp_path):
    fake = FakeProvider()
    fake.capabilities = dataclasses.replace(COMPOSE, refused_faults={"kill-node": "no such thing here; use another"})
    history = History(tmp_path / "h.jsonl")
    nemesis = Nemesis(Cluster("demo", fake), history=history, seed=1)
    with pytest.raises(UnsupportedFaultError) as refused:
        nemesis.kill_node("node1")
    assert (
        str(refused.value) == "kill-node on node1: refused on Compose cluster 'demo': no such thing here; use another"
    )
    assert fake.calls == [] and not history.path.exists()


def test_a_scenario_run_starts_its_cluster_through_the_engine_chosen_from_its_spec(monkeypatch):
    engine, chosen = FakeEngine(SWARM), []
    monkeypatch.setattr(sim.scenarios.runner, "choose_engine", lambda docker, **given: chosen.append(given) or engine)
    scenario = parse_scenario("name: t\ndescription: d\ncluster: {nodes: 3}\nexpect: {outcome: recovers}\n", "t.yaml")
    spec = ClusterSpec(name="vet-sw", engine="swarm")
    runner = ScenarioRunner(scenario, "etcd-v2", docker=NoDocker(), spec=spec, keep=True, progress=lambda _: None)
    assert runner._cluster() == (engine, engine.made[0])
    assert chosen == [{"spec": spec}] and engine.ups[0][0] == spec and engine.made[0].released
    kept = ScenarioRunner(scenario, "etcd-v2", docker=NoDocker(), cluster_name="sw", progress=lambda _: None)
    engine.made.clear()
    monkeypatch.setattr(FakeCluster, "require_running", lambda self: None, raising=False)
    assert kept._cluster() == (engine, engine.made[0]) and chosen[-1] == {"name": "sw"}


def test_swarm_checks_its_shared_checkpoint_folder_before_any_docker_call(tmp_path):
    missing = str(tmp_path / "no-such-folder")
    with pytest.raises(UsageError, match=r"^--ckpt-dir '.*no-such-folder': no such folder on this machine"):
        SwarmEngine(NoDocker()).up(ClusterSpec(name="sw", engine="swarm"), placement=Placement(ckpt_dir=missing))


def test_a_swarm_cluster_exists_while_anything_of_it_does_services_and_state_folder_included():
    engine = SwarmEngine(engine_with(FakeApi("active", services=[{"ID": "s1"}])), SwarmDocker(SwarmLayout()))
    engine.docker.__dict__["ids"] = lambda kind, label_filter: []  # no container, network or volume left
    assert engine.exists(engine.cluster("sw"))  # a service that never got a task
    bare = engine_with(FakeApi("active"))
    engine = SwarmEngine(bare, SwarmDocker(SwarmLayout()))
    engine.docker.__dict__["ids"] = lambda kind, label_filter: []
    cluster = engine.cluster("sw")
    assert not engine.exists(cluster)
    cluster.state_dir.mkdir(parents=True)  # its collector starts before the stack is deployed
    assert engine.exists(cluster)
