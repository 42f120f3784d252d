"""slow-disk without Docker: its options, the nemesis's calls (fake provider), heal, its Chaos Mesh form and its
provocation. tests/integration/test_slow_disk.py shows a real save slowed by it."""

from __future__ import annotations

import pytest

from sim.core.errors import UsageError
from sim.core.faultkinds import PROVOCATIONS, LimitWrites
from sim.export.k8s import export_scenario
from sim.faults.catalog import FAULTS
from sim.faults.heal import Undo, plan_heal
from sim.scenarios.scenario import parse_scenario
from sim.vet.gauntlet import parse_faults
from tests.unit.test_nemesis import FakeProvider, nemesis, state_home  # noqa: F401 (fixtures)


def _slow_disk(nem, target: str, rate: int) -> dict:
    entry = FAULTS["slow-disk"]
    return entry.invoke(nem, entry.make_options({"target": target, "write_rate": rate}))


def test_slow_disk_limits_the_nodes_checkpoint_writes_until_healed(nemesis):  # noqa: F811
    nem, fake = nemesis
    result = _slow_disk(nem, "node1", 2**20)
    assert result["id"] == "slow-disk-node1" and result["write_rate"] == 2**20 and result["dir"] == "/ckpt"
    assert [c for c in fake.calls if c[0] == "limit_writes"] == [("limit_writes", "id-node1", "/ckpt", 2**20)]
    assert [(f.id, f.fault, f.detail) for f in nem.active()] == [
        ("slow-disk-node1", "slow-disk", "writes to /ckpt at 1048576 bytes/s")
    ]
    with pytest.raises(
        UsageError, match="node1: its checkpoint writes are throttled already; `sim heal slow-disk-node1`"
    ):
        _slow_disk(nem, "node1", 2**10)
    nem.heal("slow-disk-node1")
    assert [c for c in fake.calls if c[0] == "limit_writes"][-1] == ("limit_writes", "id-node1", "/ckpt", 0)
    assert nem.active() == []
    faults = [r for r in nem.history.records() if r.TYPE == "fault"]
    assert [(r.fault, r.phase) for r in faults][:2] == [("slow-disk", "invoke"), ("slow-disk", "ok")]
    assert faults[0].args == {"write_rate": 2**20}


def test_a_stopped_node_took_its_limit_along():
    from sim.faults.inforce import InForce

    fault = InForce(id="slow-disk-node1", fault="slow-disk", target="node1")
    assert plan_heal([fault], {"node1": "exited"}).steps == (
        Undo("slow-disk-node1", (), "nothing left to undo: node1 is exited"),
    )
    assert plan_heal([fault], {"node1": "running"}).steps[0].actions == (LimitWrites("node1", "/ckpt", 0),)


def test_its_options_in_a_scenario_and_on_the_command_line():
    text = "name: s\ndescription: d\nsteps:\n  - fault: slow-disk\n    target: node1\n    write_rate: 512k\n"
    text += "    at: {step: 5}\n    duration: 20s\nexpect: {outcome: recovers}\n"
    (step,) = parse_scenario(text, "s.yaml").steps
    assert (step.fault, step.options.write_rate, step.duration_s) == ("slow-disk", 512 * 1024, 20.0)
    with pytest.raises(UsageError, match="slow-disk: write_rate 0: no throttle; give bytes a second"):
        FAULTS["slow-disk"].make_options({"target": "node1", "write_rate": 0})
    with pytest.raises(UsageError, match="slow-disk: needs write_rate"):
        FAULTS["slow-disk"].make_options({"target": "node1"})


def test_it_exports_as_io_latency_and_is_vetted_when_named():
    text = "name: s\ndescription: d\nsteps:\n  - fault: slow-disk\n    target: node1\n    write_rate: 1m\n"
    text += "    at: {after: 1s}\n    duration: 10s\nexpect: {outcome: recovers}\n"
    export = export_scenario(parse_scenario(text, "s.yaml"))
    workflow = next(o for o in export.objects() if o["kind"] == "Workflow")
    (io,) = [t["ioChaos"] for t in workflow["spec"]["templates"] if "ioChaos" in t]
    assert io["action"] == "latency" and io["volumePath"] == "/ckpt" and io["methods"] == ["write", "fsync"]
    assert any("IOChaos latency" in note for note in export.notes)
    assert parse_faults("slow-disk", quick=False) == ("slow-disk",)
    assert not PROVOCATIONS["slow-disk"].default  # not in the whole gauntlet: `sim vet --faults slow-disk`
