import pytest

from sim.core.errors import UsageError
from sim.core.spec import (
    DEFAULT_TRAINER_ARGS,
    SHIPPED_TRAINER,
    ClusterSpec,
    GpuRequest,
    parse_kv_list,
    parse_size,
    spec_from_options,
)


def test_defaults_are_elastic_one_to_n():
    spec = ClusterSpec(nodes=4)
    assert (spec.min_nodes, spec.max_nodes, spec.nproc_per_node, spec.max_restarts) == (1, 4, 2, 3)
    assert spec.rdzv_backend == "etcd-v2" and spec.uses_etcd
    assert spec.node_names == ("node0", "node1", "node2", "node3")
    assert spec.script_in_node == SHIPPED_TRAINER
    assert spec.effective_script_args == DEFAULT_TRAINER_ARGS


@pytest.mark.parametrize(
    "kwargs, mentions",
    [
        ({"nodes": 0}, "--nodes 0"),
        ({"nodes": 2, "min_nodes": 3}, "--min-nodes 3 > --nodes 2"),
        ({"nodes": 4, "min_nodes": 3, "max_nodes": 2}, "--min-nodes 3 > --max-nodes 2"),
        ({"rdzv_backend": "zookeeper"}, "zookeeper"),
        ({"script": "/no/such/train.py"}, "/no/such/train.py"),
        ({"name": "Bad Name"}, "Bad Name"),
        ({"max_restarts": -1}, "--max-restarts -1"),
        ({"monitor_interval": 0.0}, "--monitor-interval"),
        ({"nproc_per_node": 0}, "--nproc-per-node 0"),
        ({"memory": "lots"}, "--memory 'lots': not a size"),
        ({"ckpt_size": "512k"}, "--ckpt-size '512k': below 1024 KiB"),
        ({"rdzv_backend": "static", "nodes": 2}, "static"),
        ({"rdzv_conf": (("bad key", "1"),)}, "bad key"),
    ],
)
def test_bad_values_name_themselves(kwargs, mentions):
    with pytest.raises(UsageError) as error:
        ClusterSpec(**kwargs)
    assert mentions in str(error.value)
    assert "\n" not in str(error.value)


def test_static_needs_fixed_size():
    spec = ClusterSpec(nodes=2, min_nodes=2, max_nodes=2, rdzv_backend="static")
    assert spec.rdzv_backend == "static"


def test_user_script_is_resolved_and_mounted(tmp_path):
    script = tmp_path / "mytrain.py"
    script.write_text("print('hi')\n")
    spec = ClusterSpec(nodes=1, script=str(script))
    assert spec.script == str(script.resolve())
    assert spec.script_in_node == "/opt/sim/project/mytrain.py"
    assert spec.effective_script_args == ()


def test_json_round_trip(tmp_path):
    spec = ClusterSpec(
        nodes=3, rdzv_conf=(("join_timeout", "60"),), gpus=GpuRequest.parse("2"), script_args=("--steps", "5")
    )
    assert ClusterSpec.from_json(spec.to_json()) == spec


def test_gpu_requests():
    assert not GpuRequest.parse("none").enabled
    assert GpuRequest.parse("all").device_ids(3) is None
    two = GpuRequest.parse("2")
    assert two.device_ids(0) == ("0", "1") and two.device_ids(2) == ("4", "5")
    with pytest.raises(UsageError, match="--gpus 'lots'"):
        GpuRequest.parse("lots")


def test_kv_list():
    assert parse_kv_list("--rdzv-conf", "join_timeout=60, last_call_timeout=5") == (
        ("join_timeout", "60"),
        ("last_call_timeout", "5"),
    )
    with pytest.raises(UsageError, match="'oops' is not key=value"):
        parse_kv_list("--rdzv-conf", "a=1,oops")


def test_spec_from_cli_options():
    spec = spec_from_options(
        {"nodes": 2, "rdzv_conf": "join_timeout=9", "gpus": None, "detach": True}, ["--steps", "3"]
    )
    assert spec.nodes == 2 and spec.rdzv_conf == (("join_timeout", "9"),)
    assert spec.script_args == ("--step-time", "0.2", "--ckpt-interval", "10", "--steps", "3")


def test_one_trainer_arg_keeps_the_other_defaults():
    spec = spec_from_options({}, ["--steps", "400"])
    assert spec.effective_script_args == ("--step-time", "0.2", "--ckpt-interval", "10", "--steps", "400")


def test_trainer_args_override_flag_by_flag_in_either_spelling():
    spec = spec_from_options({}, ["--step-time=0.05", "--pg-timeout", "15"])
    assert spec.effective_script_args == (
        "--steps",
        "600",
        "--ckpt-interval",
        "10",
        "--step-time",
        "0.05",
        "--pg-timeout",
        "15",
    )


def test_every_default_overridden_leaves_only_the_given_args():
    given = ["--steps", "24", "--step-time", "0.05", "--ckpt-interval", "5"]
    assert spec_from_options({}, given).effective_script_args == tuple(given)


def test_no_args_after_the_dashes_keep_the_defaults():
    assert spec_from_options({}, []).effective_script_args == DEFAULT_TRAINER_ARGS


def test_user_script_gets_exactly_its_args(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = spec_from_options({"script": str(script)}, ["--steps", "400", "--lr=0.1"])
    assert spec.effective_script_args == ("--steps", "400", "--lr=0.1")


def test_start_record_reads_steps_from_merged_args():
    from sim.engines.cluster import run_start_record

    record = run_start_record(spec_from_options({}, ["--steps=400"]), "r1")
    assert (record["target_steps"], record["ckpt_interval"]) == (400, 10)


def test_sizes_in_binary_units():
    assert [parse_size("--memory", text) for text in ("64m", "2G", "1024k", "1048576", "3gb")] == [
        64 * 2**20,
        2 * 2**30,
        2**20,
        2**20,
        3 * 2**30,
    ]
    assert parse_size("leave", "0", least=0) == 0
    spec = ClusterSpec(memory="2g", ckpt_size="64m")
    assert ClusterSpec.from_json(spec.to_json()) == spec


def test_an_env_value_keeps_its_commas():
    """`--env CUDA_VISIBLE_DEVICES=0,1` is one variable whose value holds a comma, not two pairs."""
    spec = spec_from_options({"env": ["CUDA_VISIBLE_DEVICES=0,1", "NCCL_SOCKET_IFNAME=eth0,eth1"]}, None)
    assert spec.env == (("CUDA_VISIBLE_DEVICES", "0,1"), ("NCCL_SOCKET_IFNAME", "eth0,eth1"))
