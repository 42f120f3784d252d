"""The Chaos Toolkit extension offline: one action per fault kind with the CLI's arguments, JSON arguments
parsed as the CLI parses its own, and `chaos discover` / `chaos validate` (the real chaostoolkit CLI) on
the extension and the shipped experiment. The real runs against a cluster: tests/integration/test_chaostoolkit.py."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import toolkit
from sim.cli.faults import _options
from sim.cli.main import build_parser
from sim.faults.catalog import FAULTS

ROOT = Path(__file__).resolve().parents[2]
CHAOS = Path(sys.executable).parent / "chaos"  # the chaostoolkit console script of this venv
EXTENSION = "chaostoolkit-elastic-sim"


def toolkit_env() -> dict[str, str]:
    """This checkout first: its sim/chaos packages and its chaosesim, whatever the venv installed."""
    path = os.pathsep.join([str(ROOT), str(ROOT / EXTENSION), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path.rstrip(os.pathsep)}


def test_one_action_per_fault_kind_with_the_cli_arguments():
    assert set(toolkit.ACTIONS) == {name.replace("-", "_") for name in FAULTS}
    for name, fault in FAULTS.items():
        parameters = inspect.signature(toolkit.ACTIONS[name.replace("-", "_")]).parameters
        expected = [*fault.option_names, *(["duration"] if fault.reversible else []), "seed", "configuration"]
        assert sorted(parameters) == sorted(expected), name
        for option in fault.required:
            assert parameters[option].default is inspect.Parameter.empty


@pytest.mark.parametrize(
    ("action", "arguments", "cli"),
    [
        (
            "kill_worker",
            {"target": "node1", "signal": "TERM", "local_rank": 1},
            "kill-worker node1 --signal TERM --local-rank 1",
        ),
        ("netem", {"target": "node1", "loss": "10%", "delay": "100ms"}, "netem node1 --loss 10% --delay 100ms"),
        ("slow_node", {"target": "etcd", "cpus": 0.2}, "slow etcd --cpus 0.2"),
        ("partition", {"groups": [["node0", "node1"], ["node2"]]}, "partition node0,node1|node2"),
        ("partition", {"one_way": [["node0"], ["etcd"]]}, "partition --one-way node0 etcd"),
        ("partition", {"isolate": ["node2"]}, "partition --isolate node2"),
        ("heal", {"all": True}, "heal --all"),
        ("scale", {"nodes": 3, "abrupt": True}, "scale --nodes 3 --abrupt"),
        ("etcd_restart", {"downtime": 5}, "etcd restart --downtime 5"),
    ],
)
def test_json_arguments_make_the_options_the_cli_makes(action, arguments, cli, monkeypatch):
    seen = []
    monkeypatch.setattr(toolkit, "inject", lambda fault, namespace: seen.append((fault, namespace)) or {"op": "x"})
    assert toolkit.ACTIONS[action](**arguments, configuration={"sim_cluster": "c1"}) == {"op": "x"}
    ((fault, namespace),) = seen
    assert namespace.name == "c1"
    args = build_parser().parse_args(cli.split())
    assert _options(fault, namespace) == _options(fault, args)


def test_the_cluster_comes_from_configuration_then_environment(monkeypatch):
    monkeypatch.setenv("SIM_CLUSTER", "from-env")
    assert toolkit.cluster_name({"sim_cluster": "from-config"}) == "from-config"
    assert toolkit.cluster_name(None) == "from-env"
    monkeypatch.delenv("SIM_CLUSTER")
    assert toolkit.cluster_name({}) == "sim"


def test_chaos_discover_lists_every_action_and_probe(tmp_path):
    out = tmp_path / "discovery.json"
    argv = [str(CHAOS), "--no-version-check", "--no-log-file", "discover", "--no-install", "--no-system-info"]
    done = subprocess.run(
        [*argv, "--discovery-path", str(out), EXTENSION],
        env=toolkit_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    discovery = json.loads(out.read_text())
    assert discovery["extension"]["name"] == EXTENSION
    actions = {a["name"] for a in discovery["activities"] if a["type"] == "action" and a["mod"] == "chaosesim.actions"}
    probes = {a["name"] for a in discovery["activities"] if a["type"] == "probe" and a["mod"] == "chaosesim.probes"}
    assert actions == set(toolkit.ACTIONS)
    assert probes == {"training_progressing", "world_size", "recovered_within", "verdict"}


def test_chaos_validate_accepts_the_shipped_experiment(tmp_path):
    argv = [
        str(CHAOS),
        "--no-version-check",
        "--no-log-file",
        "validate",
        str(ROOT / "experiments" / "worker-crash.json"),
    ]
    done = subprocess.run(argv, env=toolkit_env(), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "look valid" in done.stdout + done.stderr, done.stdout + done.stderr


def test_installing_the_toolkit_keeps_our_package():
    """chaostoolkit installs the packages chaostoolkit and chaoslib and a `chaos` command: nothing named `sim`."""
    import sim

    assert Path(sim.__file__).resolve().parent == ROOT / "sim"
    import importlib.metadata as metadata

    for name in ("chaostoolkit", "chaostoolkit-lib"):
        top = {str(f).split("/")[0] for f in metadata.distribution(name).files}
        assert "sim" not in top and top & {"chaostoolkit", "chaoslib"}, (name, top)
