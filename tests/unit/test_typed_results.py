"""The fault result and the run's spec are typed by the history's one parser: readers use fields, never dict keys.
A record's result has the fields every kind's has (node, id); its kind's typed result (FaultKind.read_result)
has that kind's own."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from sim.core.errors import FaultError
from sim.core.faultkinds import FAULT_KINDS, UNKNOWN, kind_of
from sim.core.faultkinds.container import NodeResult, ScaleResult
from sim.core.faultkinds.network import PartitionResult
from sim.core.faultkinds.process import HangWorkerResult
from sim.core.history import FaultResult, RecordedSpec, RunRecord, parse_record
from sim.core.spec import ClusterSpec
from sim.faults.catalog import FAULTS
from sim.verdict.runmodel import FaultEvent

ROOT = Path(__file__).resolve().parents[2]


def _ok(result: dict, fault: str = "partition") -> dict:
    return {"t": 5.0, "type": "fault", "op": "a1", "fault": fault, "phase": "ok", "result": result}


def _read(result: dict, fault: str = "partition"):
    """The result of a fault's ok record, as its kind's typed result."""
    return kind_of(fault).read_result(parse_record(_ok(result, fault)).result)


def test_a_fault_result_is_typed_and_its_line_is_kept_as_written():
    written = {
        "id": "partition-ab12",
        "partition": "node0 | node1",
        "cuts": [["node0"], ["node1"]],
        "rules": {"node0": ["-A ELASTIC_SIM_PARTITION -s 10.0.0.3 -j DROP"], "node1": []},
        "chain": "ELASTIC_SIM_PARTITION",
    }
    record = parse_record(_ok(written))
    result = kind_of("partition").read_result(record.result)
    assert isinstance(result, PartitionResult)
    assert result.id == "partition-ab12" and result.cuts == (("node0",), ("node1",))
    assert result.rules == {"node0": ("-A ELASTIC_SIM_PARTITION -s 10.0.0.3 -j DROP",), "node1": ()}
    assert result.extra == {"chain": "ELASTIC_SIM_PARTITION"}  # a key the schema does not name
    assert record.result.id == "partition-ab12" and "cuts" in record.result.extra  # the common fields only
    assert record.to_dict()["result"] == written and parse_record(record.to_dict()) == record
    assert result.to_dict() == written


def test_a_result_value_of_another_type_is_not_typed_and_the_record_still_counts():
    oom = _read({"node": "node1", "pid": "forty", "limit": 10**30}, "oom-worker")
    assert (oom.node, oom.pid, oom.limit) == ("node1", None, None)
    assert oom.extra == {"pid": "forty", "limit": 10**30}
    heal = _read({"healed": "x"}, "heal")
    assert heal.healed is None  # a string is not a tuple of ids: no id "x" healed by accident
    assert _read({"rules": {"node1": "-j DROP"}}).rules is None  # not half-typed


def test_a_file_gone_at_the_kill_differs_from_a_history_that_never_said():
    gone = _read({"pid": 4, "file": "/ckpt/a.tmp", "size_at_kill": None}, "kill-during-checkpoint")
    sized = _read({"pid": 4, "file": "/ckpt/a.tmp", "size_at_kill": 100}, "kill-during-checkpoint")
    older = _read({"pid": 4, "file": "/ckpt/a.tmp"}, "kill-during-checkpoint")
    assert (gone.gone_at_kill, sized.gone_at_kill, older.gone_at_kill) == (True, False, False)
    assert sized.size_at_kill == 100


def test_a_record_without_result_reads_as_an_empty_one():
    invoke = parse_record({**_ok({}), "phase": "invoke", "result": None})
    assert invoke.result is None and invoke.outcome == FaultResult() and invoke.node is None


def test_a_result_that_is_not_an_object_is_kept_unread_and_the_record_still_counts():
    record = parse_record(_ok("node1"))
    assert record.result is None and record.extra == {"result": "node1"} and record.node is None
    assert record.to_dict()["result"] == "node1"


def test_each_kind_reads_its_own_result_and_only_its_own_fields():
    """A fault's result is its kind's type: a scale's says who joined and left, a partition's its cuts; neither
    has the other's fields (no union of every verb's fields), and a kind this version does not know reads as
    the common fields, the rest kept."""
    scale = FaultEvent("a1", "scale", "nodes=3", 1.0, 2.0, {"joined": ["node2"], "left": [], "abrupt": False})
    assert isinstance(scale.result, ScaleResult) and (scale.result.joined, scale.result.left) == (("node2",), ())
    cut = FaultEvent("a2", "partition", "node0", 1.0, 2.0, {"id": "partition-1", "cuts": [["node0"]]})
    assert isinstance(cut.result, PartitionResult) and cut.result.cuts == (("node0",),)
    assert not hasattr(cut.result, "joined") and not hasattr(scale.result, "cuts")
    assert {f.name for f in dataclasses.fields(FaultResult)} == {"node", "id", "extra", "as_written"}
    newer = FaultEvent("a3", "a-kind-from-later", "node1", 1.0, 2.0, {"node": "node1", "what": 3})
    assert type(newer.result) is FaultResult and newer.result.node == "node1" and newer.result.extra == {"what": 3}


def test_every_kind_declares_its_typed_result():
    for kind in FAULT_KINDS:
        assert issubclass(kind.act.result_type, FaultResult), kind.name
        assert type(kind.read_result({"node": "node1"})) is kind.act.result_type, kind.name
    assert type(UNKNOWN.read_result({"node": "node1"})) is FaultResult


def test_a_result_built_by_its_writer_is_written_as_before_and_read_back():
    """Written: node and id where set, the kind's own fields always (None too), tuples as JSON lists."""
    assert NodeResult(node="node1").to_dict() == {"node": "node1"}
    scale = ScaleResult(joined=("node2",), left=(), abrupt=False)
    assert scale.to_dict() == {"joined": ["node2"], "left": [], "abrupt": False}
    hang = HangWorkerResult(id="hang-node1-7", node="node1", pid=7, rank=None, local_rank=0)
    assert hang.to_dict() == {"id": "hang-node1-7", "node": "node1", "pid": 7, "rank": None, "local_rank": 0}
    line = json.loads(json.dumps(hang.to_dict()))
    assert kind_of("hang-worker").read_result(line) == hang and kind_of("scale").read_result(scale.to_dict()) == scale


def test_a_saved_objects_content_is_typed():
    save = {"t": 2.0, "type": "worker", "event": "save", "path": "/ckpt/a.pt"}
    content = {"type": "dict", "keys": {"model": "OrderedDict"}, "model_state": True, "optimizer_state": False}
    record = parse_record({**save, "content": content})
    assert (record.content.model_state, record.content.optimizer_state, record.content.keys) == (
        True,
        False,
        {"model": "OrderedDict"},
    )
    assert record.to_dict()["content"] == content and parse_record({**save, "content": None}).content is None


def test_the_recorded_spec_names_only_cluster_spec_fields_and_reads_a_real_one():
    spec_fields = {f.name for f in dataclasses.fields(ClusterSpec)}
    typed = {f.name for f in dataclasses.fields(RecordedSpec)} - {"extra", "as_written"}
    assert typed <= spec_fields, typed - spec_fields
    spec = ClusterSpec(nodes=3, max_nodes=4, env=(("A", "1"),), rdzv_conf=(("keep_alive_interval", "2"),))
    start = parse_record({"t": 1.0, "type": "run", "event": "start", "spec": json.loads(spec.to_json())})
    assert isinstance(start, RunRecord)
    recorded = start.spec_fields
    assert (recorded.nodes, recorded.max_nodes, recorded.min_nodes, recorded.instrument) == (3, 4, 1, True)
    assert recorded.pairs == {"rdzv_conf": {"keep_alive_interval": "2"}, "env": {"A": "1"}}
    assert parse_record({"t": 1.0, "type": "run", "event": "start"}).spec_fields == RecordedSpec()


def test_an_out_of_range_spec_value_reads_as_unknown():
    start = parse_record({"t": 1.0, "type": "run", "event": "start", "spec": {"nodes": 10**30, "min_nodes": 2}})
    assert (start.spec_fields.nodes, start.spec_fields.min_nodes) == (None, 2)


def test_an_undo_without_a_fault_id_is_refused_not_a_heal_of_everything():
    class Nemesis:
        def carry_out(self, kind, options):  # pragma: no cover - must not be reached
            raise AssertionError(f"{kind.name}({options!r})")

    with pytest.raises(FaultError, match="no fault id to heal"):
        FAULTS["partition"].undo(Nemesis(), {"op": "x1"})


def test_no_reader_indexes_a_fault_result_or_the_spec_as_a_dict():
    """The parser (sim/core/history.py) is the one place a result or spec is a dict."""
    pattern = re.compile(r"(\.result|\.outcome|spec_fields|\.extra)\s*(\)|or \{\}\))?\s*(\.get\(|\[)")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("sim",)
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "history.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_a_kinds_result_read_from_an_empty_record_is_written_back_empty():
    assert kind_of("scale").read_result({}).to_dict() == {} and FaultResult().to_dict() == {}
