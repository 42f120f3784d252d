"""Heal as a plan: what to undo, in which order, what to keep and why, computed as data from the faults in
force and the containers' states; `Nemesis.heal` carries it out in one loop (like torch's rendezvous op
executor: the state decides the action, the executor only acts). Nothing here touches Docker.

A node may have been killed, stopped or scaled away since its fault: what lived in its processes or its
network namespace went with them (a pause, a link fault, a held or frozen worker); what lives in the
container's settings or files stays with a stopped container (a CPU quota, a clock offset, a filler file),
and a filler on the shared checkpoint volume outlives the container.

A fault is recorded as an intent before it acts (sim/faults/inforce.py `acting`): one interrupted mid-act is
undone as if it had acted, its node script ended first (EndAct), a worker it may have stopped continued.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from sim.core import faultkinds as kinds
from sim.core.faultkinds import Struck, Unpause
from sim.faults.inforce import InForce
from sim.faults.targets import ETCD


@dataclasses.dataclass(frozen=True)
class EndAct:
    """End the node script of an interrupted fault (a filler still writing, a watcher still waiting to stop a
    worker): our exec call ended, the process in the node did not."""

    node: str
    marker: str


Action = EndAct | kinds.Action


@dataclasses.dataclass(frozen=True)
class Undo:
    """One fault to undo by its actions, in order, then forget; no actions: it ended with its node."""

    fault_id: str
    actions: tuple[Action, ...]
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Keep:
    """A fault that cannot be undone now: it stays in force, and why says what to do first."""

    fault_id: str
    why: str


@dataclasses.dataclass(frozen=True)
class HealPlan:
    steps: tuple[Undo | Keep, ...]
    # heal --all: also unpause every paused container and clear every running one's link faults, even if
    # our record of them was lost (and, whatever it undid, the partitions left in force are applied again)
    sweep: bool = False

    @property
    def undone(self) -> tuple[str, ...]:
        return tuple(s.fault_id for s in self.steps if isinstance(s, Undo))

    @property
    def kept(self) -> tuple[Keep, ...]:
        return tuple(s for s in self.steps if isinstance(s, Keep))


_FROZEN = kinds.in_force_kinds(lambda kind: kind.freezes_node)  # pause, freeze: a frozen node runs nothing
# The verb that thaws a frozen node: the kind that undoes a freeze in force.
_THAW = next(" ".join(k.act.verb) for k in kinds.FAULT_KINDS if k.act is not None and k.undoes_in_force in _FROZEN)
# In-force kind -> the act of the kind that declares its own undo.
_ACTING = {k.in_force: k.act for k in kinds.FAULT_KINDS if k.act is not None and k.in_force is not None}


def plan_heal(chosen: Sequence[InForce], states: Mapping[str, str], *, sweep: bool = False) -> HealPlan:
    """The plan for undoing `chosen`, given each container's state now (node -> running, paused, exited...).
    Pauses first: a paused node runs nothing, so its other faults are undone once it runs again."""
    states = dict(states)
    steps = []
    for fault in sorted(chosen, key=lambda f: f.fault not in _FROZEN):
        steps.append(_plan_one(fault, states))
    return HealPlan(tuple(steps), sweep=sweep)


def _plan_one(fault: InForce, states: dict[str, str]) -> Undo | Keep:
    """One fault's undo; `states` is changed as the plan would change it (an unpaused node runs)."""
    kind, node = fault.fault, fault.target
    state = states.get(node)  # None: no such container (scaled away), or not a node (a partition)
    actions: list[Action] = []
    act = _ACTING.get(kind)
    if kind in _FROZEN and state == "paused":
        # A frozen node runs nothing: thawed first (a pause's own undo is its unpause).
        at = Struck(node)
        actions += act.undo(at) if act is not None and act.undo_while_paused else (Unpause(node),)
        state = states[node] = "running"
    if fault.acting and fault.act and state == "running":
        actions.append(EndAct(node, fault.act))  # first: a watcher left running would stop a worker after
    if act is not None and act.undo_while_paused:
        pass  # undone above, or nothing to undo: a paused node someone thawed already
    elif act is not None and act.strikes == "links":  # in no one node: the partitions left in force applied again
        actions += act.undo(Struck(node, cuts=frozenset(map(tuple, fault.cuts)), id=fault.id))
    elif act is not None:  # a kind that declares its own undo (sim/core/faultkinds)
        kept = {"cpu_quota": fault.cpu_quota, "cpu_period": fault.cpu_period}
        at = Struck(node, pid=fault.pid, file=fault.file, kept=kept, id=fault.id)  # what it struck, as its record says
        shared = act.undo_anywhere(at)
        if shared and state != "running":  # any running node reaches the shared volume
            node, state = next(((n, st) for n, st in states.items() if st == "running" and n != ETCD), (node, state))
            at = dataclasses.replace(at, node=node)
        if act.undo_needs_running and (state is not None or shared):  # else: gone with a container removed since
            refused = _not_running(fault, node, state)
            if refused:
                return Keep(fault.id, refused)
            actions += act.undo(at)
        elif state == "running" or (act.undo_on_stopped and state is not None):
            actions += act.undo(at)
    why = "" if actions else f"nothing left to undo: {node} is {state or 'gone'}"
    return Undo(fault.id, tuple(actions), why)


def _not_running(fault: InForce, node: str, state: str | None) -> str | None:
    if state is None:
        return f"no running node reaches {fault.file}; start one, then `sim heal {fault.id}`"
    if state != "running":
        wake = _THAW if state == "paused" else "start"
        return f"{node} is {state}; `sim {wake} {node}`, then `sim heal {fault.id}`"
    return None
