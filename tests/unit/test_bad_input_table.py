"""Bad input, parsed without Docker or a subprocess (issue 11): each case is refused with a UsageError
of one line naming the input and its fix. tests/integration/test_bad_input.py runs the CLI on more."""

from __future__ import annotations

import pytest

from sim.cli.main import check_environment, check_start_timeout
from sim.core.errors import UsageError
from sim.core.spec import (
    ClusterSpec,
    check_fits_in_memory,
    max_nodes_in_memory,
    spec_from_options,
)
from sim.engines.render import render
from sim.scenarios.scenario import parse_scenario

HEAD = "name: bad\ndescription: a bad scenario\nexpect: {outcome: recovers}\n"
GIB = 1024

# case: (a call that must refuse, words the one line must hold: the input, then a word of its fix)
TABLE = {
    "nodes zero": (lambda: spec_from_options({"nodes": 0}, None), "--nodes 0", ">= 1"),
    "nodes beyond memory": (lambda: spec_from_options({"nodes": 100_000}, None), "--nodes 100000", "or fewer"),
    "nodes bool": (lambda: spec_from_options({"nodes": True}, None), "--nodes True", ">= 1"),
    "pids zero": (lambda: spec_from_options({"pids": 0}, None), "--pids 0", ">= 1"),
    "memory not a size": (lambda: spec_from_options({"memory": "lots"}, None), "--memory 'lots'", "none"),
    "workers beyond memory": (
        lambda: spec_from_options({"nodes": 1, "nproc_per_node": 10**9}, None),
        "--nodes 1",
        "--nproc-per-node",
    ),
    "monitor interval inf": (
        lambda: spec_from_options({"monitor_interval": float("inf")}, None),
        "--monitor-interval",
        "e.g. 0.5",
    ),
    "monitor interval nan": (
        lambda: spec_from_options({"monitor_interval": float("nan")}, None),
        "--monitor-interval",
        "e.g. 0.5",
    ),
    "rdzv-conf semicolon": (
        lambda: spec_from_options({"rdzv_conf": "join_timeout=1;ls"}, None),
        "join_timeout",
        "e.g. join_timeout=60",
    ),
    "rdzv-conf backticks": (lambda: spec_from_options({"rdzv_conf": "store_type=`id`"}, None), "store_type", "e.g."),
    "rdzv-conf dollar": (lambda: spec_from_options({"rdzv_conf": "x=$HOME"}, None), "$HOME", "e.g."),
    "rdzv-conf not whole": (
        lambda: spec_from_options({"rdzv_conf": "keep_alive_interval=0.5"}, None),
        "keep_alive_interval",
        "whole number",
    ),
    "rdzv-conf no equals": (
        lambda: spec_from_options({"rdzv_conf": "join_timeout"}, None),
        "join_timeout",
        "--rdzv-conf join_timeout=60",
    ),
    "env no equals": (lambda: spec_from_options({"env": ["NOEQUALS"]}, None), "NOEQUALS", "--env NCCL_DEBUG=INFO"),
    "env pipe in name": (lambda: spec_from_options({"env": ["A|B=1"]}, None), "A|B", "KEY=VALUE"),
    "env undecodable value": (lambda: spec_from_options({"env": ["A=\udcff"]}, None), "--env A", "UTF-8"),
    "script arg undecodable": (lambda: spec_from_options({}, ["--tag", "\udcfe"]), "script argument", "UTF-8"),
    "script is a directory": (lambda: ClusterSpec(script="/tmp"), "a directory", "give the path"),
    "script is /etc/passwd": (lambda: ClusterSpec(script="/etc/passwd"), "/etc/passwd", "give the path"),
    "gpus huge": (lambda: spec_from_options({"gpus": "9" * 30}, None), "--gpus", "up to"),
    "name with shell": (lambda: ClusterSpec(name="a;reboot"), "a;reboot", "lowercase"),
    "name with newline": (lambda: ClusterSpec(name="ab\n"), "--name", "lowercase"),
    "timeout zero": (lambda: check_start_timeout(0), "--timeout 0", "e.g. --timeout 300"),
    "timeout inf": (lambda: check_start_timeout(float("inf")), "--timeout inf", "e.g. --timeout 300"),
    "memory of a small machine": (
        lambda: check_fits_in_memory("--nodes", 4, 2, memory_mib=2 * GIB),
        "--nodes 4",
        "--nodes 1 or fewer",
    ),
    "SIM_HOME under a file": (lambda: _env_with_home("/etc/passwd/state"), "SIM_HOME", "at a folder"),
    "SIM_BASE_IMAGE spaces": (lambda: check_environment({"SIM_BASE_IMAGE": "a b"}), "SIM_BASE_IMAGE", "unset it"),
    "SIM_DEBIAN_MIRROR no scheme": (
        lambda: check_environment({"SIM_DEBIAN_MIRROR": "mirror"}),
        "SIM_DEBIAN_MIRROR",
        "http://",
    ),
    "DOCKER_HOST no scheme": (
        lambda: check_environment({"DOCKER_HOST": "/var/run/docker.sock"}),
        "DOCKER_HOST",
        "unix:///",
    ),
    "scenario nodes beyond memory": (
        lambda: parse_scenario(HEAD + "cluster: {nodes: 100000}\n", "s.yaml"),
        "s.yaml:4: cluster: --nodes 100000",
        "or fewer",
    ),
    "scenario 5000-digit number": (
        lambda: parse_scenario(HEAD + "seed: " + "7" * 5000 + "\n", "s.yaml"),
        "s.yaml:4: seed",
        "few digits",
    ),
    "scenario merge of a list": (
        lambda: parse_scenario(HEAD + "cluster: {<<: [[1]]}\n", "s.yaml"),
        "s.yaml:4",
        "merge (<<) only mappings",
    ),
    "scenario nested 5000 deep": (
        lambda: parse_scenario(HEAD + "steps: " + "[" * 5000 + "]" * 5000, "s.yaml"),
        "s.yaml:4: nested too deeply",
        "look for",
    ),
    "scenario alias bomb": (
        lambda: parse_scenario(
            HEAD
            + "cluster:\n  script_args: &a [x, x]\n"
            + "".join(f"  k{i}: &a{i} [{', '.join(['*a'] * 10)}]\n" for i in range(3)),
            "s.yaml",
        ),
        "k0",
        "use one of",
    ),
    "scenario scale beyond memory": (
        lambda: parse_scenario(HEAD + "steps: [{fault: scale, nodes: 100000, at: {after: 1s}}]\n", "s.yaml"),
        "steps[0]",
        "or fewer",
    ),
    "scenario script /etc/passwd": (
        lambda: parse_scenario(HEAD + "cluster: {script: /etc/passwd}\n", "/tmp/s.yaml"),
        "/etc/passwd",
        "give the path",
    ),
    "scenario script a directory": (
        lambda: parse_scenario(HEAD + "cluster: {script: /tmp}\n", "/tmp/s.yaml"),
        "a directory",
        "give the path",
    ),
    "scenario env with shell": (
        lambda: parse_scenario(HEAD + "cluster: {env: {'$(id)': x}}\n", "s.yaml"),
        "$(id)",
        "KEY=VALUE",
    ),
}


def _env_with_home(home: str) -> None:
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"SIM_HOME": home}):
        check_environment(os.environ)


@pytest.mark.parametrize("case", list(TABLE))
def test_bad_input_is_refused_in_one_line_naming_input_and_fix(case):
    call, names_input, fix = TABLE[case]
    with pytest.raises(UsageError) as refused:
        call()
    line = str(refused.value)
    assert "\n" not in line and names_input in line and fix in line, line


def test_the_memory_limit_follows_workers_per_node():
    assert max_nodes_in_memory(1, memory_mib=24 * GIB) > max_nodes_in_memory(2, memory_mib=24 * GIB) >= 32
    check_fits_in_memory("--nodes", 32, 1, memory_mib=24 * GIB)  # FACTS.md: 32 x 1 ran here in 12 GiB


def test_good_values_still_pass(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    spec = spec_from_options(
        {
            "rdzv_conf": "join_timeout=60,store_type=file,local_addr=node0",
            "script": str(script),
            "env": ["A=x;y $z", "B="],
        },
        ["--tag", "ünï"],
    )
    assert dict(spec.env)["A"] == "x;y $z" and spec.script == str(script.resolve())


def test_dollar_in_env_and_script_args_reaches_the_node_unchanged():
    project = render(
        spec_from_options({"env": ["A=$HOME"]}, ["--tag", "$USER"]), node_image="n", etcd_image="e", run_id="r"
    )
    node = project["services"]["node0"]
    assert node["environment"]["A"] == "$$HOME" and "$$USER" in node["command"]


@pytest.mark.parametrize("command", ["status", "down", "doctor"])
def test_a_cluster_is_named_the_same_way_on_every_command(command):
    """`sim status h2` and `sim status --name h2` are one command, as `sim kill-worker --name h2` is."""
    from sim.cli.main import _resolve_cluster_name, build_parser

    parser = build_parser()
    for argv in ([command, "h2"], [command, "--name", "h2"], [command, "h2", "--name", "h2"]):
        args = parser.parse_args(argv)
        _resolve_cluster_name(args)
        assert args.name == "h2", argv
    args = parser.parse_args([command, "h2", "--name", "h3"])
    with pytest.raises(UsageError, match="cluster name given twice .* give it once"):
        _resolve_cluster_name(args)


def test_report_takes_a_cluster_by_name_too():
    from sim.cli.main import _resolve_cluster_name, build_parser

    args = build_parser().parse_args(["report", "--name", "h2"])
    _resolve_cluster_name(args)
    assert args.run == "h2"
