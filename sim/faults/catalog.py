"""The fault catalog: every kind of fault, once.

An entry names the fault as a scenario step does, and carries its options (a frozen dataclass
that validates itself; each field declares how it is read and what it holds), its CLI verb, how
to invoke it on a Nemesis and, for a reversible fault, how to undo it. The scenario parser
(sim.scenarios.scenario), the runner's dispatch (sim.scenarios.runner) and the CLI verbs (sim.cli.faults) are all
generated from FAULTS. Every kind declares its act (sim/core/faultkinds), its entries are generated (`_acting`,
`_aimed`), so a new kind is its module only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.core.errors import FaultError, UsageError
from sim.core.faultkinds import (
    FAULT_KINDS,
    KINDS,
    PROVOCATIONS,
    FaultKind,
    checkpoint,
    container,
    disk,
    etcd,
    network,
    process,
)
from sim.core.faultoptions import FaultOptions
from sim.core.history import FaultResult

if TYPE_CHECKING:
    from sim.faults.nemesis import Nemesis


# ---------------------------------------------------------------- the catalog


@dataclass(frozen=True)
class FaultEntry:
    """One entry of the fault catalog: how a person or a scenario asks for a kind of fault (what the kind
    is, its traits and undo, is its sim.core.faultkinds.FaultKind). `invoke(nemesis, options)` injects it
    and returns the nemesis' result; `undo(nemesis, result)` reverses it (reversible faults only)."""

    name: str  # as a scenario step names it
    options: type[FaultOptions]
    verb: tuple[str, ...]  # on the CLI: ("kill",) is `sim kill`, ("etcd", "kill") is `sim etcd kill`
    help: str  # one line
    invoke: Callable[[Nemesis, Any], dict]
    undo: Callable[[Nemesis, dict], dict] | None = None
    undo_verb: str = ""  # reversible: the CLI verb that undoes it by hand, e.g. "heal"
    needs_etcd: bool = False
    needs_running: bool = True  # False: it brings a stopped container back
    # Builds what it would act on among a cluster's nodes without acting, so a bad shape fails early.
    check_nodes: Callable[[Any, Sequence[str], bool], object] | None = None
    # The kind of fault it is, as the history records it (sim.core.faultkinds), when not its own name:
    # etcd-kill is kill-node aimed at etcd, netem the kind link.
    records: str = ""
    fixed_target: str | None = None  # an entry aimed at one target whatever its options (etcd-kill: etcd)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z]+(-[a-z]+)*", self.name):
            raise ValueError(f"fault name {self.name!r}: use lowercase words joined by '-', e.g. kill-node")
        if not self.verb or not issubclass(self.options, FaultOptions):
            raise ValueError(f"fault {self.name}: needs a CLI verb and FaultOptions")
        if bool(self.undo) != bool(self.undo_verb):
            raise ValueError(f"fault {self.name}: a reversible fault names the verb that undoes it by hand")

    @property
    def reversible(self) -> bool:
        return self.undo is not None

    @property
    def kind(self) -> FaultKind:
        """What it is, read by the verdict layer from the history: its traits and its undo."""
        return KINDS[self.records or self.name]

    def end_hold(self, nemesis: Nemesis, result: dict) -> dict:
        """Undo the fault `result` came from when its hold (`--for`, a step's `for`) ends; nothing to undo when
        it is no longer in force: healed by hand, or ended with its node (killed, restarted, scaled away)."""
        fault_id = FaultResult.parse(result).id
        if fault_id is not None and all(f.id != fault_id for f in nemesis.active()):
            return {"id": fault_id, "ended": "no longer in force"}
        return self.undo(nemesis, result)

    @property
    def fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.options)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.default is dataclasses.MISSING)

    def make_options(self, given: Mapping[str, Any]) -> FaultOptions:
        """Its options from those given (by name), defaults for the rest; errors name the fault."""
        unknown = sorted(set(given) - set(self.option_names))
        if unknown:
            raise UsageError(
                f"{self.name}: takes no {', '.join(unknown)}; its options: {', '.join(self.option_names) or 'none'}"
            )
        missing = [name for name in self.required if name not in given]
        if missing:
            raise UsageError(f"{self.name}: needs {', '.join(missing)}")
        try:
            return self.options(**given)
        except UsageError as error:
            raise UsageError(f"{self.name}: {error}") from None


def _fault_id(result: dict) -> str:
    fault_id = FaultResult.parse(result).id
    if fault_id is None:  # never heal(None): that heals every fault in force
        raise FaultError(f"{result}: no fault id to heal; `sim faults` lists those in force")
    return fault_id


def _undo_of(kind: FaultKind, target: str | None = None) -> Callable[[Nemesis, dict], dict] | None:
    """How the runner ends a reversible kind's hold: carry out its undo kind on its id (heal ID), or on its
    node (unpause NODE; an entry's fixed `target`)."""
    if not kind.reversible:
        return None
    undo = KINDS[kind.undo_op]
    if undo.undoes_by_id:

        def by_id(n: Nemesis, result: dict) -> dict:
            fault_id = _fault_id(result)  # before anything is asked of the nemesis
            return n.carry_out(undo, undo.act.options(id=fault_id))

        return by_id
    return lambda n, result: n.carry_out(undo, undo.act.options(target=target or FaultResult.parse(result).node))


def _acting(kind: FaultKind) -> FaultEntry:
    """The catalog entry of a kind that declares its own act (sim/core/faultkinds): the nemesis carries it out."""
    act = kind.act
    return FaultEntry(
        act.name or kind.name,
        act.options,
        act.verb,
        act.help,
        lambda n, o: n.carry_out(kind, o),
        undo=_undo_of(kind),
        undo_verb=kind.undo_op or "",
        needs_running=act.needs_running,
        # A kind that cuts links: its shape among a cluster's nodes built without acting, so a bad one fails early.
        check_nodes=None
        if act.links is None
        else lambda o, nodes, has_etcd: act.links(o, None, tuple(nodes), has_etcd),
        records=kind.name if act.name else "",
    )


def _aimed(kind: FaultKind, name: str) -> FaultEntry:
    """Another entry of a kind that declares its own act, aimed at its fixed target (etcd-kill: kill-node at etcd)."""
    (entry,) = (e for e in kind.act.entries if e.name == name)
    return FaultEntry(
        entry.name,
        entry.options,
        entry.verb,
        entry.help,
        lambda n, o: n.carry_out(kind, o, target=entry.target),
        undo=_undo_of(kind, entry.target),
        undo_verb=entry.undo_verb or kind.undo_op or "",
        needs_etcd=entry.needs_etcd,
        needs_running=kind.act.needs_running,
        records=kind.name,
        fixed_target=entry.target,
    )


_CATALOG = (
    _acting(process.KILL_WORKER),
    _acting(process.KILL_AGENT),
    _acting(container.KILL_NODE),
    _acting(container.STOP_NODE),
    _acting(container.RESTART_NODE),
    _acting(container.START_NODE),
    _acting(container.PAUSE),
    _acting(container.UNPAUSE),
    _acting(network.PARTITION),
    _acting(network.HEAL),
    _acting(network.LINK),
    _aimed(container.KILL_NODE, "etcd-kill"),
    _aimed(container.START_NODE, "etcd-start"),
    _aimed(container.RESTART_NODE, "etcd-restart"),
    _aimed(etcd.WIPE_ETCD, "etcd-wipe"),
    _aimed(container.PAUSE, "etcd-pause"),
    _aimed(container.UNPAUSE, "etcd-unpause"),
    _aimed(network.PARTITION, "etcd-isolate"),
    _acting(process.HANG_WORKER),
    _acting(process.HANG_COLLECTIVES),
    _acting(process.RESUME_WORKER),
    _acting(container.SLOW_NODE),
    _acting(process.OOM_WORKER),
    _acting(checkpoint.CORRUPT_CHECKPOINT),
    _acting(disk.FILL_DISK),
    _acting(checkpoint.KILL_DURING_CHECKPOINT),
    _acting(checkpoint.FREEZE_DURING_CHECKPOINT),
    _acting(container.SCALE),
)


# The kinds the catalog does not place (a new kind goes last).
_PLACED = {entry.name for entry in _CATALOG}
FAULTS: dict[str, FaultEntry] = {
    fault.name: fault
    for fault in (
        *_CATALOG,
        *(
            _acting(k)
            for k in FAULT_KINDS
            if k.act is not None and k.act.verb and (k.act.name or k.name) not in _PLACED
        ),
        *(_aimed(k, e.name) for k in FAULT_KINDS if k.act is not None for e in k.act.entries if e.name not in _PLACED),
    )
}


# ---------------------------------------------------------------- what `sim vet` does with each kind

# Each kind's provocations (sim.core.faultkinds), by the name `sim vet --faults` takes, name catalog entries.
for _name, _provocation in PROVOCATIONS.items():
    if _provocation.fault not in FAULTS:
        raise ValueError(f"provocation {_name!r}: no fault {_provocation.fault!r} in the catalog")
