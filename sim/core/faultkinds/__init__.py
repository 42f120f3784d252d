"""Every fault kind, once: one object per kind, a module per family (process, container, network, disk,
checkpoint, clock, etcd, ...). A family module declares `KINDS`; this package collects them, so a new kind is
one new module (or one more object in its family's). The run model, checkers, recovery, timeline, diagnoses,
the nemesis and `sim vet` read the traits here, never a list of names of their own.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from .base import (
    ACT_MARKER,
    ENDS,
    LANES,
    NODE_EFFECTS,
    STRIKES,
    UNDO_OPS,
    Act,
    Action,
    ApplyPartitions,
    CatchWriter,
    ChaosMesh,
    ClearLink,
    ContinueWorker,
    CutFromJob,
    EndedWithNode,
    EndsHold,
    Entry,
    ExecTask,
    ExhaustMemory,
    FaultKind,
    FindIface,
    ForgetInForce,
    HealFaults,
    Held,
    K8sForm,
    KillContainer,
    LimitCpu,
    LimitWrites,
    LinkChaos,
    NetworkBack,
    NodeShell,
    NoOptions,
    Partitioned,
    PauseContainer,
    PodChaos,
    PodDown,
    Provocation,
    ReadCpuLimits,
    RemoveFile,
    RequireCkptStorage,
    RestartContainer,
    RunNodeScript,
    ScaleJob,
    ScaleNodes,
    ShapeLink,
    Signal,
    StartContainer,
    StopContainer,
    Struck,
    Touch,
    Unpause,
    Wait,
)

__all__ = [
    "NoOptions",
    "ShapeLink",
    "Partitioned",
    "LinkChaos",
    "HealFaults",
    "FindIface",
    "ClearLink",
    "ApplyPartitions",
    "CatchWriter",
    "ACT_MARKER",
    "RequireCkptStorage",
    "RunNodeScript",
    "CutFromJob",
    "EndedWithNode",
    "Entry",
    "KillContainer",
    "NetworkBack",
    "PauseContainer",
    "PodDown",
    "RestartContainer",
    "StartContainer",
    "StopContainer",
    "ScaleJob",
    "ScaleNodes",
    "Unpause",
    "Wait",
    "ENDS",
    "Act",
    "Action",
    "ChaosMesh",
    "ContinueWorker",
    "EndsHold",
    "ExecTask",
    "ExhaustMemory",
    "ForgetInForce",
    "Held",
    "K8sForm",
    "LimitCpu",
    "LimitWrites",
    "NodeShell",
    "PodChaos",
    "ReadCpuLimits",
    "RemoveFile",
    "STRIKES",
    "Signal",
    "Struck",
    "Touch",
    "FAULT_KINDS",
    "KINDS",
    "LANES",
    "NODE_EFFECTS",
    "PROVOCATIONS",
    "UNDO_OPS",
    "UNKNOWN",
    "FaultKind",
    "Provocation",
    "in_force_kinds",
    "in_force_name",
    "kind_of",
    "names_where",
]
_NOT_FAMILIES = {"base"}


def _collect() -> tuple[FaultKind, ...]:
    found: list[FaultKind] = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.name.startswith("_") or module.name in _NOT_FAMILIES:
            continue
        found += importlib.import_module(f"{__name__}.{module.name}").KINDS
    names = [kind.name for kind in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"fault kinds declared twice: {', '.join(twice)}")
    return tuple(found)


FAULT_KINDS: tuple[FaultKind, ...] = _collect()
KINDS: dict[str, FaultKind] = {kind.name: kind for kind in FAULT_KINDS}
# A record of a kind this version does not know (a newer history): no trait, so nothing is assumed.
UNKNOWN = FaultKind("unknown")
# Every kind's provocations, by the name `sim vet --faults` takes, in the gauntlet's order.
PROVOCATIONS: dict[str, Provocation] = dict(
    sorted(((name, p) for kind in FAULT_KINDS for name, p in kind.provocations.items()), key=lambda np: np[1].order)
)


def kind_of(name: str) -> FaultKind:
    """The kind a history record names; UNKNOWN for a name this version does not know."""
    return KINDS.get(name, UNKNOWN)


def names_where(trait: Callable[[FaultKind], bool]) -> tuple[str, ...]:
    """The history names of every kind with a trait, e.g. names_where(lambda k: k.damages_checkpoint)."""
    return tuple(kind.name for kind in FAULT_KINDS if trait(kind))


# An in-force name an older sim wrote -> the kind's in-force name now (FaultKind.in_force_was).
_IN_FORCE_NOW = {old: kind.in_force for kind in FAULT_KINDS for old in kind.in_force_was}


def in_force_name(name: str) -> str:
    """The in-force name a stored record's `fault` stands for now: an older sim's ("skew") read as its kind's."""
    return _IN_FORCE_NOW.get(name, name)


def in_force_kinds(trait: Callable[[FaultKind], bool]) -> tuple[str, ...]:
    """The fault store's kinds of every kind with a trait (what `sim faults` lists them as)."""
    return tuple(kind.in_force for kind in FAULT_KINDS if kind.in_force is not None and trait(kind))
