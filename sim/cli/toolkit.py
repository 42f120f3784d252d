"""elastic-sim's faults and checks as Chaos Toolkit activities (the `chaosesim` extension wraps these).

Actions are generated from the fault catalog (sim.faults.catalog), one per fault kind, named as the kind
with '_' for '-' (kill-worker -> kill_worker), taking the CLI's arguments by the same names (a reversible
fault also takes `duration`, the CLI's --for). Each goes through the CLI's own audited path
(sim.cli.faults.inject: parse as the CLI does, one Nemesis call that writes the history's invoke/ok records)
and returns the audited result. Probes read the run's history as `sim report` does. No import of
chaoslib here: elastic-sim works without the Chaos Toolkit installed.

Which cluster: the experiment's configuration key `sim_cluster`, else $SIM_CLUSTER, else "sim";
run folders are found under $SIM_HOME as for every other command.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from sim.cli.faults import inject
from sim.core.errors import UsageError
from sim.core.faultoptions import FLAG, GROUPS, NODES, NODES_PAIR, option_of
from sim.core.history import FILE_NAME, FaultRecord, History
from sim.core.spec import DEFAULT_NAME
from sim.engines.cluster import Cluster
from sim.engines.docker import Docker
from sim.faults.catalog import FAULTS, FaultEntry
from sim.verdict.runmodel import trigger_step

CLUSTER_KEY = "sim_cluster"
POLL_S = 0.5


def cluster_name(configuration: Mapping[str, Any] | None) -> str:
    return (configuration or {}).get(CLUSTER_KEY) or os.environ.get("SIM_CLUSTER") or DEFAULT_NAME


# ---------------------------------------------------------------- actions


def _as_cli(kind, value: Any) -> Any:
    """A JSON argument as the CLI would have received it (text), so the CLI's own parsing applies."""
    if value is None or kind is FLAG:
        return value
    if kind is GROUPS and isinstance(value, (list, tuple)):
        return "|".join(",".join(group) if isinstance(group, (list, tuple)) else str(group) for group in value)
    if kind is NODES_PAIR and isinstance(value, (list, tuple)):
        return [",".join(side) if isinstance(side, (list, tuple)) else str(side) for side in value]
    if kind is NODES and isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, bool):
        raise UsageError(f"{value!r}: not {kind.expects}")
    return f"{value:g}" if isinstance(value, float) else str(value)


def _action(fault: FaultEntry) -> Callable[..., dict]:
    fields = fault.fields
    extra = ["duration"] if fault.reversible else []

    def action(*args: Any, configuration: Mapping[str, Any] | None = None, **given: Any) -> dict:
        bound = signature.bind(*args, configuration=configuration, **given)
        values = dict(bound.arguments)
        namespace = argparse.Namespace(
            name=cluster_name(values.pop("configuration", None)), seed=values.pop("seed", None)
        )
        for f in fields:
            setattr(namespace, f.name, _as_cli(option_of(f).kind, values.get(f.name)))
        namespace.duration = None if values.get("duration") is None else str(values["duration"])
        return inject(fault, namespace)

    required = [f for f in fields if f.default is dataclasses.MISSING]
    optional = [f for f in fields if f.default is not dataclasses.MISSING]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter(f.name, kind) for f in required]
    parameters += [inspect.Parameter(f.name, kind, default=None) for f in optional]
    parameters += [inspect.Parameter(name, kind, default=None) for name in (*extra, "seed", "configuration")]
    signature = inspect.Signature(parameters, return_annotation=dict)
    action.__signature__ = signature  # what `chaos discover` and the toolkit's argument check read
    action.__name__ = action.__qualname__ = fault.name.replace("-", "_")
    undo = ' Reversible: `duration` (e.g. "20s") holds it, then undoes it; else `heal`.' if fault.reversible else ""
    options = "; ".join(f"{f.name}: {option_of(f).help}" for f in fields) or "no options"
    action.__doc__ = f"{fault.help} (`sim {' '.join(fault.verb)}`).{undo} Options: {options}."
    return action


ACTIONS: dict[str, Callable[..., dict]] = {fault.name.replace("-", "_"): _action(fault) for fault in FAULTS.values()}


# ---------------------------------------------------------------- probes


def _history(configuration: Mapping[str, Any] | None) -> History:
    name = cluster_name(configuration)
    return History(Cluster(name, Docker()).run_dir / FILE_NAME)


def _steps_after(history: History, since: float) -> list:
    return [r for r in history.records() if r.t > since and trigger_step(r) is not None]


def training_progressing(within: float = 30.0, configuration: Mapping[str, Any] | None = None) -> bool:
    """True once the cluster's training records a step after this call, within `within` seconds."""
    history, start = _history(configuration), time.time()
    deadline = time.monotonic() + float(within)
    while True:
        if _steps_after(history, start):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def world_size(within: float = 60.0, configuration: Mapping[str, Any] | None = None) -> int:
    """The world size of the first training step recorded after this call (waiting up to `within`
    seconds for one), else of the newest step recorded; 0 when training never stepped."""
    history, start = _history(configuration), time.time()
    deadline = time.monotonic() + float(within)
    while time.monotonic() < deadline:
        fresh = [r for r in _steps_after(history, start) if isinstance(r.world_size, int)]
        if fresh:
            return min(fresh, key=lambda r: r.t).world_size
        time.sleep(POLL_S)
    steps = [r for r in _steps_after(history, 0.0) if isinstance(r.world_size, int)]
    return max(steps, key=lambda r: r.t).world_size if steps else 0


def recovered_within(seconds: float = 60.0, configuration: Mapping[str, Any] | None = None) -> bool:
    """True when training recovered from the last fault (its first step at the post-fault world size, as
    `sim report` measures recovery) within `seconds` of it; waits until then. True with no fault."""
    from sim.verdict.runfolder import report_run

    history = _history(configuration)
    while True:
        faults = [r for r in history.records() if isinstance(r, FaultRecord) and r.phase == "ok"]
        if not faults:
            return True
        verdict, _ = report_run(history.path.parent, live=True)
        last = max(verdict.recoveries, key=lambda r: r.t_fault, default=None)
        if last is None or last.degraded:
            return True
        if last.recovery_s is not None:
            return last.recovery_s <= float(seconds)
        if time.time() - last.t_fault > float(seconds):
            return False
        time.sleep(POLL_S * 4)


def verdict(expected: str = "recovers", configuration: Mapping[str, Any] | None = None) -> dict:
    """The verdict of the run so far (`sim report`, provisional while it runs): valid, and each check."""
    from sim.verdict.runfolder import report_run

    run_dir = _history(configuration).path.parent
    found, summary = report_run(run_dir, expected=expected, live=True)
    return {
        "valid": found.valid,
        "expected": found.expected,
        "failed": [r.name for r in found.results if not r.valid],
        "recoveries": [
            {"fault": r.fault, "target": r.target, "recovery_s": r.recovery_s, "steps_lost": r.steps_lost}
            for r in found.recoveries
        ],
        "run_dir": str(run_dir),
    }


PROBES: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (training_progressing, world_size, recovered_within, verdict)
}
