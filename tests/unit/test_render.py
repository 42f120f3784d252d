import yaml

from sim.core import labels
from sim.core.spec import ClusterSpec, GpuRequest, default_node_memory_mib, node_need_mib
from sim.core.torchrun import torchrun_argv
from sim.engines.render import render, to_yaml

IMAGES = {"node_image": "elastic-sim/node:abc", "etcd_image": "elastic-sim/etcd:def", "run_id": "r1"}


def test_etcd_v2_project_shape():
    project = render(ClusterSpec(name="demo", nodes=3), **IMAGES)
    assert project["name"] == "demo"
    assert list(project["services"]) == ["etcd", "node0", "node1", "node2"]
    etcd = project["services"]["etcd"]
    assert "--enable-v2=true" in etcd["command"]
    assert "--advertise-client-urls=http://etcd:2379" in etcd["command"]
    assert "healthcheck" not in etcd  # a probe every second for the whole run; the nodes wait instead
    for i in range(3):
        node = project["services"][f"node{i}"]
        assert node["hostname"] == f"node{i}"
        assert node["container_name"] == f"demo-node{i}"
        assert node["depends_on"] == {"etcd": {"condition": "service_started"}}
        assert node["command"][:4] == ["elastic-sim-await-etcd", "etcd:2379", "120", "--"]
        assert node["command"][4] == "torchrun"
        assert node["environment"]["LOGLEVEL"] == "INFO"
        assert "ckpt:/ckpt" in node["volumes"]


def test_everything_carries_the_cluster_label():
    project = render(ClusterSpec(name="demo", nodes=2), **IMAGES)
    things = list(project["services"].values()) + list(project["networks"].values()) + list(project["volumes"].values())
    assert things
    for thing in things:
        assert thing["labels"][labels.CLUSTER] == "demo"
        assert thing["labels"][labels.RUN] == "r1"
    assert project["services"]["node1"]["labels"][labels.NODE] == "node1"
    assert project["services"]["etcd"]["labels"][labels.ROLE] == "etcd"


def test_least_privilege_and_no_host_ports():
    project = render(ClusterSpec(name="demo", nodes=2), **IMAGES)
    for service in project["services"].values():
        assert not service.get("privileged")
        assert service.get("cap_drop") == ["ALL"] and "cap_add" not in service
        assert "ports" not in service
        assert service.get("network_mode") is None


def test_c10d_has_no_etcd_and_node0_is_the_endpoint():
    project = render(ClusterSpec(name="demo", nodes=2, rdzv_backend="c10d"), **IMAGES)
    assert "etcd" not in project["services"] and "etcd-data" not in project["volumes"]
    command = project["services"]["node1"]["command"]
    assert command[0] == "torchrun" and command[command.index("--rdzv-endpoint") + 1] == "node0:29400"
    assert "depends_on" not in project["services"]["node1"]


def test_torchrun_argv_etcd_v2():
    spec = ClusterSpec(
        name="demo",
        nodes=4,
        min_nodes=2,
        max_restarts=5,
        monitor_interval=0.5,
        rdzv_conf=(("join_timeout", "60"), ("last_call_timeout", "5")),
        script_args=("--steps", "9"),
    )
    assert torchrun_argv(spec, 1, "demo-r1") == [
        "torchrun",
        "--nnodes",
        "2:4",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "5",
        "--monitor-interval",
        "0.5",
        "--rdzv-backend",
        "etcd-v2",
        "--rdzv-endpoint",
        "etcd:2379",
        "--rdzv-id",
        "demo-r1",
        "--rdzv-conf",
        "join_timeout=60,last_call_timeout=5",
        "/opt/sim/trainer/train.py",
        "--steps",
        "9",
    ]


def test_torchrun_argv_static_fixed_size():
    spec = ClusterSpec(name="demo", nodes=2, min_nodes=2, rdzv_backend="static", script_args=())
    assert torchrun_argv(spec, 1, "ignored") == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "static",
        "--node-rank",
        "1",
        "--master-addr",
        "node0",
        "--master-port",
        "29500",
        "/opt/sim/trainer/train.py",
    ]


def test_gpu_count_assigns_distinct_devices_per_node():
    project = render(ClusterSpec(name="demo", nodes=2, gpus=GpuRequest.parse("2")), **IMAGES)
    for i, ids in enumerate((["0", "1"], ["2", "3"])):
        node = project["services"][f"node{i}"]
        device = node["deploy"]["resources"]["reservations"]["devices"][0]
        assert device == {"driver": "nvidia", "capabilities": ["gpu"], "device_ids": ids}
        assert node["environment"]["SIM_BACKEND"] == "nccl"
        assert node["shm_size"] == "1gb"


def test_gpu_all_and_none():
    project = render(ClusterSpec(name="demo", nodes=1, gpus=GpuRequest.parse("all")), **IMAGES)
    device = project["services"]["node0"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["count"] == "all" and "device_ids" not in device
    project = render(ClusterSpec(name="demo", nodes=1), **IMAGES)
    assert "deploy" not in project["services"]["node0"]


def test_user_script_is_bind_mounted_read_only(tmp_path):
    script = tmp_path / "train_mine.py"
    script.write_text("")
    project = render(ClusterSpec(name="demo", nodes=1, script=str(script)), **IMAGES)
    node = project["services"]["node0"]
    assert {"type": "bind", "source": str(tmp_path.resolve()), "target": "/opt/sim/user", "read_only": True} in node[
        "volumes"
    ]
    assert node["command"][-1] == "/opt/sim/project/train_mine.py"  # the node-local copy of the folder


def test_yaml_round_trips():
    project = render(ClusterSpec(name="demo", nodes=2), **IMAGES)
    assert yaml.safe_load(to_yaml(project)) == project


def test_nodes_have_a_memory_limit_by_default_and_a_size_limited_checkpoint_disk_is_opt_in():
    plain = render(ClusterSpec(name="demo", nodes=2), **IMAGES)
    default = ClusterSpec(name="demo", nodes=2).memory_limit
    assert default == default_node_memory_mib(2, 2) * 2**20
    for node in ("node0", "node1"):
        service = plain["services"][node]
        assert service["mem_limit"] == service["memswap_limit"] == default
        assert service["labels"][labels.MEMORY] == str(node_need_mib(2))  # counted at its need, not its bound
    assert "driver_opts" not in plain["volumes"]["ckpt"]
    project = render(ClusterSpec(name="demo", nodes=2, memory="1g", ckpt_size="16m"), **IMAGES)
    for node in ("node0", "node1"):
        assert project["services"][node]["mem_limit"] == project["services"][node]["memswap_limit"] == 2**30
        assert project["services"][node]["labels"][labels.MEMORY] == "1024"
    # One tmpfs volume shared by every node, not one per node: checkpoints must be seen by all.
    assert project["volumes"]["ckpt"]["driver_opts"] == {"type": "tmpfs", "device": "tmpfs", "o": f"size={16 * 2**20}"}
    # etcd's bound is its own (a rendezvous store), whatever --memory says of the nodes.
    assert project["services"]["etcd"]["mem_limit"] == project["services"]["etcd"]["memswap_limit"] == "512m"


def test_memory_none_lifts_the_limit():
    project = render(ClusterSpec(name="demo", nodes=2, memory="none"), **IMAGES)
    assert "mem_limit" not in project["services"]["node0"] and "memswap_limit" not in project["services"]["node0"]
    assert project["services"]["node0"]["labels"][labels.MEMORY] == str(node_need_mib(2))


def test_pids_overrides_the_nodes_pids_limit_only():
    project = render(ClusterSpec(name="demo", nodes=2, pids=512), **IMAGES)
    assert [s["pids_limit"] for s in project["services"].values()] == [1024, 512, 512]


def test_nodes_have_a_pids_limit_and_rotated_logs():
    project = render(ClusterSpec(name="demo", nodes=2), **IMAGES)
    for name, service in project["services"].items():
        assert service["pids_limit"] == (1024 if name == "etcd" else 4096)
        assert service["logging"]["driver"] == "json-file"
        assert set(service["logging"]["options"]) == {"max-size", "max-file"}
