"""The stack file for `sim up --engine swarm` (sim/engines/swarm_render.py): pure rendering, no Docker.

Each rule here stands on a probe of a real engine (docs/SWARM.md): what `docker stack deploy`
refuses or ignores, and what a fault needs of the running stack."""

import dataclasses
import os

import pytest
import yaml

from sim.core import labels
from sim.core.errors import SimError, UsageError
from sim.core.spec import ClusterSpec
from sim.engines.docker import Docker
from sim.engines.render import render, to_yaml
from sim.engines.swarm import ensure_swarm, leave_if_ours
from sim.engines.swarm_render import COMPOSE_ONLY_KEYS, GPU_RESOURCE_KIND, SwarmLayout, to_stack

IMAGES = {"node_image": "elastic-sim/node:abc", "etcd_image": "elastic-sim/etcd:def", "run_id": "r1"}


ONE_HOST = SwarmLayout()


def stack_of(spec: ClusterSpec, layout: SwarmLayout = ONE_HOST) -> dict:
    return to_stack(render(spec, **IMAGES), layout, max_nodes=spec.max_nodes)


def test_each_node_is_one_replica_that_swarm_never_restarts():
    stack = stack_of(ClusterSpec(name="sw-a", nodes=3))
    assert list(stack["services"]) == ["etcd", "node0", "node1", "node2"]
    for service in stack["services"].values():
        deploy = service["deploy"]
        assert deploy["mode"] == "replicated" and deploy["replicas"] == 1
        # Swarm's default is `any`: a killed node would be replaced behind the fault's back.
        assert deploy["restart_policy"] == {"condition": "none"}
        # Names resolve to the task's own address, so partitions (iptables by address) cut real peers.
        assert deploy["endpoint_mode"] == "dnsrr"


def test_keys_swarm_refuses_or_ignores_are_gone():
    spec = ClusterSpec(name="sw-a", nodes=2, memory="1g", gpus="1")
    project = render(spec, **IMAGES)
    assert {"container_name", "restart", "depends_on", "mem_limit", "shm_size"} <= set(project["services"]["node0"])
    stack = to_stack(project, SwarmLayout(), max_nodes=2)
    assert "name" not in stack  # the stack's name is `docker stack deploy`'s argument
    assert stack["version"].startswith("3.")
    for service in stack["services"].values():
        assert not set(COMPOSE_ONLY_KEYS) & set(service)


def test_every_object_carries_the_cluster_label():
    stack = stack_of(ClusterSpec(name="sw-a", nodes=2))
    for service in stack["services"].values():
        # Container labels find the tasks' containers (faults, collector); service labels find the services.
        assert service["labels"][labels.CLUSTER] == "sw-a"
        assert service["deploy"]["labels"] == service["labels"]
    for thing in [*stack["networks"].values(), *stack["volumes"].values()]:
        assert thing["labels"][labels.CLUSTER] == "sw-a" and thing["labels"][labels.RUN] == "r1"
    assert stack["services"]["node1"]["labels"][labels.NODE] == "node1"


def test_the_network_is_an_attachable_overlay():
    (network,) = stack_of(ClusterSpec(name="sw-a", nodes=2))["networks"].values()
    assert network["driver"] == "overlay" and network["attachable"] is True


def test_the_node_keeps_what_faults_and_torchrun_need():
    spec = ClusterSpec(name="sw-a", nodes=2)
    project, stack = render(spec, **IMAGES), stack_of(spec)
    for name in ("etcd", "node0", "node1"):
        node, rendered = stack["services"][name], project["services"][name]
        for key in ("image", "command", "environment", "hostname", "cap_drop", "init", "volumes", "networks"):
            assert node.get(key) == rendered.get(key), key
    assert stack["services"]["node0"]["stop_grace_period"] == "10s"
    # Swarm has no depends_on: sim/engines/swarm.py deploys etcd first, and each node's agent waits for its health.
    assert stack["services"]["node1"]["command"][:2] == ["elastic-sim-await-etcd", "etcd:2379"]


def test_one_host_needs_no_constraint_and_a_listed_host_pins_everything():
    assert all("placement" not in s["deploy"] for s in stack_of(ClusterSpec(name="sw-a", nodes=2))["services"].values())
    stack = stack_of(ClusterSpec(name="sw-a", nodes=2), SwarmLayout(hosts=("h0",)))
    for service in stack["services"].values():
        assert service["deploy"]["placement"] == {"constraints": ["node.hostname == h0"]}


def hosts_of(stack: dict) -> dict[str, str]:
    return {
        name: s["deploy"]["placement"]["constraints"][0].removeprefix("node.hostname == ")
        for name, s in stack["services"].items()
    }


def test_spread_and_packed_placement():
    spec = ClusterSpec(name="sw-a", nodes=4, max_nodes=6)
    spread = SwarmLayout(hosts=("h0", "h1"), ckpt_nfs="nfs:/srv/ckpt")
    packed = dataclasses.replace(spread, placement="packed")
    assert list(hosts_of(stack_of(spec, spread)).values()) == ["h0", "h0", "h1", "h0", "h1"]  # etcd, node0..3
    # Packed: ceil(max_nodes / hosts) = 3 nodes a host, whatever the current size.
    assert list(hosts_of(stack_of(spec, packed)).values()) == ["h0", "h0", "h0", "h0", "h1"]


def test_a_scale_up_never_moves_a_running_node():
    layout = SwarmLayout(hosts=("h0", "h1", "h2"), placement="packed", ckpt_nfs="nfs:/srv/ckpt")
    spec = ClusterSpec(name="sw-a", nodes=2, max_nodes=5)
    small, large = hosts_of(stack_of(spec, layout)), hosts_of(stack_of(spec.with_nodes(5), layout))
    assert {name: host for name, host in large.items() if name in small} == small
    assert layout.host_of(99, 5) == "h2"  # past max_nodes: the last host


def test_gpus_are_swarm_generic_resources():
    stack = stack_of(ClusterSpec(name="sw-a", nodes=2, gpus="2"))
    node = stack["services"]["node1"]
    assert node["deploy"]["resources"]["reservations"] == {
        "generic_resources": [{"discrete_resource_spec": {"kind": GPU_RESOURCE_KIND, "value": 2}}]
    }
    assert node["environment"]["SIM_BACKEND"] == "nccl"
    # Swarm ignores shm_size; NCCL's shared memory comes as a tmpfs on /dev/shm instead.
    assert {"type": "tmpfs", "target": "/dev/shm", "tmpfs": {"size": 2**30}} in node["volumes"]
    assert stack["services"]["etcd"]["deploy"]["resources"] == {"limits": {"memory": "512m"}}  # no GPU for etcd


def test_all_gpus_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="--gpus all: Swarm reserves GPUs by count.*--gpus 1"):
        stack_of(ClusterSpec(name="sw-a", nodes=2, gpus="all"))


def test_memory_limit_becomes_a_deploy_limit():
    stack = stack_of(ClusterSpec(name="sw-a", nodes=1, memory="1g"))
    assert stack["services"]["node0"]["deploy"]["resources"]["limits"] == {"memory": str(2**30)}


def test_checkpoint_volume_local_or_nfs():
    local = stack_of(ClusterSpec(name="sw-a", nodes=2))["volumes"]["ckpt"]
    assert "driver_opts" not in local
    tmpfs = stack_of(ClusterSpec(name="sw-a", nodes=2, ckpt_size="64m"))["volumes"]["ckpt"]
    assert tmpfs["driver_opts"]["type"] == "tmpfs"  # one host: the fill-disk tmpfs works as on Compose
    nfs = stack_of(ClusterSpec(name="sw-a", nodes=2), SwarmLayout(ckpt_nfs="10.0.0.5:/srv/ckpt"))["volumes"]["ckpt"]
    assert nfs["driver"] == "local"
    assert nfs["driver_opts"] == {"type": "nfs", "o": "addr=10.0.0.5,rw,nfsvers=4", "device": ":/srv/ckpt"}
    assert nfs["labels"][labels.CLUSTER] == "sw-a"
    assert "driver_opts" not in stack_of(ClusterSpec(name="sw-a"), SwarmLayout(ckpt_nfs="n:/x"))["volumes"]["etcd-data"]


def test_a_shared_checkpoint_folder_is_the_local_drivers_bind_of_that_path_on_every_host():
    layout = SwarmLayout(hosts=("h0", "h1"), ckpt_dir="/mnt/shared/ckpt")
    shared = stack_of(ClusterSpec(name="sw-a", nodes=2), layout)["volumes"]["ckpt"]
    assert shared["driver"] == "local"
    assert shared["driver_opts"] == {"type": "none", "o": "bind", "device": "/mnt/shared/ckpt"}
    assert shared["labels"][labels.CLUSTER] == "sw-a"
    with pytest.raises(UsageError, match="--ckpt-size with --ckpt-dir: .* the shared folder /mnt/shared/ckpt"):
        stack_of(ClusterSpec(name="sw-a", nodes=2, ckpt_size="64m"), layout)


def test_nfs_and_a_sized_tmpfs_are_refused_together():
    with pytest.raises(UsageError, match="--ckpt-size with --ckpt-nfs"):
        stack_of(ClusterSpec(name="sw-a", nodes=2, ckpt_size="64m"), SwarmLayout(ckpt_nfs="nfs:/srv/ckpt"))


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"placement": "diagonal"}, "--placement 'diagonal': unknown; use one of spread, packed"),
        ({"ckpt_nfs": "/srv/ckpt"}, "--ckpt-nfs '/srv/ckpt': not SERVER:/EXPORT"),
        ({"ckpt_nfs": "nfs:srv"}, "not SERVER:/EXPORT"),
        ({"hosts": ("h0", "h1")}, "2 swarm hosts: a local checkpoint volume is one per host.*--ckpt-nfs.*--ckpt-dir"),
        ({"ckpt_nfs": "n:/x", "ckpt_dir": "/x"}, "--ckpt-nfs and --ckpt-dir: .* give one of them"),
        ({"ckpt_dir": "shared/ckpt"}, "--ckpt-dir 'shared/ckpt': not an absolute path"),
        ({"hosts": ("h0", "h0"), "ckpt_nfs": "n:/x"}, "a host is named twice"),
        ({"hosts": ("h 0",)}, "not a hostname"),
    ],
)
def test_bad_layouts_are_refused(layout, message):
    with pytest.raises(UsageError, match=message):
        SwarmLayout(**layout)


def test_the_stack_reads_back_from_the_rendered_yaml():
    """SwarmDocker makes the stack from the compose file on disk (so a scale-up re-render works)."""
    spec = ClusterSpec(name="sw-a", nodes=2, env=(("PRICE", "$5"),))
    project = render(spec, **IMAGES)
    from_disk = to_stack(yaml.safe_load(to_yaml(project)), SwarmLayout(), max_nodes=2)
    assert from_disk == to_stack(project, SwarmLayout(), max_nodes=2)
    # `docker stack deploy` interpolates `$` as Compose does: the `$$` escape carries over.
    assert from_disk["services"]["node0"]["environment"]["PRICE"] == "$$5"


def test_the_engine_is_part_of_the_spec():
    spec = ClusterSpec(name="sw-a", engine="swarm")
    assert ClusterSpec.from_json(spec.to_json()) == spec
    with pytest.raises(UsageError, match="--engine 'kubernetes': unknown engine; use one of compose, swarm"):
        ClusterSpec(engine="kubernetes")


class FakeEngine:
    """The few engine calls sim/engines/swarm.py makes about the swarm itself (docker-py APIClient's names)."""

    def __init__(self, state: str = "inactive", services: tuple = (), gwbridge: bool = False):
        self.state, self.node_id, self.services_ = state, "user-node" if state == "active" else "", list(services)
        self.gwbridge, self.calls, self.containers_ = gwbridge, [], []

    def info(self):
        return {"Swarm": {"LocalNodeState": self.state, "NodeID": self.node_id}}

    def init_swarm(self, **kwargs):
        self.calls.append(("init", kwargs["listen_addr"]))
        self.state, self.node_id, self.gwbridge = "active", "our-node", True

    def leave_swarm(self, force):
        self.calls.append(("leave", force))
        self.state, self.node_id = "inactive", ""

    def services(self, filters):
        return self.services_

    def containers(self, filters):
        return self.containers_

    def networks(self, names):
        return [{"Name": "docker_gwbridge", "Id": "gw"}] if self.gwbridge else []

    def inspect_network(self, network):
        return {"Containers": {}}

    def remove_network(self, network):
        self.calls.append(("network rm", network))
        self.gwbridge = False


@pytest.fixture
def engine(monkeypatch, tmp_path):
    monkeypatch.setenv("SIM_HOME", str(tmp_path))

    def make(**kwargs) -> tuple[Docker, FakeEngine]:
        docker, fake = Docker(), FakeEngine(**kwargs)
        docker.__dict__["api"] = fake  # the provider's cached client
        return docker, fake

    return make


def test_a_swarm_made_here_is_left_once_no_cluster_of_ours_runs(engine):
    docker, fake = engine()
    ensure_swarm(docker, progress=lambda _: None)
    assert fake.calls == [("init", "127.0.0.1:2377")]
    fake.services_ = [{"ID": "s1"}]  # a cluster of ours still runs on it
    assert not leave_if_ours(docker, progress=lambda _: None)
    fake.services_ = []
    fake.containers_ = [{"Id": "c1"}]  # a Compose cluster of ours: leaving would break its DNS
    assert not leave_if_ours(docker, progress=lambda _: None)
    fake.containers_ = []
    assert leave_if_ours(docker, progress=lambda _: None)
    # The gateway bridge that `swarm init` made and `swarm leave` keeps goes too.
    assert fake.calls[1:] == [("leave", True), ("network rm", "gw")]
    assert not leave_if_ours(docker, progress=lambda _: None)  # once


def test_a_users_swarm_is_kept(engine):
    docker, fake = engine(state="active", gwbridge=True)
    ensure_swarm(docker, progress=lambda _: None)
    assert not leave_if_ours(docker, progress=lambda _: None)
    assert fake.calls == [] and fake.state == "active"


def test_a_swarm_the_user_made_after_ours_is_kept(engine):
    docker, fake = engine()
    ensure_swarm(docker, progress=lambda _: None)
    fake.node_id = "user-node"  # ours was left by hand, and the user made one of their own
    assert not leave_if_ours(docker, progress=lambda _: None)
    assert fake.calls == [("init", "127.0.0.1:2377")]


def test_an_engine_in_a_broken_swarm_is_refused_with_the_fix(engine):
    docker, _ = engine(state="error")
    with pytest.raises(SimError, match="this engine's swarm is error; fix it"):
        ensure_swarm(docker, progress=lambda _: None)


def test_a_shared_checkpoint_folder_must_exist_expose_nothing_and_be_the_nodes_to_write(tmp_path):
    from sim.core.hostpaths import check_shared_ckpt_dir

    with pytest.raises(UsageError, match="--ckpt-dir '.*/missing': no such folder on this machine"):
        check_shared_ckpt_dir(str(tmp_path / "missing"), 1000)
    with pytest.raises(UsageError, match="--ckpt-dir '/': refused, the host's whole file system"):
        check_shared_ckpt_dir("/", 1000)
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o755)
    os.chown(folder, 0, 0)
    with pytest.raises(UsageError, match=r"the nodes' user \(uid 1000\) cannot write it .*`chown 1000 "):
        check_shared_ckpt_dir(str(folder), 1000)
    os.chown(folder, 1000, 1000)
    assert check_shared_ckpt_dir(str(folder), 1000) == str(folder.resolve())
