"""The scenario runner's pure parts: trigger state from a growing history, and the
mapping from every fault the format accepts to a nemesis call."""

from __future__ import annotations

import json
import signal


from chaos.runner import HistoryState, fault_call
from chaos.scenario import FAULTS, Step, Trigger
from sim.history import History


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


class RecordingNemesis:
    """Stands in for chaos.nemesis.Nemesis: records which method a step calls."""

    def __init__(self):
        self.calls = []
        self.cluster = self

    def nodes(self):
        return [type("Info", (), {"node": n})() for n in ("node0", "node1", "node2")]

    def containers(self):
        return self.nodes()

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return {"id": "x", "node": "node1"}
        return call


def test_every_fault_of_the_format_maps_to_a_nemesis_call():
    options = {"partition": {"isolate": ("node1",)}, "scale": {"nodes": 2}, "heal": {"all": True}}
    for fault in FAULTS:
        nemesis = RecordingNemesis()
        base = {"target": "node1"} if "target" in FAULTS[fault].options else {}
        step = Step(fault=fault, options={**base, **options.get(fault, {})},
                    trigger=Trigger("step", 1), duration_s=None, repeat_times=1, repeat_every_s=None, line=1)
        action, _ = fault_call(nemesis, step, "etcd-v2")
        action()
        assert nemesis.calls, fault


def test_kill_worker_step_passes_its_signal():
    nemesis = RecordingNemesis()
    step = Step(fault="kill-worker", options={"target": "random", "signal": signal.SIGTERM}, trigger=Trigger("step", 1),
                duration_s=None, repeat_times=1, repeat_every_s=None, line=3)
    fault_call(nemesis, step, "etcd-v2")[0]()
    assert nemesis.calls == [("kill_worker", ("random",), {"rank": None, "local_rank": None, "sig": signal.SIGTERM})]


def test_reversible_steps_have_an_undo():
    nemesis = RecordingNemesis()
    step = Step(fault="pause", options={"target": "node1"}, trigger=Trigger("step", 1), duration_s=2.0,
                repeat_times=1, repeat_every_s=None, line=3)
    action, undo = fault_call(nemesis, step, "etcd-v2")
    undo(action())
    assert [c[0] for c in nemesis.calls] == ["pause", "unpause"]
