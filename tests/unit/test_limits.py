"""Each node's bounds (issue 26, finding 7): a default memory limit (--memory SIZE or none), a pids limit
(--pids), and the node-count cap counting the nodes of other clusters on the same engine."""

from __future__ import annotations

import threading
import time

import pytest

from sim.cli.main import build_parser
from sim.core import labels
from sim.core.errors import UsageError
from sim.core.spec import (
    DEFAULT_PIDS,
    HOST_RESERVE_MIB,
    ClusterSpec,
    check_room_beside,
    default_node_memory_mib,
    node_need_mib,
    spec_from_options,
)
from sim.engines.cluster import Cluster, check_engine_room, engine_room, other_clusters_memory
from sim.engines.docker import Container, DockerError, Resources
from sim.engines.locks import LOCK_DIR_ENV
from sim.engines.swarm_render import SwarmLayout, to_stack
from sim.export.k8s import export_spec
from sim.scenarios.scenario import parse_scenario


@pytest.fixture(autouse=True)
def own_locks(monkeypatch, tmp_path):
    """The room lock of a fake engine in a folder of the test's, not the machine's shared one."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))


# ------------------------------------------------------------------ the default memory limit


def test_the_default_is_an_equal_share_of_the_machine_less_its_reserve():
    assert default_node_memory_mib(4, 2, memory_mib=16 * 1024) == (16 * 1024 - HOST_RESERVE_MIB) // 4


def test_the_default_is_never_below_what_a_node_needs():
    assert default_node_memory_mib(100, 2, memory_mib=4096) == node_need_mib(2) == 132 + 2 * 234
    assert default_node_memory_mib(1, 8, memory_mib=1200) == node_need_mib(8)


def test_a_spec_resolves_its_default_once_among_its_most_nodes(monkeypatch):
    monkeypatch.setattr("sim.core.spec.machine_memory_mib", lambda: 9 * 1024 + HOST_RESERVE_MIB)
    spec = ClusterSpec(nodes=2, max_nodes=3, nproc_per_node=1)
    assert spec.memory is None and spec.memory_limit == 3 * 1024 * 2**20
    assert ClusterSpec(nodes=5, max_nodes=3, min_nodes=1).memory_limit == 9 * 1024 // 5 * 2**20  # spares too
    # Read back (spec.json) or scaled on a machine that changed: the figure stays what the nodes have.
    monkeypatch.setattr("sim.core.spec.machine_memory_mib", lambda: 64 * 1024)
    assert ClusterSpec.from_json(spec.to_json()) == spec
    assert spec.with_nodes(3).memory_limit == spec.memory_limit
    assert spec.counted_memory_mib == node_need_mib(1)  # a bound, not a use
    assert "(default" in spec.limits_line and f"{DEFAULT_PIDS} pids" in spec.limits_line


def test_memory_given_or_lifted():
    given = ClusterSpec(memory="2g")
    assert (given.memory_limit, given.counted_memory_mib) == (2 * 2**30, 2048)
    assert ClusterSpec.from_json(given.to_json()) == given
    lifted = ClusterSpec(memory="None")
    assert (lifted.memory, lifted.memory_limit, lifted.counted_memory_mib) == ("none", None, node_need_mib(2))
    assert ClusterSpec.from_json(lifted.to_json()) == lifted
    assert lifted.limits_line == f"limits per node: no memory limit, {DEFAULT_PIDS} pids"
    # A size given wins over a figure read back with it.
    assert ClusterSpec(memory="1g", memory_limit=5 * 2**30).memory_limit == 2**30


@pytest.mark.parametrize(
    "kwargs, mentions",
    [
        ({"memory": "lots"}, "--memory 'lots': not a size; use a number and k, m or g, e.g. 2g, or none"),
        ({"memory": "512k"}, "--memory '512k': below 1024 KiB"),
        ({"memory_limit": 12}, "memory_limit 12: must be a number of bytes"),
        ({"pids": 0}, "--pids 0: must be a whole number >= 1"),
        ({"pids": "many"}, "--pids 'many': must be a whole number >= 1"),
        ({"pids": True}, "--pids True: must be a whole number >= 1"),
    ],
)
def test_bad_bounds_name_themselves(kwargs, mentions):
    with pytest.raises(UsageError) as error:
        ClusterSpec(**kwargs)
    assert mentions in str(error.value) and "\n" not in str(error.value)


def test_the_cli_takes_memory_none_and_pids():
    args = build_parser().parse_args(["up", "--memory", "none", "--pids", "8192"])
    spec = spec_from_options(vars(args), None)
    assert (spec.memory_limit, spec.pids) == (None, 8192)
    spec = spec_from_options(vars(build_parser().parse_args(["up", "--memory", "8g"])), None)
    assert (spec.memory_limit, spec.pids) == (8 * 2**30, DEFAULT_PIDS)


def test_a_scenario_takes_memory_none_and_pids():
    head = "name: a\ndescription: b\nexpect: {outcome: recovers}\n"
    s = parse_scenario(head + "cluster: {memory: none, pids: 2048}\n", "a.yaml")
    assert s.cluster == {"memory": "none", "pids": 2048}
    with pytest.raises(UsageError, match="pids"):
        parse_scenario(head + "cluster: {pids: 0}\n", "a.yaml")
    with pytest.raises(UsageError, match="memory"):
        parse_scenario(head + "cluster: {memory: lots}\n", "a.yaml")


def test_swarm_takes_the_default_limit_and_no_pids_limit():
    from sim.engines.render import render

    spec = ClusterSpec(name="sw", nodes=2, pids=100)
    stack = to_stack(render(spec, node_image="n", etcd_image="e", run_id="r"), SwarmLayout(), max_nodes=2)
    node = stack["services"]["node0"]
    assert node["deploy"]["resources"]["limits"] == {"memory": str(spec.memory_limit)}
    assert "pids_limit" not in node and "mem_limit" not in node


def test_a_kubernetes_export_takes_a_given_memory_only():
    """The default is a share of this machine, which says nothing of a Kubernetes cluster's nodes."""

    def limits(spec):
        job = export_spec(spec).objects()[0]
        container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        return container.get("resources", {}).get("limits", {})

    assert limits(ClusterSpec(name="k", nodes=2, rdzv_backend="c10d")) == {}
    assert limits(ClusterSpec(name="k", nodes=2, rdzv_backend="c10d", memory="none")) == {}
    assert limits(ClusterSpec(name="k", nodes=2, rdzv_backend="c10d", memory="1g")) == {"memory": str(2**30)}


# ------------------------------------------------------------------ room beside other clusters


def test_room_beside_nothing_is_the_machine_less_its_reserve():
    check_room_beside("--nodes", 4, 600, {}, memory_mib=4 * 600 + HOST_RESERVE_MIB)
    with pytest.raises(UsageError) as error:
        check_room_beside("--nodes", 4, 2048, {}, memory_mib=4096)
    text = str(error.value)
    assert text.startswith("--nodes 4: 4 nodes of 2048 MiB do not fit in this machine's 4096 MiB (3072 MiB left")
    assert text.endswith("use --nodes 1 or fewer or a smaller --memory") and "sim down" not in text


def test_room_beside_other_clusters_names_them_and_the_fix():
    others = {"b": [600, 600], "a": [2048]}
    check_room_beside("--nodes", 2, 600, others, memory_mib=HOST_RESERVE_MIB + 3248 + 1200)
    with pytest.raises(UsageError) as error:
        check_room_beside("--nodes", 3, 600, others, memory_mib=HOST_RESERVE_MIB + 3248 + 1200)
    text = str(error.value)
    assert "\n" not in text
    assert "beside the running nodes of other clusters: 'a' (1 node, 2048 MiB), 'b' (2 nodes, 1200 MiB)" in text
    assert text.endswith("make room with `python -m sim down NAME`, or use --nodes 2 or fewer or a smaller --memory")
    with pytest.raises(UsageError, match=r"`python -m sim down a`, or use fewer nodes"):
        check_room_beside("scale --nodes", 1, 600, {"a": [9000]}, memory_mib=8192)


class RoomEngine:
    """The engine's nodes, of this cluster and others, as `docker ps` lists them."""

    local = True

    def __init__(self, nodes):
        self.nodes = nodes  # (cluster, node, state, memory label or None, memory limit)
        self.filters: list[str] = []

    def engine_id(self) -> str:
        return "room-engine"

    def containers(self, label_filter):
        self.filters.append(label_filter)
        found = []
        for cluster, node, state, label, _ in self.nodes:
            tags = {labels.CLUSTER: cluster, labels.ROLE: "node", labels.NODE: node}
            if label is not None:
                tags[labels.MEMORY] = label
            found.append(Container(f"id-{cluster}-{node}", node, tags, state, "", None, {}))
        return found

    def resources(self, container):
        limit = next(m for c, n, _, _, m in self.nodes if f"id-{c}-{n}" == container)
        if limit is None:
            raise DockerError(f"docker inspect failed: No such container: {container}")
        return Resources(0, 0, limit)


def test_other_clusters_count_by_label_then_limit_then_a_default_nodes_need():
    engine = RoomEngine(
        [
            ("mine", "node0", "running", "600", 0),
            ("a", "node0", "running", "2048", 4 * 2**30),  # the label wins over the (default) limit
            ("a", "node1", "paused", "2048", 0),
            ("a", "node2", "exited", "2048", 0),  # holds nothing
            ("old", "node0", "running", None, 3 * 2**30 + 1),  # an older node: its limit, rounded up
            ("old", "node1", "running", None, 0),  # no limit either: a default node's need
            ("gone", "node0", "running", None, None),  # removed since the listing
        ]
    )
    assert other_clusters_memory(engine, "mine") == {"a": [2048, 2048], "old": [3073, node_need_mib(2)]}
    assert engine.filters == [f"label={labels.ROLE}=node"]


def test_the_engine_check_is_for_a_local_engine_only(monkeypatch):
    monkeypatch.setattr("sim.core.spec.machine_memory_mib", lambda: HOST_RESERVE_MIB + 4096)
    spec = ClusterSpec(name="mine", nodes=2, memory="1g")
    engine = RoomEngine([("a", "node0", "running", "3000", 0)])
    with pytest.raises(UsageError, match=r"^--nodes 2: .*'a' \(1 node, 3000 MiB\).*`python -m sim down a`"):
        check_engine_room(engine, spec, "--nodes", 2)
    check_engine_room(engine, spec, "--nodes", 1)
    engine.local = False  # a remote engine's or a swarm's memory is not this machine's
    check_engine_room(engine, spec, "--nodes", 2)
    assert len(engine.filters) == 2


def test_docker_is_local_on_its_unix_socket_only(monkeypatch):
    from sim.engines.docker import Docker

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert Docker().local
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/user/1000/docker.sock")
    assert Docker().local
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.5:2376")
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")  # plain tcp:// to another machine is refused (test_shared_host)
    assert not Docker().local


def test_a_scale_up_is_weighed_against_the_other_clusters(monkeypatch, tmp_path):
    monkeypatch.setenv("SIM_HOME", str(tmp_path))
    monkeypatch.setattr("sim.core.spec.machine_memory_mib", lambda: HOST_RESERVE_MIB + 4096)
    engine = RoomEngine([("a", "node0", "running", "3000", 0)])
    cluster = Cluster("mine", engine)
    cluster.state_dir.mkdir(parents=True)
    (cluster.state_dir / "spec.json").write_text(ClusterSpec(name="mine", nodes=1, memory="512m").to_json())
    with pytest.raises(UsageError, match=r"^scale --nodes 3: 3 nodes of 512 MiB .*'a'"):
        cluster.start_nodes(["node1", "node2"], nodes=3)


def test_the_room_is_held_from_the_check_until_the_nodes_exist(monkeypatch, tmp_path):
    """Two clusters' `up` at once, each fitting alone: the second checks only after the first's nodes
    exist, and is refused, naming it."""
    monkeypatch.setattr("sim.core.spec.machine_memory_mib", lambda: HOST_RESERVE_MIB + 4096)
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    engine = RoomEngine([])
    inside, outcome = threading.Event(), {}

    def first() -> None:
        with engine_room(engine, ClusterSpec(name="a", memory="3g"), "--nodes", 1):
            inside.set()
            time.sleep(0.3)  # Compose making the node: the other `up` waits
            engine.nodes.append(("a", "node0", "running", "3072", 0))

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(5)
    try:
        with engine_room(engine, ClusterSpec(name="b", memory="3g"), "--nodes", 1, progress=print):
            outcome["admitted"] = True
    except UsageError as error:
        outcome["refused"] = str(error)
    thread.join()
    assert "'a' (1 node, 3072 MiB)" in outcome.get("refused", ""), outcome
