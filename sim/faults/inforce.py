"""The faults in force: typed records in a small JSON file beside the compose file, changed under one lock.

`sim faults` lists them, `sim heal ID` undoes one. A verb records its fault before it acts (`claimed`), so a
crash while it acts leaves a record `heal --all` sees; undo timers (threads) and other `sim` processes change
the file too, hence the lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from sim.core import faultkinds as kinds
from sim.core.errors import SimError, UsageError
from sim.engines.docker import ExecTimeout
from sim.faults.verbbase import SHARED_CKPT_DIR


@dataclasses.dataclass(frozen=True)
class InForce:
    """One fault in force, with what heal needs to undo it. `fault` is its in-force kind
    (sim.core.faultkinds.FaultKind.in_force: pause, link, partition, hang, stall, slow-node, skew-clock, fill,
    freeze, slow-disk)."""

    id: str
    fault: str
    target: str  # the node it acts on; a partition's description
    since: float = 0.0
    detail: str | None = None  # what `sim faults` shows of it
    pid: int | None = None  # hang, freeze: the stopped worker
    file: str | None = None  # stall: the file that holds the worker; fill: the filler
    cpu_quota: int | None = None  # slow: the limits to restore
    cpu_period: int | None = None
    cuts: tuple[tuple[str, ...], ...] = ()  # partition
    loss_pct: float | None = None  # link
    rate_bps: int | None = None
    netem: Mapping = dataclasses.field(default_factory=dict)
    iface: str | None = None
    # An intent: recorded before the fault acted, with no outcome since (interrupted mid-act, or acting
    # now). Heal undoes it as if it had acted, and first ends its act (`act`) where that runs on.
    acting: bool = False
    act: str | None = None  # the marker of the node script that acts (fill, freeze): it outlives our exec call
    extra: Mapping = dataclasses.field(default_factory=dict)  # keys a newer writer added

    @classmethod
    def parse(cls, data: Mapping) -> InForce:
        """The one way a stored (or a verb's) dict becomes a record."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values = {k: v for k, v in data.items() if k in names}
        if "fault" in values:  # an older sim's name for it ("skew"), read as its kind's now
            values["fault"] = kinds.in_force_name(values["fault"])
        if "cuts" in values:
            values["cuts"] = tuple(tuple(cut) for cut in values["cuts"] or ())
        return cls(**values, extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        data["cuts"] = [list(cut) for cut in self.cuts]
        data["netem"] = dict(self.netem)
        return {k: v for k, v in data.items() if v not in (None, [], {})} | dict(self.extra)

    @property
    def on_shared_volume(self) -> bool:
        """A file on the cluster's shared checkpoint volume: it outlives its node's container."""
        return (self.file or "").startswith(SHARED_CKPT_DIR + "/")


class FaultStore:
    def __init__(self, path: Path):
        self.path = Path(path)

    def active(self) -> list[InForce]:
        if not self.path.exists():
            return []
        return [InForce.parse(f) for f in json.loads(self.path.read_text())]

    def remember(self, fault: Mapping | InForce) -> None:
        fault = fault if isinstance(fault, InForce) else InForce.parse(fault)
        with self.locked() as faults:
            faults[:] = [f for f in faults if f.id != fault.id] + [dataclasses.replace(fault, since=time.time())]

    @contextlib.contextmanager
    def claimed(
        self, fault_id: str, refusal: str | None, record: Callable[[], dict], was: Sequence[str] = ()
    ) -> Iterator[None]:
        """Record a fault's intent before it acts: the "already in force?" check (None: a new one replaces
        it), the "before" values (`record()`) and the record, under the store's one lock, so two `sim`
        processes cannot both pass the check, nor save the other's fault as the value to restore. A crash
        or a signal while it acts leaves the intent (`acting`), which `heal` and cleanup undo. A definite
        refusal while acting (a SimError, not a time-out) forgets it; the act done, the intent is an outcome.
        `was`: the ids an older sim gave the same fault (FaultKind.in_force_ids_was): in force, they refuse too."""
        with self.locked() as faults:
            if refusal is not None and any(f.id == fault_id or f.id in was for f in faults):
                raise UsageError(refusal)
            intent = InForce.parse({**record(), "id": fault_id, "since": time.time(), "acting": True})
            faults[:] = [f for f in faults if f.id != fault_id] + [intent]
        try:
            yield
        except ExecTimeout:
            raise  # it may have acted: the intent stays for `heal`
        except SimError:
            self.forget(fault_id)
            raise
        with self.locked() as faults:
            faults[:] = [dataclasses.replace(f, acting=False) if f.id == fault_id else f for f in faults]

    def forget(self, fault_id: str) -> None:
        with self.locked() as faults:
            faults[:] = [f for f in faults if f.id != fault_id]

    def forget_faults_of(
        self, nodes: Sequence[str], kinds: Sequence[str] | None, keep: Callable[[InForce], bool] = lambda f: False
    ) -> None:
        """Forget the faults on these nodes (of these kinds; None: any) that ended with them, but those `keep` keeps."""
        with self.locked() as faults:
            faults[:] = [
                f for f in faults if not (f.target in nodes and (kinds is None or f.fault in kinds) and not keep(f))
            ]

    @contextlib.contextmanager
    def locked(self) -> Iterator[list[InForce]]:
        """The faults in force, to change in place: read, changed and written under one lock,
        since undo timers (threads) and other `sim` processes change the file too."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            faults = self.active()
            yield faults
            # Written to a temp name, then renamed: a reader without the lock never sees half a file.
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps([f.to_dict() for f in faults], indent=2))
            os.replace(tmp, self.path)
