"""The node image's worker instrumentation (images/node): pure parts in-process, then the real
thing in a subprocess: real torch, a fake torchrun environment, a one-process gloo group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parents[2] / "images" / "node"
sys.path.insert(0, str(NODE_DIR))

import elastic_sim_instrument as instrument  # noqa: E402

import elastic_sim_progress as progress  # noqa: E402

WORKER_ENV = {
    "LOCAL_RANK": "0",
    "RANK": "2",
    "WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "demo-r1",
    "TORCHELASTIC_RESTART_COUNT": "1",
    "SIM_NODE": "node1",
}
# What elastic-sim.pth does at start-up, for a process that is not in the node's site-packages.
WITH_NODE_SITE = f"import site; site.addsitedir({str(NODE_DIR)!r}); "


# --- who is instrumented -------------------------------------------------------------------


def test_only_torchrun_workers_with_a_side_channel_are_instrumented():
    worker = {**WORKER_ENV, "SIM_EVENTS_DIR": "/sim/events"}
    assert instrument.should_instrument(worker, pid=7)
    assert not instrument.should_instrument({}, pid=7)  # any other process: python, pip, the agent
    assert not instrument.should_instrument({k: v for k, v in worker.items() if k != "LOCAL_RANK"}, pid=7)
    assert not instrument.should_instrument({**worker, "SIM_INSTRUMENT": "0"}, pid=7)  # --no-instrument
    assert not instrument.should_instrument({**worker, "SIM_EVENTS_DIR": ""}, pid=7)
    # A child of an instrumented worker (DataLoader worker, subprocess) inherits the env, not the role.
    assert not instrument.should_instrument({**worker, instrument.OWNER_ENV: "6"}, pid=7)
    assert instrument.should_instrument({**worker, instrument.OWNER_ENV: "7"}, pid=7)


def test_record_fields_follow_the_contract():
    identity = progress.worker_identity(WORKER_ENV)
    record = progress.build_record("step", identity, 12.5, 99, n=3, step=103)
    assert record == {
        "t": 12.5,
        "type": "worker",
        "node": "node1",
        "event": "step",
        "rank": 2,
        "local_rank": 0,
        "world_size": 4,
        "restart": 1,
        "pid": 99,
        "run_id": "demo-r1",
        "n": 3,
        "step": 103,
    }
    assert list(record)[:4] == ["t", "type", "node", "event"]


def test_the_api_is_a_no_op_outside_the_simulator(tmp_path, monkeypatch):
    for key in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SIM_EVENTS_DIR"):
        monkeypatch.delenv(key, raising=False)
    assert progress.report(5, loss=0.1) is None
    assert not progress.in_simulated_worker({**WORKER_ENV})  # a worker, but no side channel
    assert progress.in_simulated_worker({**WORKER_ENV, "SIM_EVENTS_DIR": str(tmp_path)})


# --- the probe's hooks, with fake optimizers -------------------------------------------------


class FakeOptimizer:
    def __init__(self, step=None):
        self.param = object()
        self.param_groups = [{"params": [self.param]}]
        self.state = {} if step is None else {self.param: {"step": step}}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def probe_writing_to(records: list, result=True):
    def write(event, **fields):
        records.append({"event": event, **fields})
        if isinstance(result, Exception):
            raise result
        return result

    probe = instrument.WorkerProbe(write)
    probe._clock = Clock()
    return probe


def test_steps_count_one_optimizer_and_are_rate_limited():
    records: list = []
    probe = probe_writing_to(records)
    first, second = FakeOptimizer(step=41), FakeOptimizer(step=7)
    for _ in range(3):
        first.state[first.param]["step"] += 1
        probe.on_step(first, (), {})
        probe.on_step(second, (), {})  # a second optimizer in the same loop: not counted again
        probe._clock.now += 0.01
    probe._clock.now += instrument.STEP_RECORD_GAP_S
    first.state[first.param]["step"] += 1
    probe.on_step(first, (), {})
    # The first step at once; then at most one record per gap.
    assert records == [{"event": "step", "n": 1, "step": 42}, {"event": "step", "n": 4, "step": 45}]
    probe.at_exit()
    assert records[-1] == {"event": "exit", "code": None}


def test_exit_writes_what_the_rate_limit_held_back():
    records: list = []
    probe = probe_writing_to(records)
    optimizer = FakeOptimizer()  # SGD-like: keeps no step
    for _ in range(5):
        probe.on_step(optimizer, (), {})
    for _ in range(3):
        probe.on_collective("all_reduce")
    probe.exit_code = 0
    probe.at_exit()
    assert records == [
        {"event": "step", "n": 1, "step": None},
        {"event": "activity", "collectives": 1, "op": "all_reduce"},
        {"event": "step", "n": 5, "step": None},
        {"event": "activity", "collectives": 3, "op": "all_reduce"},
        {"event": "exit", "code": 0},
    ]


def test_a_failing_write_turns_the_probe_off_quietly():
    records: list = []
    probe = probe_writing_to(records, result=OSError("disk full"))
    probe.on_step(FakeOptimizer(), (), {})  # must not raise
    assert probe.off
    probe.on_step(FakeOptimizer(), (), {})
    probe.on_collective("barrier")
    probe.at_exit()
    assert len(records) == 1


def test_an_import_hook_runs_after_the_module_and_then_leaves(tmp_path, monkeypatch):
    (tmp_path / "watched_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = instrument.AfterImport(
        {"watched_mod": lambda module: seen.append(module.VALUE + 1)}, on_error=lambda: seen.append("error")
    )
    hook.install()
    try:
        import watched_mod  # noqa: F401

        assert seen == [42]
        assert hook not in sys.meta_path  # nothing left to watch: no cost for later imports
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        sys.modules.pop("watched_mod", None)


# --- the real thing ----------------------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import subprocess, sys
    import torch
    import torch.distributed as dist
    import elastic_sim_progress

    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    model, head = torch.nn.Linear(4, 2), torch.nn.Linear(2, 1)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    sgd = torch.optim.SGD(head.parameters(), lr=0.01)
    for p in model.parameters():  # as if resumed from a checkpoint taken at step 100
        adam.state[p] = {"step": torch.tensor(100.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
    for i in range(30):
        loss = head(model(torch.randn(8, 4))).pow(2).mean()
        adam.zero_grad(); sgd.zero_grad(); loss.backward()
        adam.step(); sgd.step()
        dist.all_reduce(torch.ones(2))
    dist.all_gather_object([None], {"done": True})
    dist.barrier()
    elastic_sim_progress.report(130, loss=0.25)
    print("trained", dist.all_reduce.__name__, dist.all_reduce is dist.distributed_c10d.all_reduce)
    # A child inherits the environment but is not the worker.
    subprocess.run([sys.executable, "-c", sys.argv[2] + "print('child')"], check=True)
    dist.destroy_process_group()
    sys.exit(3)
""")


def run_as_worker(tmp_path: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    code = (
        WITH_NODE_SITE
        + f"import runpy, sys; sys.argv = {[str(path), *args]!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", instrument.OWNER_ENV)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**base, **WORKER_ENV, **env}
    )


def side_channel(events: Path) -> list[dict]:
    path = events / "node1.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_real_torch_loop_is_recorded_on_the_side_channel_only(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    result = run_as_worker(tmp_path, SCRIPT, str(tmp_path / "store"), WITH_NODE_SITE, SIM_EVENTS_DIR=str(events))
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stdout == "trained all_reduce True\nchild\n"  # the script's own output, nothing else
    assert "elastic_sim" not in result.stderr

    records = side_channel(events)
    assert {r["type"] for r in records} == {"worker"}
    assert {(r["node"], r["rank"], r["local_rank"], r["world_size"], r["restart"], r["run_id"]) for r in records} == {
        ("node1", 2, 0, 4, 1, "demo-r1")
    }
    assert len({r["pid"] for r in records}) == 1  # the child wrote nothing
    events_seen = [r["event"] for r in records]
    assert events_seen[0] == "start" and events_seen[-1] == "exit"
    assert records[-1]["code"] == 3

    steps = [r for r in records if r["event"] == "step"]
    assert steps[0]["n"] == 1 and steps[0]["step"] == 101  # the absolute step survives a resume
    assert steps[-1]["n"] == 30 and steps[-1]["step"] == 130  # Adam's steps only, not SGD's too
    assert all(r["step"] - r["n"] == 100 for r in steps)
    assert [r["t"] for r in records] == sorted(r["t"] for r in records)

    activity = [r for r in records if r["event"] == "activity"]
    assert activity[0]["collectives"] == 1 and activity[0]["op"] == "all_reduce"
    # 30 all_reduce, one all_gather_object (its inner all_gather is part of it), one barrier.
    assert activity[-1]["collectives"] == 32 and activity[-1]["op"] == "barrier"

    [api] = [r for r in records if r["event"] == "progress"]
    assert (api["step"], api["loss"], api["source"]) == (130, 0.25, "api")


COMPILED_STEP = textwrap.dedent("""
    import torch
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    step = torch.compile(optimizer.step, backend="eager")
    for _ in range(3):
        model(torch.randn(3, 4)).sum().backward()
        step()
    print("compiled")
""")


def test_a_compiled_optimizer_step_still_counts_and_nothing_is_printed(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    result = run_as_worker(tmp_path, COMPILED_STEP, SIM_EVENTS_DIR=str(events))
    assert (result.returncode, result.stdout) == (0, "compiled\n"), result.stderr[-3000:]
    # torch's own warnings may appear; none about the hook (e.g. "Dynamo does not know how to
    # trace the builtin `time.monotonic`").
    assert "elastic_sim" not in result.stderr and "monotonic" not in result.stderr, result.stderr
    assert [r["n"] for r in side_channel(events) if r["event"] == "step"][-1] == 3


def test_a_broken_side_channel_leaves_the_script_alone(tmp_path):
    script = "import sys\nprint('hello')\nsys.exit(0)\n"
    result = run_as_worker(tmp_path, script, SIM_EVENTS_DIR=str(tmp_path / "missing"))
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello\n", "")


def test_other_processes_pay_nothing(tmp_path):
    code = (
        WITH_NODE_SITE + "import sys; print(sorted(m for m in ('torch', 'elastic_sim_progress') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert (result.stdout, result.stderr) == ("[]\n", "")


@pytest.mark.parametrize("flag", ["1", "0"])
def test_sim_instrument_switches_the_hooks(tmp_path, flag):
    events = tmp_path / "events"
    events.mkdir()
    result = run_as_worker(tmp_path, "print('ok')\n", SIM_EVENTS_DIR=str(events), SIM_INSTRUMENT=flag)
    assert result.stdout == "ok\n"
    assert [r["event"] for r in side_channel(events)] == (["start", "exit"] if flag == "1" else [])


# torch.distributed.checkpoint's get_state_dict on a fresh optimizer runs one optimizer step with
# zero grads and lr 0 to create its state before a load: not a training step.
DCP_RESUME = textwrap.dedent("""
    import sys
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    path = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    steps = 5
    if sys.argv[2] == "resume":
        get_state_dict(model, optimizer)  # what a DCP resume does before dcp.load
        saved = torch.load(path)
        set_state_dict(model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optim"])
        steps = 3
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    model_state, optim_state = get_state_dict(model, optimizer)
    torch.save({"model": model_state, "optim": optim_state}, path)
""")


def test_the_state_init_step_of_a_dcp_resume_is_not_a_training_step(tmp_path):
    checkpoint = str(tmp_path / "state.pt")
    first, resumed = tmp_path / "first", tmp_path / "resumed"
    for events, mode in ((first, "fresh"), (resumed, "resume")):
        events.mkdir()
        result = run_as_worker(tmp_path, DCP_RESUME, checkpoint, mode, SIM_EVENTS_DIR=str(events))
        assert result.returncode == 0, result.stderr[-3000:]
    steps = [(r["n"], r["step"]) for r in side_channel(resumed) if r["event"] == "step"]
    # The resumed run's steps carry on from the checkpoint's 5: no step 1 from the state init.
    assert steps[0] == (1, 6) and steps[-1] == (3, 8), steps


def test_a_hung_worker_is_held_at_its_optimizer_step_too(tmp_path):
    """DDP's all-reduce runs in C++, past the Python wrappers: the step's end is where a DDP script is held."""
    records: list = []
    probe = probe_writing_to(records)
    probe._hang_file = str(tmp_path / f"hang-{probe.pid}")
    Path(probe._hang_file).touch()
    slept = []
    probe._sleep = lambda s: slept.append(s) if len(slept) < 2 else Path(probe._hang_file).unlink()
    probe.on_step(FakeOptimizer(step=1), (), {})
    assert len(slept) == 2 and not Path(probe._hang_file).exists()
    assert records[0]["event"] == "step"  # the step is recorded before the hold


def test_the_exit_step_counts_on_from_the_last_when_the_optimizer_is_gone():
    """A script whose optimizer is a local of main() has lost it by atexit: the exit's step record counts on
    from the last step read (else one null step turns every step of the run into per-process counts)."""
    import gc

    records: list = []
    probe = probe_writing_to(records)
    optimizer = FakeOptimizer(step=20)
    for _ in range(3):
        optimizer.state[optimizer.param]["step"] += 1
        probe.on_step(optimizer, (), {})
    del optimizer
    gc.collect()
    probe.at_exit()
    assert records[0] == {"event": "step", "n": 1, "step": 21}
    assert {"event": "step", "n": 3, "step": 23} in records
