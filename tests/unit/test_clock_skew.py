"""The skew-clock fault without Docker: its options, the nemesis' calls (fake provider), the script it
runs in a node, and the node image's clock module that keeps the history on the kernel's clock."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import doctor
from sim.core.errors import UnsupportedFaultError, UsageError
from sim.core.faultkinds.clock import CLOCK_NOT_PRELOADED, CLOCK_OFFSET_FILE, CLOCK_SCRIPT
from sim.core.faultoptions import parse_offset
from sim.engines.docker import ExecResult
from sim.engines.render import CLOCK_ENV, FAKETIME_LIB
from sim.faults.catalog import FAULTS
from sim.scenarios.scenario import parse_scenario
from sim.verdict.diagnoses.registry import diagnose
from tests.unit.test_nemesis import FakeProvider, nemesis, state_home  # noqa: F401 (fixtures)

NODE_SITE = Path(__file__).resolve().parents[2] / "images" / "node"
# A process that believes libfaketime is preloaded (the library itself is not on this machine:
# ld.so names the missing object on stderr and runs on with the real clock).
PRELOADED = {"LD_PRELOAD": "/nonexistent/libfaketime.so.1", "PYTHONPATH": str(NODE_SITE)}


@pytest.mark.parametrize(
    ("text", "seconds"), [("60s", 60), ("+5s", 5), ("-10m", -600), ("1m30s", 90), ("-2.5", -2.5), ("2h", 7200)]
)
def test_offsets_take_a_sign_and_a_unit(text, seconds):
    assert parse_offset(text) == seconds
    assert FAULTS["skew-clock"].make_options({"target": "node1", "by": seconds}).by == seconds


@pytest.mark.parametrize(
    ("text", "why"),
    [("1x", "not an offset; use e.g. 60s, +5s, -10m"), ("--5s", "not an offset"), ("-", "not an offset"),
     ("0s", "no skew"), ("-0", "no skew"), ("9000h", "more than a year")],
)  # fmt: skip
def test_a_bad_offset_is_one_line_naming_it(text, why):
    with pytest.raises(UsageError, match=re.escape(f"offset '{text}': {why}")):
        parse_offset(text)


def test_skew_clock_is_a_reversible_node_fault_in_scenarios():
    text = "name: s\ndescription: d\nsteps:\n  - fault: skew-clock\n    target: node1\n    by: -10m\n"
    text += "    at: {step: 5}\n    duration: 20s\nexpect: {outcome: recovers}\n"
    (step,) = parse_scenario(text, "s.yaml").steps
    assert (step.fault, step.options.by, step.options.target) == ("skew-clock", -600, "node1")
    with pytest.raises(UsageError, match="s.yaml:6: .*offset '0': no skew"):
        parse_scenario(text.replace("by: -10m", "by: 0"), "s.yaml")
    with pytest.raises(UsageError, match="skew-clock: needs by"):
        FAULTS["skew-clock"].make_options({"target": "node1"})


def _skew(nem, target: str, *, by: float) -> dict:
    """skew-clock as `sim skew-clock` and a scenario step inject it: its catalog entry, carried out by the nemesis."""
    entry = FAULTS["skew-clock"]
    return entry.invoke(nem, entry.make_options({"target": target, "by": by}))


def test_skew_clock_writes_the_offset_records_what_the_node_saw_and_heal_sets_it_back(nemesis):  # noqa: F811
    nem, fake = nemesis
    fake.answers = {CLOCK_SCRIPT: ExecResult(0, "59.99982\n", "")}
    result = _skew(nem, "node1", by=60)
    assert (result["id"], result["node"], result["by"], result["seen"]) == ("skew-clock-node1", "node1", 60, 60.0)
    wrote = [c[2] for c in fake.calls if c[0] == "exec" and CLOCK_SCRIPT in c[2]]
    assert wrote == [["sh", "-c", CLOCK_SCRIPT, "sh", "+60.000", CLOCK_OFFSET_FILE]]
    with pytest.raises(UsageError, match="node1: its clock is skewed already; `sim heal skew-clock-node1` first"):
        _skew(nem, "node1", by=5)
    fake.answers = {CLOCK_SCRIPT: ExecResult(0, "0.0001\n", "")}
    nem.heal("skew-clock-node1")
    wrote = [c[2] for c in fake.calls if c[0] == "exec" and CLOCK_SCRIPT in c[2]]
    assert wrote[-1][4] == "+0.000" and nem.active() == []
    faults = [r for r in nem.history.records() if r.TYPE == "fault"]
    assert [(r.fault, r.phase) for r in faults][:2] == [("skew-clock", "invoke"), ("skew-clock", "ok")]
    assert faults[0].args == {"by": 60}


def test_a_node_without_libfaketime_is_one_clear_line(nemesis):  # noqa: F811
    nem, fake = nemesis
    fake.answers = {CLOCK_SCRIPT: ExecResult(CLOCK_NOT_PRELOADED, "", "")}
    with pytest.raises(UnsupportedFaultError, match="node2: no libfaketime in its processes .*`sim up` again"):
        _skew(nem, "node2", by=-600)
    assert [r.phase for r in nem.history.records()] == ["invoke", "fail"] and nem.active() == []


def test_the_nodes_environment_preloads_libfaketime_and_leaves_the_monotonic_clock():
    assert CLOCK_ENV["LD_PRELOAD"] == FAKETIME_LIB and CLOCK_ENV["FAKETIME_TIMESTAMP_FILE"] == CLOCK_OFFSET_FILE
    assert CLOCK_ENV["FAKETIME_DONT_FAKE_MONOTONIC"] == "1" and CLOCK_ENV["FAKETIME_FORCE_MONOTONIC_FIX"] == "0"
    dockerfile = (NODE_SITE / "Dockerfile").read_text()
    assert FAKETIME_LIB in dockerfile and CLOCK_OFFSET_FILE in dockerfile


def _run(code: str, env: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | env
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, cwd=tmp_path, timeout=60
    )


def test_the_clock_script_writes_the_offset_file_and_refuses_a_node_without_the_preload(tmp_path):
    offset_file = tmp_path / "clock-offset"
    code = f"import subprocess, sys; sys.exit(subprocess.run(['sh', '-c', {CLOCK_SCRIPT!r}, 'sh', '+60.000', "
    code += f"{str(offset_file)!r}]).returncode)"
    assert _run(code, {"PYTHONPATH": str(NODE_SITE)}, tmp_path).returncode == CLOCK_NOT_PRELOADED
    assert not offset_file.exists()
    done = _run(code, PRELOADED, tmp_path)
    assert done.returncode == 0, done.stderr
    assert offset_file.read_text() == "+60.000\n"


def test_records_keep_the_kernels_clock_when_the_nodes_clock_is_skewed(tmp_path):
    """Under libfaketime, time.time() is the skewed clock: the side channel's records (and the
    shipped trainer's lines) take their time from elastic_sim_clock.wall_clock, the kernel's."""
    events = tmp_path / "events"
    events.mkdir()
    code = (
        "import time\n"
        "real = time.time\n"
        "time.time = lambda: real() + 600  # the skewed clock libfaketime gives the node's programs\n"
        "import elastic_sim_progress\n"
        "assert elastic_sim_progress.write_record('progress', step=3)\n"
        "print(real())\n"
    )
    env = {**PRELOADED, "SIM_EVENTS_DIR": str(events), "SIM_NODE": "node1", "LOCAL_RANK": "0"}
    done = _run(code, env, tmp_path)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in (events / "node1.jsonl").read_text().splitlines()]
    assert abs(record["t"] - float(done.stdout)) < 5


def test_time_sleep_is_mended_only_where_libfaketime_is_preloaded(tmp_path):
    code = (
        "import time, elastic_sim_clock\n"
        "began = time.monotonic(); time.sleep(0.05); slept = time.monotonic() - began\n"
        "try:\n    time.sleep(-1)\nexcept ValueError:\n    refused = True\n"
        "print(elastic_sim_clock.preloaded(), time.sleep.__name__, slept >= 0.05, refused)\n"
    )
    assert _run(code, PRELOADED, tmp_path).stdout.split() == ["True", "sleep_on_select", "True", "True"]
    plain = _run(code, {"PYTHONPATH": str(NODE_SITE)}, tmp_path)
    assert plain.stdout.split() == ["False", "sleep", "True", "True"]


def _skewed_run(by: float, nodes_seen: dict[str, int]) -> list[dict]:
    """A run as its history says it (the shape of a real etcd-v2 run of clock-skew-60s): node1's clock
    skewed, a worker killed on node2, and round 1 as each agent counted it."""
    spec = {"nodes": 3, "rdzv_conf": [["keep_alive_interval", "5"], ["keep_alive_max_attempt", "3"]]}
    records = [{"t": 0.0, "type": "run", "event": "start", "cluster": "c", "run_id": "r", "spec": spec, "schema": 1}]
    records += [
        {"t": 10.0, "type": "fault", "op": "a", "fault": "skew-clock", "target": "node1", "phase": "ok",
         "result": {"id": "skew-clock-node1", "node": "node1", "by": by, "seen": by}},
        {"t": 20.0, "type": "fault", "op": "b", "fault": "kill-worker", "target": "node2", "phase": "ok",
         "result": {"node": "node2", "pid": 9, "rank": 2, "local_rank": 0, "signal": "SIGKILL"}},
    ]  # fmt: skip
    for index, (node, seen) in enumerate(nodes_seen.items()):
        records.append(
            {"t": 24.0 + index / 10, "type": "agent", "event": "rdzv_joined", "node": node, "round": 1,
             "group_rank": index, "nodes": seen}
        )  # fmt: skip
        records.append({"t": 50.0 + index / 10, "type": "agent", "event": "group_finished", "node": node})
    return records


def test_the_clock_skew_diagnosis_names_the_skewed_node_and_the_worlds_the_agents_counted():
    (found,) = diagnose(_skewed_run(60, {"node0": 3, "node1": 1, "node2": 3}), {})
    assert found.code == "clock-skew" and found.title.startswith("node1's clock was 60 s ahead of the others'")
    assert "node1, ahead, saw every peer's heartbeat as 60 s old" in found.cause and "(15 s here)" in found.cause
    assert "(node0: 3, node1: 1, node2: 3)" in found.cause and "300 s timeout" in found.cause
    assert any("joined round 1 as rank 1 in a world of 1" in line for line in found.evidence)
    (behind,) = diagnose(_skewed_run(-600, {"node0": 2, "node1": 3, "node2": 2}), {})
    assert "600 s behind" in behind.title and "The others saw node1's heartbeats as 600 s old" in behind.cause


def test_no_clock_skew_diagnosis_inside_the_keep_alive_window_or_when_the_agents_agree():
    assert diagnose(_skewed_run(5, {"node0": 3, "node1": 1, "node2": 3}), {}) == []
    assert diagnose(_skewed_run(60, {"node0": 3, "node1": 3, "node2": 3}), {}) == []


class _Images:
    def __init__(self, built: bool, has_faketime: bool = True):
        self.built, self.has_faketime = built, has_faketime
        self.docker_bin = "docker"

    def image_exists(self, tag: str) -> bool:
        return self.built

    def run_image(self, image, entrypoint, args, timeout=120):
        from sim.engines.docker import Completed

        found = self.has_faketime and list(args) == ["-e", FAKETIME_LIB]
        return Completed(("docker", "run"), 0 if found else 1, "", "")


def test_doctor_says_whether_the_node_image_has_libfaketime():
    check = doctor.faketime_check(_Images(built=True))
    assert (check.ok, check.detail, check.required) == (True, FAKETIME_LIB, False)
    check = doctor.faketime_check(_Images(built=True, has_faketime=False))
    assert not check.ok and check.detail == f"{FAKETIME_LIB} missing (exit 1)" and "sim build" in check.fix
    assert "not built yet" in doctor.faketime_check(_Images(built=False)).detail


def test_the_clock_skew_diagnosis_names_a_split_brain_when_the_skewed_node_trains_alone():
    records = _skewed_run(60, {"node0": 2, "node2": 2})
    records.append({"t": 40.0, "type": "agent", "event": "rdzv_joined", "node": "node1", "round": 2, "group_rank": 0,
                    "nodes": 1})  # fmt: skip
    (found,) = diagnose(records, {})
    assert "node1 then made a round of its own (round 2, a world of 1): two groups trained at once" in found.cause
    assert found.evidence[-1].endswith("joined round 2 as rank 0 in a world of 1")
