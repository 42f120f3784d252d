"""The fault kinds (sim/core/faultkinds.py) against the catalog and the nemesis: every fault is one datum, complete.

A new catalog entry, a new verb that records a new name, or a new in-force kind in the nemesis's fault
store without its FaultKind fails here, as does a reversibility or undo that disagrees between them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path
from types import NoneType

import pytest

from sim.core import faultkinds
from sim.core.faultkinds import (
    FAULT_KINDS,
    KINDS,
    LANES,
    STRIKES,
    UNDO_OPS,
    Action,
    ChaosMesh,
    ExecTask,
    FaultKind,
    Held,
    K8sForm,
    PodChaos,
    Struck,
    kind_of,
)
from sim.core.faultoptions import FaultOptions
from sim.export.k8s import POD_SCRIPTS
from sim.faults.catalog import FAULTS
from sim.verdict.runmodel import FaultEvent

# The nemesis and its verb modules.
NEMESIS = [
    Path(__file__).resolve().parents[2] / "sim" / "faults" / f"{name}.py"
    for name in ("nemesis", "processes", "containers", "disk", "network")
]


def _nemesis_calls() -> tuple[set[str], set[str]]:
    """The names the nemesis records (`self.invoke("NAME", ...)`) and the kinds its fault store lists
    (`{"fault": "KIND", ...}` records it remembers)."""
    recorded, in_force = set(), set()
    trees = [ast.parse(path.read_text()) for path in NEMESIS]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "invoke":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                recorded.add(first.value)
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "fault" and isinstance(value, ast.Constant):
                    in_force.add(value.value)
    return recorded, in_force


def test_every_name_the_nemesis_records_is_a_fault_kind_and_every_kind_is_recorded():
    recorded, _ = _nemesis_calls()
    acting = {kind.name for kind in FAULT_KINDS if kind.act is not None}  # Nemesis.carry_out records their names
    assert not recorded, f"a verb of its own, not a kind's act: {sorted(recorded)}"
    assert acting == set(KINDS)


def test_every_in_force_kind_of_the_fault_store_belongs_to_one_fault_kind():
    _, in_force = _nemesis_calls()
    declared = [kind.in_force for kind in FAULT_KINDS if kind.in_force is not None]
    assert sorted(declared) == sorted(set(declared)), "two kinds share an in-force kind"
    acting = {kind.in_force for kind in FAULT_KINDS if kind.act is not None and kind.in_force is not None}
    assert in_force | acting == set(declared)


@pytest.mark.parametrize("entry", FAULTS.values(), ids=lambda entry: entry.name)
def test_every_catalog_entry_records_a_known_kind_with_the_same_reversibility(entry):
    kind = entry.kind  # KeyError: the entry records a name with no FaultKind
    assert kind.reversible == entry.reversible, f"{entry.name} (kind {kind.name})"
    if entry.records:
        assert entry.records != entry.name, f"{entry.name}: records= only where the history's name differs"


def test_every_kind_is_reachable_from_the_catalog():
    assert {entry.kind.name for entry in FAULTS.values()} == set(KINDS)


def test_undo_operations_are_kinds_that_undo_and_every_reversible_kind_names_one():
    assert {kind.name for kind in FAULT_KINDS if kind.undoes} == set(UNDO_OPS)
    for kind in FAULT_KINDS:  # in force until undone: listed by `sim faults` exactly while it can be healed
        assert kind.reversible == (kind.in_force is not None), kind.name


def test_a_kind_refuses_traits_that_contradict_each_other():
    with pytest.raises(ValueError, match="needs its in-force kind"):
        FaultKind("x", undo_op="heal")
    with pytest.raises(ValueError, match="not one of"):
        FaultKind("x", undo_op="restart", in_force="x")
    with pytest.raises(ValueError, match="a node removed is a node silenced"):
        FaultKind("x", removes_node=True)
    with pytest.raises(ValueError, match="lives_in_node"):
        FaultKind("x", lives_in_node=True)


def test_an_unknown_name_has_no_traits():
    kind = kind_of("from-a-newer-version")
    assert not any(value for f in dataclasses.fields(kind) if (value := getattr(kind, f.name)) is True)


def _fault(name: str, result: dict, target: str = "node1") -> FaultEvent:
    return FaultEvent(op=f"op-{name}", fault=name, target=target, t_invoke=10.0, t_ok=10.5, result=result)


def test_a_skewed_clock_is_healed_by_its_id_in_the_run_model():
    """skew-clock is reversible: `sim heal skew-clock-node1` ends it (it was missing from the run model's own list
    of reversible faults, so its span ran to the end of the run)."""
    skew = _fault("skew-clock", {"id": "skew-clock-node1", "node": "node1", "by": 60, "seen": 60.0})
    heal = _fault("heal", {"healed": ["skew-clock-node1"]}, target="skew-clock-node1")
    assert skew.heal_id == "skew-clock-node1"
    assert heal.heals(skew)
    assert not _fault("heal", {"healed": ["link-node2"]}, target="link-node2").heals(skew)


def test_an_older_pause_record_without_an_id_is_named_by_its_node():
    pause = _fault("pause", {"node": "node2"}, target="node2")
    assert pause.heal_id == "pause-node2"
    assert _fault("kill-node", {"node": "node2"}).heal_id is None


# ---------------------------------------------------------------- every kind declares every part


@pytest.mark.parametrize("kind", FAULT_KINDS, ids=lambda kind: kind.name)
def test_every_kind_declares_every_part(kind):
    """A kind is one object in its family's module (sim/core/faultkinds/<family>.py): its traits, lane and
    in-force record, its provocations for `sim vet`, and how it is asked for and what it does (its act, or, for
    a kind not converted yet, its catalog entry and Nemesis verb). A kind that lacks a part fails here."""
    assert kind.lane in (None, *LANES)
    assert (kind.in_force is not None) == kind.reversible or kind.undoes
    entries = [entry for entry in FAULTS.values() if entry.kind is kind]
    assert entries, f"{kind.name}: no catalog entry asks for it"
    for name, provocation in kind.provocations.items():
        assert FAULTS[provocation.fault].kind is kind, f"{name}: provokes {provocation.fault}, not {kind.name}"
    act = kind.act
    assert act is not None, f"{kind.name}: declares no act (options, inject, undo, result, Kubernetes form)"
    assert (act.verb or act.entries) and act.help and act.example, kind.name
    # why a second one is refused, or its own rule (partitions add up, a link fault replaces the node's)
    assert act.already or act.refusal is not None or not kind.reversible, f"{kind.name}: says why a second is refused"
    assert issubclass(act.options, FaultOptions)
    # Its options name what it strikes, unless an entry fixes that, it strikes the cluster as a whole, or the
    # links its options cut (resolved among the cluster's nodes, named by their description).
    fields = {f.name for f in dataclasses.fields(act.options)}
    assert (
        "target" in fields or not act.verb or (act.strikes == "cluster" and act.target_of) or act.strikes == "links"
    ), kind.name
    assert act.strikes in STRIKES
    entry = FAULTS[act.name or kind.name] if act.verb else FAULTS[act.entries[0].name]
    assert entry.kind is kind and (entry.name == (act.name or kind.name) or not act.verb), kind.name
    options = entry.make_options(act.example)  # the example is valid options
    # what the executor resolved: a node and a worker of it, or the links a partition cuts
    cut = act.links(options, None, ("node0", "node1", "node2"), True) if act.links else None
    at = Struck("node1" if cut is None else cut.describe(), pid=41, rank=1, local_rank=1, file="/tmp/held")
    at = dataclasses.replace(at, cuts=frozenset() if cut is None else cut.cuts, id=kind.in_force_id_of(at))
    actions = act.inject(options, at)
    assert actions and all(isinstance(a, Action.__args__) for a in actions), kind.name
    detail = act.detail(options, at)  # None: its in-force record holds no detail (a partition's target says it)
    assert detail is None or (isinstance(detail, str) and detail), kind.name
    assert cut is None or cut.cuts, f"{kind.name}: its example cuts nothing"
    recorded = at.node if cut is not None else act.recorded_target(options, entry.fixed_target)
    assert recorded and isinstance(act.recorded_args(options), dict)
    assert (act.undo is not None) == kind.reversible
    if act.undo is not None:
        assert act.undo(at) and all(isinstance(a, Action.__args__) for a in act.undo(at))
        refusal = act.refused(at, kind.in_force_id_of(at))
        assert refusal is None or refusal.startswith(f"{at.node}: "), kind.name
    for other in act.entries:  # another entry of it, aimed at its fixed target: asked for with no target
        assert FAULTS[other.name].kind is kind and "target" not in FAULTS[other.name].option_names
        assert isinstance(act.k8s(FAULTS[other.name].make_options({}), other.target), (*K8sForm.__args__, NoneType))
    form = act.k8s(options, entry.fixed_target or getattr(options, "target", None))
    assert form is None or isinstance(form, K8sForm.__args__), kind.name
    if isinstance(form, ChaosMesh):
        assert form.kind.endswith("Chaos") and form.note, kind.name
    if isinstance(form, PodChaos):
        assert form.note, kind.name
    for task in (form.start, form.end) if isinstance(form, Held) else (form,) if isinstance(form, ExecTask) else ():
        assert task.script in POD_SCRIPTS, f"{kind.name}: no pod script {task.script!r} in sim/export/k8s.py"


def test_every_kind_is_declared_by_one_family_module_only():
    """A family module declares KINDS; the package collects them (a new kind is a new module, picked up)."""
    modules = [m.name for m in pkgutil.iter_modules(faultkinds.__path__) if m.name != "base"]
    declared = [k.name for m in modules for k in importlib.import_module(f"sim.core.faultkinds.{m}").KINDS]
    assert sorted(declared) == sorted(KINDS)


# Where the kinds not converted yet are still named (their verbs, entries, undo branches and exports).
_NAMING = [
    Path(__file__).resolve().parents[2] / "sim" / path
    for path in (
        "faults/catalog.py",
        "faults/heal.py",
        "faults/nemesis.py",
        "faults/processes.py",
        "faults/containers.py",
        "faults/disk.py",
        "faults/network.py",
        "export/k8s.py",
    )
]


def _string_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}


@pytest.mark.parametrize("kind", [k for k in FAULT_KINDS if k.act is not None], ids=lambda kind: kind.name)
def test_a_kind_with_its_own_act_is_named_only_in_its_own_module(kind):
    """A converted kind is one module: the catalog, heal, the nemesis and the Kubernetes export read it (its act,
    its traits), so no string there names it or its in-force kind (a string branch left behind fails here)."""
    names = {kind.name, *([kind.in_force] if kind.in_force else [])}
    for path in _NAMING:
        named = names & _string_literals(path)
        assert not named, f"{path.relative_to(path.parents[2])} names {sorted(named)}"


def test_an_older_in_force_name_stands_for_one_kind_and_is_no_name_in_force_now():
    """in_force_was (issue 38: "skew" and "slow" became skew-clock and slow-node): each older name reads as
    exactly one kind's in-force name, and none is a name some kind uses now (it would read as two)."""
    from sim.core.faultkinds import in_force_name

    now = {kind.in_force for kind in FAULT_KINDS if kind.in_force is not None}
    older = [old for kind in FAULT_KINDS for old in kind.in_force_was]
    assert len(older) == len(set(older)) and not set(older) & now
    assert (in_force_name("skew"), in_force_name("slow"), in_force_name("pause")) == (
        "skew-clock",
        "slow-node",
        "pause",
    )
    for kind in FAULT_KINDS:
        assert kind.in_force in (None, kind.name) or not kind.in_force_was, kind.name
