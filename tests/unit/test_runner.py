"""The scenario runner's pure parts and the fault catalog's wiring: trigger state from a growing
history, and every fault, as a scenario step and as a CLI verb, reaching the right nemesis call."""

from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest

import sim.cli.faults
from sim.cli.main import main as sim_main
from sim.core import labels
from sim.core.errors import UsageError
from sim.core.faultkinds import checkpoint, container, disk, etcd, network, process
from sim.core.faultkinds.clock import SKEW_CLOCK, SkewOptions
from sim.core.faultkinds.network import HEAL, LINK, PARTITION, HealOptions, NetemOptions, PartitionOptions
from sim.core.faultkinds.slow_disk import SLOW_DISK, SlowDiskOptions
from sim.core.history import History
from sim.core.partition import cut_from, isolate, one_way, split
from sim.core.spec import spec_from_options
from sim.faults.catalog import FAULTS
from sim.faults.inforce import InForce
from sim.scenarios.runner import HistoryState, ScenarioRunner, default_cluster_name
from sim.scenarios.scenario import Step, parse_scenario


def test_history_state_follows_a_growing_file(tmp_path):
    history = History(tmp_path / "h.jsonl")
    state = HistoryState(history.path)
    state.update()
    assert state.first_step_t is None and state.max_step == 0
    history.append({"t": 10.0, "type": "trainer", "kind": "progress", "step": 1, "world_size": 4})
    history.append({"t": 11.0, "type": "trainer", "kind": "progress", "step": 2, "world_size": 4})
    history.append({"t": 12.0, "type": "agent", "event": "rdzv_joined", "round": 1})
    state.update()
    assert (state.first_step_t, state.max_step, state.world_size, state.max_round) == (10.0, 2, 4, 1)
    # A half-written last line waits for the next poll.
    with open(history.path, "a") as f:
        f.write(json.dumps({"t": 13.0, "type": "trainer", "kind": "progress", "step": 3, "world_size": 2})[:20])
    state.update()
    assert state.max_step == 2
    with open(history.path, "a") as f:
        f.write(json.dumps({"t": 13.0, "type": "trainer", "kind": "progress", "step": 3, "world_size": 2})[20:] + "\n")
    state.update()
    assert (state.max_step, state.world_size, state.last_progress_t) == (3, 2, 13.0)


# ---------------------------------------------------------------- every fault reaches the right nemesis call

NODES = ["node0", "node1", "node2"]
ISOLATE_NODE1 = isolate(["node1"], [*NODES, "etcd"])
ETCD_CUT = cut_from(["etcd"], NODES, [*NODES, "etcd"])


class RecordingNemesis:
    """Stands in for sim.faults.nemesis.Nemesis on a cluster of node0..node2 and etcd: records each
    call by method name, so a fault wired to the wrong verb, or with the wrong arguments, shows."""

    def __init__(self):
        self.calls = []
        self.cluster = self
        self.recorded = []  # Nemesis.recorded: the fault ids whose intent it recorded

    def nodes(self):
        return [SimpleNamespace(node=n) for n in NODES]

    def containers(self):
        return [*self.nodes(), SimpleNamespace(node="etcd")]

    def resolve(self, target, **_):
        return target

    def active(self):
        # what it returns as ids: still in force
        return [InForce("partition-x", "partition", "node0 | node1"), InForce("link-node1", "link", "node1")]

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            cuts = bool(args) and args[0] is network.PARTITION
            return {"op": "1", "id": "partition-x" if cuts else "link-node1", "node": "node1"}

        return call


PAUSE_NODE1 = ("carry_out", (container.PAUSE, container.TargetOptions("node1")), {})
UNPAUSE_NODE1 = ("carry_out", (container.UNPAUSE, container.TargetOptions("node1")), {})
UNPAUSE_ETCD = ("carry_out", (container.UNPAUSE, container.TargetOptions("etcd")), {})
HEAL_PARTITION = ("carry_out", (HEAL, HealOptions("partition-x")), {})
HEAL_ID = ("carry_out", (HEAL, HealOptions("link-node1")), {})  # the id the recording nemesis answers

# fault -> (its scenario step's options, its CLI argv, the nemesis call, the undo call of a reversible one).
# Written out by hand, not derived from the catalog: this is what the catalog must do.
WIRING = {
    "kill-worker": (
        "target: node1\n    local_rank: 0\n    signal: TERM",
        ["kill-worker", "node1", "--local-rank", "0", "--signal", "TERM"],
        ("carry_out", (process.KILL_WORKER, process.KillWorkerOptions("node1", None, 0, signal.SIGTERM)), {}),
        None,
    ),
    "kill-agent": (
        "target: node1\n    signal: TERM",
        ["kill-agent", "node1", "--signal", "TERM"],
        ("carry_out", (process.KILL_AGENT, process.KillAgentOptions("node1", signal.SIGTERM)), {}),
        None,
    ),
    "kill-node": (
        "target: node2",
        ["kill", "node2"],
        ("carry_out", (container.KILL_NODE, container.TargetOptions("node2")), {}),
        None,
    ),
    "stop-node": (
        "target: node1\n    grace: 5s",
        ["stop", "node1", "--grace", "5s"],
        ("carry_out", (container.STOP_NODE, container.StopOptions("node1", 5.0)), {}),
        None,
    ),
    "restart-node": (
        "target: node1\n    grace: 1s\n    downtime: 2s",
        ["restart", "node1", "--grace", "1s", "--downtime", "2s"],
        ("carry_out", (container.RESTART_NODE, container.RestartOptions("node1", 1.0, 2.0)), {}),
        None,
    ),
    "start-node": (
        "target: node1",
        ["start", "node1"],
        ("carry_out", (container.START_NODE, container.TargetOptions("node1")), {}),
        None,
    ),
    "pause": ("target: node1", ["pause", "node1"], PAUSE_NODE1, UNPAUSE_NODE1),
    "unpause": ("target: node1", ["unpause", "node1"], UNPAUSE_NODE1, None),
    "partition": (
        "isolate: [node1]",
        ["partition", "--isolate", "node1"],
        ("carry_out", (PARTITION, PartitionOptions(isolate=("node1",))), {}),
        HEAL_PARTITION,
    ),
    "heal": ("id: link-node1", ["heal", "link-node1"], HEAL_ID, None),
    "netem": (
        "target: node1\n    delay: 100ms\n    jitter: 20ms\n    duplicate: 1%\n    corrupt: 2%",
        ["netem", "node1", "--delay", "100ms", "--jitter", "20ms", "--duplicate", "1%", "--corrupt", "2%"],
        (
            "carry_out",
            (LINK, NetemOptions("node1", delay=0.1, jitter=0.02, duplicate=1.0, corrupt=2.0)),
            {},
        ),
        HEAL_ID,
    ),
    "etcd-kill": (
        "",
        ["etcd", "kill"],
        ("carry_out", (container.KILL_NODE, container.NoOptions()), {"target": "etcd"}),
        None,
    ),
    "etcd-start": (
        "",
        ["etcd", "start"],
        ("carry_out", (container.START_NODE, container.NoOptions()), {"target": "etcd"}),
        None,
    ),
    "etcd-restart": (
        "downtime: 3s",
        ["etcd", "restart", "--downtime", "3s"],
        ("carry_out", (container.RESTART_NODE, container.DowntimeOptions(3.0)), {"target": "etcd"}),
        None,
    ),
    "etcd-wipe": (
        "downtime: 3s",
        ["etcd", "wipe", "--downtime", "3s"],
        ("carry_out", (etcd.WIPE_ETCD, etcd.WipeOptions(3.0)), {"target": "etcd"}),
        None,
    ),
    "etcd-pause": (
        "",
        ["etcd", "pause"],
        ("carry_out", (container.PAUSE, container.NoOptions()), {"target": "etcd"}),
        UNPAUSE_ETCD,
    ),
    "etcd-unpause": (
        "",
        ["etcd", "unpause"],
        ("carry_out", (container.UNPAUSE, container.NoOptions()), {"target": "etcd"}),
        None,
    ),
    "etcd-isolate": (
        "",
        ["etcd", "isolate"],
        ("carry_out", (PARTITION, container.NoOptions()), {"target": "etcd"}),
        HEAL_PARTITION,
    ),
    "hang-worker": (
        "target: node1\n    local_rank: 1",
        ["hang-worker", "node1", "--local-rank", "1"],
        ("carry_out", (process.HANG_WORKER, process.WorkerOptions("node1", None, 1)), {}),
        HEAL_ID,  # its own id: the one worker it stopped
    ),
    "hang-collectives": (
        "rank: 1",
        ["hang-collectives", "--rank", "1"],
        ("carry_out", (process.HANG_COLLECTIVES, process.WorkerOptions("random", 1, None)), {}),
        HEAL_ID,
    ),
    "resume-worker": (
        "target: node2",
        ["resume-worker", "node2"],
        ("carry_out", (process.RESUME_WORKER, process.NodeOptions("node2")), {}),
        None,
    ),
    "slow-node": (
        "target: node1\n    cpus: 0.25",
        ["slow", "node1", "--cpus", "0.25"],
        ("carry_out", (container.SLOW_NODE, container.SlowOptions("node1", 0.25)), {}),
        HEAL_ID,
    ),
    "skew-clock": (
        "target: node1\n    by: -10m",
        ["skew-clock", "node1", "--by=-10m"],
        ("carry_out", (SKEW_CLOCK, SkewOptions("node1", -600.0)), {}),
        HEAL_ID,
    ),
    "slow-disk": (
        "target: node1\n    write_rate: 1m",
        ["slow-disk", "node1", "--write-rate", "1m"],
        ("carry_out", (SLOW_DISK, SlowDiskOptions("node1", 2**20)), {}),
        HEAL_ID,
    ),
    "oom-worker": (
        "rank: 2",
        ["oom-worker", "--rank", "2"],
        ("carry_out", (process.OOM_WORKER, process.WorkerOptions("random", 2, None)), {}),
        None,
    ),
    "corrupt-checkpoint": (
        "target: node0\n    mode: truncate\n    dir: /data/ckpt",
        ["corrupt-checkpoint", "node0", "--mode", "truncate", "--dir", "/data/ckpt"],
        (
            "carry_out",
            (checkpoint.CORRUPT_CHECKPOINT, checkpoint.CorruptOptions("node0", "truncate", "/data/ckpt")),
            {},
        ),
        None,
    ),
    "fill-disk": (
        "target: node2\n    leave: 4k",
        ["fill-disk", "node2", "--leave", "4k"],
        ("carry_out", (disk.FILL_DISK, disk.FillOptions("node2", "/ckpt", 4096)), {}),
        HEAL_ID,
    ),
    "kill-during-checkpoint": (
        "within: 20s\n    signal: TERM",
        ["kill-during-checkpoint", "--within", "20s", "--signal", "TERM"],
        (
            "carry_out",
            (checkpoint.KILL_DURING_CHECKPOINT, checkpoint.KillInWriteOptions("rank0", "/ckpt", 20.0, signal.SIGTERM)),
            {},
        ),
        None,
    ),
    "freeze-during-checkpoint": (
        "target: node1\n    within: 20s",
        ["freeze-during-checkpoint", "node1", "--within", "20s"],
        ("carry_out", (checkpoint.FREEZE_DURING_CHECKPOINT, checkpoint.InWriteOptions("node1", "/ckpt", 20.0)), {}),
        HEAL_ID,
    ),
    "scale": (
        "nodes: 2\n    abrupt: true\n    grace: 3s",
        ["scale", "--nodes", "2", "--abrupt", "--grace", "3s"],
        ("carry_out", (container.SCALE, container.ScaleOptions(2, True, 3.0)), {}),
        None,
    ),
}
SCENARIO_HEAD = "name: t\ndescription: d\ncluster: {nodes: 3}\nexpect: {outcome: recovers}\n"
# Verbs that bring a stopped container back, so they must not require a running cluster.
NOT_NEEDING_RUNNING = {"start-node", "etcd-start"}


def test_every_fault_of_the_catalog_is_wired_here():
    assert set(WIRING) == set(FAULTS)


def step_of(fault: str, options: str, reversible: bool) -> Step:
    text = (
        f"name: t\ndescription: d\ncluster: {{nodes: 3, rdzv_backend: etcd-v2}}\nexpect: {{outcome: recovers}}\n"
        f"steps:\n  - fault: {fault}\n    {options}\n    at: {{step: 1}}\n"
        + ("    duration: 10ms\n" if reversible else "")
    )
    (step,) = parse_scenario(text, "t.yaml").steps
    return step


@pytest.mark.parametrize("fault", sorted(WIRING))
def test_a_scenario_step_reaches_its_nemesis_call_and_undo(fault):
    options, _, call, undo = WIRING[fault]
    step = step_of(fault, options, undo is not None)
    runner = ScenarioRunner(parse_scenario(SCENARIO_HEAD, "t.yaml"), "etcd-v2", docker=object(), progress=print)
    nemesis = RecordingNemesis()
    runner._fire(nemesis, step)
    for timer, _ in runner._undo_timers:
        timer.join(5)
    assert nemesis.calls == [call] + ([undo] if undo else [])


@pytest.mark.parametrize("fault", sorted(WIRING))
def test_a_cli_verb_reaches_its_nemesis_call_and_undo(fault, monkeypatch, capsys):
    _, argv, call, undo = WIRING[fault]
    nemesis, needs_running = RecordingNemesis(), []
    monkeypatch.setattr(sim.cli.faults, "_nemesis", lambda args, running=True: needs_running.append(running) or nemesis)
    assert sim_main([*argv, "--name", "t", *(["--for", "0s"] if undo else [])]) == 0, capsys.readouterr().err
    assert nemesis.calls == [call] + ([undo] if undo else [])
    assert needs_running == [fault not in NOT_NEEDING_RUNNING]


@pytest.mark.parametrize("fault", sorted(f for f in WIRING if len(FAULTS[f].verb) == 1 and FAULTS[f].verb != (f,)))
def test_a_short_verb_also_answers_to_its_scenario_name(fault, monkeypatch, capsys):
    """`sim slow-node node1` is `sim slow node1`: the name a scenario step and `sim vet --faults` use (issue 38)."""
    _, argv, call, undo = WIRING[fault]
    nemesis = RecordingNemesis()
    monkeypatch.setattr(sim.cli.faults, "_nemesis", lambda args, running=True: nemesis)
    assert sim_main([fault, *argv[1:], "--name", "t", *(["--for", "0s"] if undo else [])]) == 0, capsys.readouterr().err
    assert nemesis.calls == [call] + ([undo] if undo else [])


@pytest.mark.parametrize(
    "argv, call",
    [
        (["heal", "--all"], ("carry_out", (HEAL, HealOptions(all=True)), {})),
        (
            ["kill-worker", "--rank", "3"],
            ("carry_out", (process.KILL_WORKER, process.KillWorkerOptions("random", 3, None, signal.SIGKILL)), {}),
        ),
        (
            ["netem", "node1", "--loss", "30%", "--rate", "1mbit", "--for", "0s"],
            ("carry_out", (LINK, NetemOptions("node1", loss=30.0, rate=1_000_000)), {}),
        ),
    ],
)
def test_cli_option_shapes(argv, call, monkeypatch, capsys):
    nemesis = RecordingNemesis()
    monkeypatch.setattr(sim.cli.faults, "_nemesis", lambda args, running=True: nemesis)
    assert sim_main([*argv, "--name", "t"]) == 0, capsys.readouterr().err
    assert nemesis.calls[0] == call


@pytest.mark.parametrize(
    "argv, message",
    [
        (["kill-worker", "--rank", "1", "--local-rank", "0"], "give at most one of rank, local_rank"),
        (["pause", "node1", "--for", "3x"], "--for: duration '3x': not a duration"),
        (["netem", "node1"], "netem: nothing to degrade"),
        (["netem", "node1", "--jitter", "5ms"], "jitter varies a delay"),
        (["heal"], "give exactly one of id, all; got none"),
        (["partition"], "give exactly one of groups, isolate, from_etcd, from_peers, one_way; got none"),
        (["scale", "--nodes", "x"], "--nodes: 'x' is not a whole number"),
        (["stop", "node1", "--grace", "soon"], "--grace: duration 'soon'"),
        (["slow", "node1", "--cpus", "fast"], "--cpus: cpus 'fast': not a number"),
        (["slow", "node1", "--cpus", "0"], "cpus 0.0: not a number of CPUs > 0"),
        (["corrupt-checkpoint", "--mode", "shred"], "mode 'shred': not bitflip or truncate"),
        (["fill-disk", "--dir", "ckpt"], "dir 'ckpt': not an absolute path"),
        (["fill-disk", "--leave", "lots"], "--leave: size 'lots': not a size"),
        (["hang-worker", "--rank", "1", "--local-rank", "0"], "give at most one of rank, local_rank"),
    ],
)
def test_bad_cli_input_is_one_line_and_reaches_no_cluster(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sim.cli.faults, "_nemesis", lambda *a, **k: pytest.fail("reached the cluster"))
    assert sim_main([*argv, "--name", "t"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    "argv, cut",
    [
        (["partition", "node0|node1,node2"], split([["node0"], ["node1", "node2"]], NODES)),
        (["partition", "--isolate", "node1"], ISOLATE_NODE1),
        (["partition", "--from-etcd", "node1"], cut_from(["node1"], ["etcd"], [*NODES, "etcd"])),
        (["partition", "--from-peers", "node1"], cut_from(["node1"], ["node0", "node2"], [*NODES, "etcd"])),
        (["partition", "--one-way", "node1", "etcd,node0"], one_way(["node1"], ["etcd", "node0"])),
        (["etcd", "isolate"], ETCD_CUT),
    ],
)
def test_a_partitions_shape_cuts_these_links(argv, cut, monkeypatch, capsys):
    """The CLI's shapes reach the partition kind, whose links among the cluster's nodes are these cuts."""
    nemesis = RecordingNemesis()
    monkeypatch.setattr(sim.cli.faults, "_nemesis", lambda args, running=True: nemesis)
    assert sim_main([*argv, "--name", "t"]) == 0, capsys.readouterr().err
    ((_, (kind, options), aimed),) = nemesis.calls
    assert kind is PARTITION and kind.act.links(options, aimed.get("target"), tuple(NODES), True) == cut


def test_partition_options_build_the_cuts_with_or_without_etcd():
    nodes = ("node0", "node1")
    options = PartitionOptions(isolate=("node1",))
    assert options.cuts(nodes, has_etcd=True) == isolate(["node1"], ["node0", "node1", "etcd"])
    assert options.cuts(nodes, has_etcd=False) == isolate(["node1"], ["node0", "node1"])
    assert PartitionOptions(one_way=(("node1",), ("etcd",))).cuts(nodes, has_etcd=True).cuts == {("node1", "etcd")}
    with pytest.raises(UsageError, match="from_etcd: this cluster has no etcd"):
        PartitionOptions(from_etcd=("node1",)).cuts(nodes, has_etcd=False)


def test_fault_options_validate_themselves():
    with pytest.raises(UsageError, match="give exactly one of groups, isolate"):
        PartitionOptions(isolate=("node1",), from_peers=("node0",))
    with pytest.raises(UsageError, match="rank -1: not a whole number >= 0"):
        FAULTS["kill-worker"].make_options({"rank": -1})
    with pytest.raises(UsageError, match="kill-agent: needs target"):
        FAULTS["kill-agent"].make_options({})
    with pytest.raises(UsageError, match="scale: takes no target"):
        FAULTS["scale"].make_options({"nodes": 2, "target": "node0"})
    assert FAULTS["stop-node"].make_options({"target": "node1"}).grace == 10.0


def test_history_state_counts_any_scripts_optimizer_steps(tmp_path):
    # A plain script seen by the instrumentation: an absolute step where the optimizer knows it
    # (Adam), else the optimizer steps the process took (SGD).
    history = History(tmp_path / "h.jsonl")
    state = HistoryState(history.path)
    history.append(
        {"t": 10.0, "type": "worker", "node": "node0", "event": "step", "n": 3, "step": None, "world_size": 2}
    )
    history.append({"t": 11.0, "type": "worker", "node": "node0", "event": "activity", "collectives": 9})
    state.update()
    assert (state.first_step_t, state.max_step, state.world_size) == (10.0, 3, 2)
    history.append({"t": 12.0, "type": "worker", "node": "node1", "event": "step", "n": 1, "step": 41})
    state.update()
    assert state.max_step == 41


def test_a_scenario_on_two_backends_gets_two_cluster_names():
    """The `up` of a name sweeps whatever carries it: runs of one scenario on two backends at once
    (the suite's two workers ran clock-skew-5s so) must not share one."""
    assert default_cluster_name("clock-skew-5s", "etcd-v2", "") == "chaos-clock-skew-5s-etcd-v2"
    assert default_cluster_name("clock-skew-5s", "c10d", "") == "chaos-clock-skew-5s-c10d"
    long = default_cluster_name("x" * 60, "etcd-v3", "")
    assert len(long) == 40 and long.endswith("x-etcd-v3")
    spec_from_options({"name": long}, None)  # a valid cluster name


def test_two_test_sessions_on_one_engine_get_two_cluster_names_per_scenario(monkeypatch):
    """Two suites (two CI jobs) on one engine ran the same scenario at once: the second's `up` was refused,
    the name held by the other's home. A session's tag ends the name; a user's run (no SIM_SESSION) keeps
    the plain one."""
    first = default_cluster_name("amp-memory", "c10d", "pytest-1a2b3c4d-gw0")
    second = default_cluster_name("amp-memory", "c10d", "pytest-9f8e7d6c-gw0")
    assert first != second and first.startswith("chaos-amp-memory-c10d-") and len(first) <= 40
    long = default_cluster_name("x" * 60, "etcd-v3", "pytest-1a2b3c4d")
    assert len(long) == 40 and "-etcd-v3-" in long
    spec_from_options({"name": long}, None)
    monkeypatch.setenv(labels.SESSION_ENV, "pytest-1a2b3c4d-gw0")
    assert default_cluster_name("amp-memory", "c10d") == first
    monkeypatch.delenv(labels.SESSION_ENV)
    assert default_cluster_name("amp-memory", "c10d") == "chaos-amp-memory-c10d"


@pytest.mark.parametrize("keep_faults", [False, True])
def test_a_kept_cluster_gets_its_pending_undos_and_faults_healed_unless_keep_faults(keep_faults):
    """--cluster (or --keep): the run ends (also by SIGTERM) before a step's duration is over; the
    pending undo runs once, and the faults this run made are healed; --keep-faults leaves them."""
    import dataclasses

    options, _, call, undo = WIRING["partition"]
    step = dataclasses.replace(step_of("partition", options, True), duration_s=600)
    runner = ScenarioRunner(
        parse_scenario(SCENARIO_HEAD, "t.yaml"),
        "etcd-v2",
        docker=object(),
        progress=print,
        cluster_name="c",
        keep_faults=keep_faults,
    )

    class Healing(RecordingNemesis):
        def active(self):  # a healed fault is no longer in force
            healed = {c[1][1].id for c in self.calls if c[0] == "carry_out" and c[1][0] is HEAL}
            return [f for f in super().active() if f.id not in healed]

    nemesis = Healing()
    runner._fire(nemesis, step)
    for timer, _ in runner._undo_timers:
        timer.cancel()
    if not keep_faults:
        runner._heal_own(nemesis)
        runner._heal_own(nemesis)  # the undo never runs twice
    assert nemesis.calls[0] == call
    if keep_faults:
        assert nemesis.calls == [call]
    else:
        assert nemesis.calls[1:] == [undo]  # once: by the pending undo, then nothing is left to heal


def test_joining_counts_the_agents_that_entered_a_rendezvous_since_a_time(tmp_path):
    """`joining: N` fires inside a round: N agents logged torch's "attempts to join the next round" since the
    previous step (each agent once; an older entry does not count)."""
    history = History(tmp_path / "h.jsonl")
    state = HistoryState(history.path)
    history.append({"t": 5.0, "type": "agent", "node": "node0", "event": "rdzv_joining"})
    history.append({"t": 11.0, "type": "agent", "node": "node1", "event": "rdzv_joining"})
    history.append({"t": 11.5, "type": "agent", "node": "node1", "event": "rdzv_joining"})
    history.append({"t": 12.0, "type": "agent", "node": "node2", "event": "rdzv_joining"})
    state.update()
    assert state.agents_joining(10.0) == 2
    assert state.agents_joining(0.0) == 3
    assert state.agents_joining(12.0) == 0


def test_a_kept_cluster_gets_a_fault_healed_whose_call_was_interrupted_mid_act():
    """Issue 37 finding 7: the call never returned its id (SIGTERM while fill-disk's exec ran), but the
    nemesis recorded its intent: cleanup heals it; a fault another process made stays."""
    runner = ScenarioRunner(
        parse_scenario(SCENARIO_HEAD, "t.yaml"), "etcd-v2", docker=object(), progress=print, cluster_name="c"
    )
    nemesis = RecordingNemesis()
    nemesis.recorded.append("link-node1")  # recorded before it acted; the call was cut
    runner._heal_own(nemesis)
    assert [c for c in nemesis.calls if c[0] == "heal"] == [("heal", ("link-node1",), {})]
