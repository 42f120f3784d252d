import re
import signal
from pathlib import Path

import pytest

from sim.core.errors import UsageError
from sim.core.spec import spec_from_options
from sim.faults.catalog import FAULTS
from sim.scenarios.scenario import (
    PROFILES,
    Expectation,
    Scenario,
    Step,
    Trigger,
    load_scenario,
    parse_scenario,
    scenario_spec_options,
)
from sim.scenarios.shipped import QUICK_SUITE, shipped_scenarios

SOURCE = "chaos/scenarios/t.yaml"
FORMAT_MD = Path(__file__).resolve().parents[2] / "chaos" / "scenarios" / "FORMAT.md"

FULL = """\
name: worker-crash
description: a worker dies; the job recovers
cluster:
  nodes: 2
  min_nodes: 1
  max_nodes: 3
  nproc_per_node: 2
  max_restarts: 3
  rdzv_backend: [etcd-v2, c10d]
  rdzv_conf: {join_timeout: 60}
  env: {NCCL_DEBUG: INFO}
trainer:
  steps: 120
  step_time: 0.1
  ckpt_interval: 10
profile: fast
seed: 7
steps:
  - fault: kill-worker
    target: random
    signal: TERM
    at: {step: 30}
    repeat: {times: 3, every: 20s}
  - fault: scale
    nodes: 3
    at: {world_size: 4}
  - fault: partition
    groups: node0|node1,node2
    at: {after: 5s}
    duration: 20s
  - fault: netem
    target: node2
    loss: 30%
    at: {time: 1m30s}
    duration: 10s
  - fault: heal
    all: true
    at: {round: 2}
expect:
  outcome: {etcd-v2: recovers, c10d: fails}
  max_recovery_s: 30
  max_steps_lost: 10
  hang_s: 1m
  fail_fast_s: 60
timeout: 5m
"""


def test_full_example_parses_to_dataclasses():
    s = parse_scenario(FULL, SOURCE)
    assert (s.name, s.description, s.path) == ("worker-crash", "a worker dies; the job recovers", SOURCE)
    assert s.cluster == {
        "nodes": 2,
        "min_nodes": 1,
        "max_nodes": 3,
        "nproc_per_node": 2,
        "max_restarts": 3,
        "rdzv_conf": (("join_timeout", "60"),),
        "env": (("NCCL_DEBUG", "INFO"),),
    }
    assert s.backends == ("etcd-v2", "c10d")
    assert s.trainer == {"steps": 120, "step_time": 0.1, "ckpt_interval": 10}
    assert (s.profile, s.seed, s.timeout_s) == ("fast", 7, 300.0)
    assert s.steps == (
        Step(
            "kill-worker",
            {"target": "random", "signal": signal.SIGTERM},
            Trigger("step", 30),
            repeat_times=3,
            repeat_every_s=20.0,
            line=19,
        ),
        Step("scale", {"nodes": 3, "abrupt": False, "grace": 10.0}, Trigger("world_size", 4), line=24),
        Step(
            "partition", {"groups": (("node0",), ("node1", "node2"))}, Trigger("after", 5.0), duration_s=20.0, line=27
        ),
        Step("netem", {"target": "node2", "loss": 30.0}, Trigger("time", 90.0), duration_s=10.0, line=31),
        Step("heal", {"all": True}, Trigger("round", 2), line=36),
    )
    assert s.expect == Expectation(
        {"etcd-v2": "recovers", "c10d": "fails"}, max_recovery_s=30.0, max_steps_lost=10, hang_s=60.0, fail_fast_s=60.0
    )
    assert s.expect.outcome("c10d") == "fails"


def test_minimal_scenario_takes_the_defaults():
    s = parse_scenario("name: baseline\ndescription: no faults\nexpect: {outcome: recovers}\n", SOURCE)
    assert (s.cluster, s.backends, s.trainer, s.profile, s.seed, s.steps, s.timeout_s) == (
        {},
        ("etcd-v2",),
        {},
        "fast",
        None,
        (),
        600.0,
    )


def test_format_md_examples_parse():
    blocks = re.findall(r"```yaml\n(.*?)```", FORMAT_MD.read_text(), re.S)
    s = parse_scenario(blocks[0], str(FORMAT_MD))
    assert s.name == "worker-crash" and len(s.steps) == 2


def test_spec_options_merge_profile_cluster_and_trainer():
    s = parse_scenario(FULL, SOURCE)
    options = scenario_spec_options(s, "c10d")
    assert options["rdzv_backend"] == "c10d"
    assert dict(options["rdzv_conf"]) == {
        "last_call_timeout": "2",
        "join_timeout": "60",
        "keep_alive_interval": "1",
        "keep_alive_max_attempt": "3",
        "close_timeout": "5",
    }
    assert dict(options["env"]) == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "NCCL_DEBUG": "INFO"}
    assert options["script_args"] == (
        "--steps",
        "120",
        "--step-time",
        "0.1",
        "--ckpt-interval",
        "10",
        "--pg-timeout",
        "15",
    )
    spec = spec_from_options(options, None)
    assert (spec.nodes, spec.max_nodes, spec.rdzv_backend, spec.script) == (2, 3, "c10d", None)
    with pytest.raises(UsageError, match="runs on etcd-v2, c10d"):
        scenario_spec_options(s, "static")


def test_torch_defaults_profile_sets_nothing():
    assert PROFILES["torch-defaults"] == {}
    s = parse_scenario("name: a\ndescription: b\nprofile: torch-defaults\nexpect: {outcome: recovers}\n", SOURCE)
    options = scenario_spec_options(s, "etcd-v2")
    assert (options["rdzv_conf"], options["env"]) == ((), ())
    # `sim up`'s defaults for the shipped trainer
    assert options["script_args"] == ("--steps", "600", "--step-time", "0.2", "--ckpt-interval", "10")


def test_user_script_is_relative_to_the_file(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: a\ndescription: b\ncluster:\n  script: train.py\n  script_args: ['--foo', 1]\n"
        "expect: {outcome: recovers}\n"
    )
    s = load_scenario(path)
    assert s.cluster["script"] == str((tmp_path / "train.py").resolve())
    options = scenario_spec_options(s, "etcd-v2")
    assert options["script_args"] == ("--foo", "1")
    assert spec_from_options(options, None).script_in_node == "/opt/sim/project/train.py"


def test_dataclasses_validate_themselves():
    with pytest.raises(UsageError, match="trigger 'soon'"):
        Trigger("soon", 1)
    with pytest.raises(UsageError, match="world_size 0"):
        Trigger("world_size", 0)
    with pytest.raises(UsageError, match="kill-node cannot be undone"):
        Step("kill-node", {"target": "node0"}, duration_s=5.0)
    with pytest.raises(UsageError, match="takes no grace"):
        Step("kill-worker", {"grace": 1.0})
    with pytest.raises(UsageError, match="outcome 'maybe'"):
        Expectation({"etcd-v2": "maybe"})
    with pytest.raises(UsageError, match="backend 'c10d': no expected outcome"):
        Scenario("a", "b", backends=("etcd-v2", "c10d"), expect=Expectation({"etcd-v2": "fails"}))
    assert Scenario("a", "b").expect.outcome("etcd-v2") == "recovers"


def test_missing_file():
    with pytest.raises(UsageError, match="nope.yaml: no such scenario file"):
        load_scenario("nope.yaml")


# ---------------------------------------------------------------- errors: file, line, field

HEAD = """\
name: t
description: d
cluster: {nodes: 2, rdzv_backend: etcd-v2}
expect: {outcome: recovers}
steps:
"""  # steps start on line 6


def error_of(text: str) -> str:
    with pytest.raises(UsageError) as caught:
        parse_scenario(text, SOURCE)
    return str(caught.value)


@pytest.mark.parametrize(
    "steps, line, path, fragment",
    [
        (
            "  - fault: kill-worker\n    targte: node0\n    at: {step: 3}\n",
            7,
            "steps[0].targte",
            "unknown key 'targte' (did you mean 'target'?)",
        ),
        (
            "  - fault: pause\n    target: node0\n    at: {step: 3}\n    duration: ten\n",
            9,
            "steps[0].duration",
            "duration 'ten': not a duration",
        ),
        (
            "  - fault: pause\n    target: node0\n    at: {step: 3, time: 5s}\n",
            8,
            "steps[0].at",
            "exactly one of time, step, after, world_size, round, recovered, joining; got step and time",
        ),
        (
            "  - fault: pause\n    target: node0\n    at:\n      step: ten\n",
            9,
            "steps[0].at.step",
            "'ten' is not a whole number; use e.g. step: 30",
        ),
        ("  - fault: pause\n    target: node0\n", 6, "steps[0].at", "missing"),
        (
            "  - fault: kill-wroker\n    at: {step: 3}\n",
            6,
            "steps[0].fault",
            "'kill-wroker' is not a fault (did you mean 'kill-worker'?)",
        ),
        ("  - fault: pause\n    target: node2\n    at: {step: 3}\n", 7, "steps[0].target", "unknown node 'node2'"),
        (
            "  - fault: partition\n    at: {step: 3}\n    groups: node0|node0,node1\n",
            8,
            "steps[0].groups",
            "node 'node0' named twice",
        ),
        (
            "  - fault: partition\n    at: {step: 3}\n    isolate: [node1, node1]\n",
            8,
            "steps[0].isolate",
            "node 'node1' named twice",
        ),
        (
            "  - fault: partition\n    isolate: node0\n    from_peers: node1\n    at: {step: 3}\n",
            6,
            "steps[0]",
            "exactly one of groups, isolate, from_etcd, from_peers, one_way; got isolate and from_peers",
        ),
        (
            "  - fault: kill-node\n    target: node1\n    at: {step: 3}\n    duration: 5s\n",
            9,
            "steps[0].duration",
            "kill-node cannot be undone, so it takes no duration",
        ),
        ("  - fault: kill-agent\n    target: etcd\n    at: {step: 3}\n", 7, "steps[0].target", "name a node"),
        (
            "  - fault: kill-node\n    target: store-host\n    at: {step: 3}\n",
            7,
            "steps[0].target",
            "the store is etcd",
        ),
        (
            "  - fault: netem\n    target: node1\n    rate: 1mbit\n    delay: 10ms\n    at: {step: 3}\n",
            6,
            "steps[0]",
            "rate and delay/jitter/duplicate/corrupt both replace the root qdisc",
        ),
        (
            "  - fault: netem\n    target: node1\n    loss: 130%\n    at: {step: 3}\n",
            8,
            "steps[0].loss",
            "percentage '130%': out of range",
        ),
        (
            "  - fault: kill-worker\n    signal: FOO\n    at: {step: 3}\n",
            7,
            "steps[0].signal",
            "signal 'FOO': not a signal",
        ),
        (
            "  - fault: kill-node\n    target: node0\n    at: {world_size: 5}\n",
            8,
            "steps[0].at.world_size",
            "never reached: at most max_nodes x nproc_per_node = 4",
        ),
        (
            "  - fault: pause\n    target: node0\n    at: {step: 1}\n    duration: 30s\n"
            "    repeat: {times: 2, every: 20s}\n",
            10,
            "steps[0].repeat",
            "the next would start before the last is undone",
        ),
        (
            "  - fault: scale\n    nodes: 3\n    at: {step: 1}\n"
            "  - fault: pause\n    target: node2\n    at: {after: 1s}\n"
            "  - fault: pause\n    target: node3\n    at: {after: 1s}\n",
            13,
            "steps[2].target",
            "unknown node 'node3'; the cluster has node0, node1, node2 at this step",
        ),
        (
            "  - fault: heal\n    all: false\n    at: {step: 1}\n",
            6,
            "steps[0]",
            "give exactly one of id, all; got none",
        ),
        (
            "  - fault: pause\n    target: node0\n    at: {step: 601}\n",
            8,
            "steps[0].at.step",
            "never reached: the trainer runs 600 steps",
        ),
        ("  - kill-worker\n", 6, "steps[0]", "expected a mapping"),
    ],
)
def test_step_errors_name_file_line_and_field(steps, line, path, fragment):
    message = error_of(HEAD + steps)
    assert message.startswith(f"{SOURCE}:{line}: {path}: "), message
    assert fragment in message


@pytest.mark.parametrize(
    "text, line, path, fragment",
    [
        ("description: d\nexpect: {outcome: recovers}\n", 1, "name", "missing"),
        ("name: Worker Crash\ndescription: d\nexpect: {outcome: recovers}\n", 1, "name", "not a scenario name"),
        (
            "name: a\ndescription: d\nclustr: {nodes: 2}\nexpect: {outcome: recovers}\n",
            3,
            "clustr",
            "unknown key 'clustr' (did you mean 'cluster'?)",
        ),
        ("name: a\ndescription: d\nname: b\nexpect: {outcome: recovers}\n", 3, "name", "given twice"),
        (
            "name: a\ndescription: d\nexpect:\n  outcome: recover\n",
            4,
            "expect.outcome",
            "'recover' is not an outcome (did you mean 'recovers'?)",
        ),
        (
            "name: a\ndescription: d\ncluster: {rdzv_backend: [etcd-v2, c10d]}\nexpect:\n  outcome: {etcd-v2: fails}\n",
            5,
            "expect.outcome.c10d",
            "missing",
        ),
        (
            "name: a\ndescription: d\ncluster:\n  rdzv_backend: [etcd-v2, c10d]\nexpect: {outcome: fails}\nsteps:\n"
            "  - fault: etcd-kill\n    at: {step: 1}\n",
            7,
            "steps[0].fault",
            "etcd-kill needs an etcd backend (etcd-v2, etcd, etcd-v3), but the scenario runs on c10d",
        ),
        (
            "name: a\ndescription: d\ncluster: {rdzv_backend: c10d}\nexpect: {outcome: fails}\nsteps:\n"
            "  - fault: pause\n    target: etcd\n    at: {step: 1}\n",
            7,
            "steps[0].target",
            "target etcd needs an etcd backend",
        ),
        (
            "name: a\ndescription: d\ncluster: {rdzv_backend: c10d}\nexpect: {outcome: fails}\nsteps:\n"
            "  - fault: partition\n    from_etcd: [node0]\n    at: {step: 1}\n",
            7,
            "steps[0].from_etcd",
            "from_etcd: this cluster has no etcd (c10d/static backend)",
        ),
        (
            "name: a\ndescription: d\ncluster:\n  nodes: 2\n  min_nodes: 3\nexpect: {outcome: recovers}\n",
            4,
            "cluster",
            "--min-nodes 3 > --nodes 2",
        ),
        (
            "name: a\ndescription: d\ncluster:\n  script_args: [--x]\nexpect: {outcome: recovers}\n",
            4,
            "cluster.script_args",
            "only for a user script",
        ),
        (
            "name: a\ndescription: d\ncluster:\n  script: missing.py\nexpect: {outcome: recovers}\n",
            4,
            "cluster.script",
            "no such file",
        ),
        (
            "name: a\ndescription: d\ntrainer:\n  stesp: 5\nexpect: {outcome: recovers}\n",
            4,
            "trainer.stesp",
            "did you mean 'steps'?",
        ),
        (
            "name: a\ndescription: d\ntimeout: soon\nexpect: {outcome: recovers}\n",
            3,
            "timeout",
            "duration 'soon': not a duration",
        ),
        ("name: a\ndescription: d\nprofile: quick\nexpect: {outcome: recovers}\n", 3, "profile", "not a profile"),
    ],
)
def test_scenario_errors_name_file_line_and_field(text, line, path, fragment):
    message = error_of(text)
    assert message.startswith(f"{SOURCE}:{line}: {path}: "), message
    assert fragment in message


def test_trainer_args_with_a_user_script_are_an_error(tmp_path):
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: a\ndescription: d\ncluster: {script: train.py}\ntrainer: {steps: 5}\nexpect: {outcome: recovers}\n"
    )
    with pytest.raises(UsageError, match=re.escape(f"{path}:4: trainer: args of the shipped trainer")):
        load_scenario(path)


@pytest.mark.parametrize(
    "text, start",
    [
        ("name: a\n  description: d\n", f"{SOURCE}:2: not valid YAML: "),
        ("", f"{SOURCE}:1: empty"),
        ("- a\n- b\n", f"{SOURCE}:1: top level: expected a mapping"),
    ],
)
def test_file_level_errors(text, start):
    assert error_of(text).startswith(start)


@pytest.mark.parametrize(
    "nesting",
    [
        "steps: " + "[" * 5000 + "]" * 5000 + "\n",  # flow lists
        "cluster:\n" + "".join("  " * (depth + 1) + f"k{depth}:\n" for depth in range(2000)),  # block mappings
    ],
)
def test_runaway_nesting_is_one_line_not_a_recursion_error(nesting):
    message = error_of("name: a\ndescription: d\nexpect: {outcome: recovers}\n" + nesting)
    assert re.match(rf"{SOURCE}:\d+: nested too deeply to read; .*unclosed \[", message), message


def test_expect_can_name_the_checkers_that_apply():
    text = (
        "name: some-checks\ndescription: only two checkers\nexpect:\n  outcome: recovers\n"
        "  checkers: [completed, progress]\n"
    )
    assert parse_scenario(text, "s.yaml").expect.checkers == ("completed", "progress")
    bad = text.replace("progress]", "progres]")
    with pytest.raises(UsageError, match=r"s.yaml:5: expect.checkers\[1\]: .*progres"):
        parse_scenario(bad, "s.yaml")


def test_format_md_fault_table_names_every_fault_and_option():
    """The documented table and the catalog agree: each fault has a row naming each of its options
    and its CLI verb."""
    rows = {}
    for line in FORMAT_MD.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        for name in re.findall(r"`([a-z-]+)`", cells[0]) if cells else ():
            rows[name] = cells[1:]
    assert set(rows) == set(FAULTS)
    for name, fault in FAULTS.items():
        options, cli = rows[name]
        documented = set(re.findall(r"`([a-z_]+)(?::[^`]*)?`", options))  # `all: true` names `all`
        assert set(fault.option_names) <= documented, (name, set(fault.option_names) - documented)
        assert fault.reversible == ("duration" in documented), name
        assert f"`sim {' '.join(fault.verb)}`" in cli or (
            f"`sim {fault.verb[0]} " in cli and f"`{fault.verb[-1]}`" in cli
        ), (name, cli)


def _kinds_and_outcomes(cases):
    """(backend, fault kind) and (backend, expected outcome) pairs a set of catalog runs covers."""
    by_name = {s.name: s for s in shipped_scenarios()}
    kinds, outcomes = set(), set()
    for name, backend in cases:
        scenario = by_name[name]
        kinds |= {(backend, step.fault) for step in scenario.steps}
        outcomes.add((backend, scenario.expect.outcome(backend)))
    return kinds, outcomes


def test_the_quick_suite_runs_every_fault_kind_and_outcome_on_every_backend():
    every_run = {(s.name, backend) for s in shipped_scenarios() for backend in s.backends}
    assert QUICK_SUITE <= every_run, sorted(QUICK_SUITE - every_run)  # no stale names
    kinds, outcomes = _kinds_and_outcomes(every_run)
    quick_kinds, quick_outcomes = _kinds_and_outcomes(QUICK_SUITE)
    assert kinds - quick_kinds == set()
    assert outcomes - quick_outcomes == set()


def test_after_beside_another_trigger_is_a_lag(tmp_path):
    """`at: {joining: 3, after: 3s}`: 3 s after 3 agents entered a rendezvous (a fault inside the round)."""
    path = tmp_path / "lag.yaml"
    path.write_text(
        "name: lag\ndescription: d\ncluster: {nodes: 3}\n"
        "steps:\n  - fault: kill-node\n    target: node0\n    at: {joining: 3, after: 3s}\n"
        "expect: {outcome: recovers}\n"
    )
    (step,) = load_scenario(path).steps
    assert (step.trigger.kind, step.trigger.value, step.trigger.lag_s) == ("joining", 3, 3.0)
