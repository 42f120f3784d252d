"""`sim tune`: torch's own elastic settings, tried on the job, and the fastest set that stays safe.

The job is put through the kinds of fault whose recovery torch's settings decide (a worker crash, a node crash,
a freeze past the keep-alive, a joining node) once per point of a small grid of those settings: the c10d/etcd
rendezvous's keep_alive_interval x keep_alive_max_attempt, last_call_timeout and join_timeout (`--rdzv-conf`),
torchrun's `--monitor-interval`, and the process-group timeout where the script takes it from an option or the
environment (found in its source: find_pg_timeout). Each point is one `sim vet` plan (sim/vet/gauntlet.py), run on the
vet's lanes, several clusters at once; before its first fault the job trains with no fault for CONTROL_S
seconds, the no-fault control.

A point qualifies when every kind was survived and its history shows no false restart (false_restarts: a
restart, a failed group, an exit or a new rendezvous round in the no-fault control window, or a round in a
fault's window that left out a node the fault did not take). The recommendation is the qualifying point with the
least total recovery. Points that break the nesting rule (nesting_problems) are never run.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import itertools
import json
import math
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.core.errors import UsageError
from sim.core.history import FILE_NAME, History
from sim.core.parse import parse_duration
from sim.core.paths import TRAINER_DIR
from sim.core.spec import ClusterSpec, over_trainer_defaults
from sim.core.torchrun import torchrun_argv
from sim.faults.catalog import FAULTS, PROVOCATIONS
from sim.verdict.runmodel import RunModel
from sim.vet.gauntlet import FaultScore, Plan, clusters_that_fit, plan_vet, run_lanes

Progress = Callable[[str], None]

TUNE_KINDS = ("kill-worker", "kill-node", "pause", "scale-up")
# The grid when the user gives none: 2 x 2 points (the pg timeout where the script takes one), about 8 minutes
# on two clusters here. Keep-alive windows of 12 and 18 s leave room under them for a 10 s process-group timeout:
# on this shared 2-core machine a restarted group's ranks reached their first collective more than 5 s apart
# (a 5 s timeout failed DDP's first broadcast), and a 1 s last call formed the first round without a slow node.
DEFAULT_GRID = {"keep_alive": "4x3,6x3", "last_call": "2,5", "monitor": "0.1", "pg_timeout": "10"}
CONTROL_S = 20.0  # the no-fault control window: steady training before the first fault
DYNAMIC_BACKENDS = ("etcd-v2", "etcd-v3", "c10d")  # torch's DynamicRendezvousHandler reads the tuned keys
SHIPPED_TRAINER_SOURCE = TRAINER_DIR / "train.py"

# ---------------------------------------------------------------- the settings


@dataclasses.dataclass(frozen=True)
class Settings:
    """One point of the grid. Whole seconds where torch reads whole numbers (get_as_int)."""

    keep_alive_interval: int
    keep_alive_max_attempt: int
    last_call_timeout: int
    join_timeout: int
    monitor_interval: float
    pg_timeout: float | None = None  # None: the script's own (not tunable, or not tuned)

    def __post_init__(self) -> None:
        for name in ("keep_alive_interval", "keep_alive_max_attempt", "last_call_timeout", "join_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{name} {value!r}: torch reads a whole number >= 1")
        if not 0 < self.monitor_interval < math.inf:
            raise UsageError(f"monitor interval {self.monitor_interval!r}: must be seconds > 0, e.g. 0.1")
        if self.pg_timeout is not None and not 0 < self.pg_timeout < math.inf:
            raise UsageError(f"pg timeout {self.pg_timeout!r}: must be seconds > 0, e.g. 10")

    @property
    def keep_alive_s(self) -> int:
        """How long a silent node lasts before the rendezvous drops it (dynamic_rendezvous.py `_sanitize`)."""
        return self.keep_alive_interval * self.keep_alive_max_attempt

    def rdzv_conf(self) -> dict[str, str]:
        return {
            "keep_alive_interval": str(self.keep_alive_interval),
            "keep_alive_max_attempt": str(self.keep_alive_max_attempt),
            "last_call_timeout": str(self.last_call_timeout),
            "join_timeout": str(self.join_timeout),
        }

    def label(self) -> str:
        pg = "" if self.pg_timeout is None else f" pg {self.pg_timeout:g}s"
        return (
            f"keep-alive {self.keep_alive_interval}x{self.keep_alive_max_attempt}={self.keep_alive_s}s "
            f"last-call {self.last_call_timeout}s join {self.join_timeout}s monitor {self.monitor_interval:g}s{pg}"
        )

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "keep_alive_s": self.keep_alive_s}


# torch 2.13's own defaults: dynamic_rendezvous.py (RendezvousTimeout._DEFAULT_TIMEOUTS: join 600 s, last_call
# 30 s; create_handler: keep_alive_interval 5, keep_alive_max_attempt 3), torch/distributed/run.py
# (--monitor-interval 0.1) and torch/distributed/constants.py (default_pg_timeout: 30 minutes, gloo).
TORCH_DEFAULTS = Settings(5, 3, 30, 600, 0.1, 1800.0)


# The safe nesting of the settings. P the process-group timeout, K the keep-alive window (interval x attempts),
# L the last call, J the join timeout, M the monitor interval; torch 2.13's
# torch/distributed/elastic/rendezvous/dynamic_rendezvous.py is the evidence (docs/TUNE.md says more).
NESTING_RULE = """\
P the process-group timeout, K the keep-alive window (interval x attempts), L the last call, J the join timeout,
M the monitor interval.
1. keep_alive_max_attempt >= 2: a node is dead when its last heartbeat is older than K (_sanitize); with one
   attempt, a single late heartbeat on a busy machine drops a live node.
2. P < K: a survivor's process group must fail before the rendezvous drops its silent peer. A node dropped
   by _sanitize while its workers train on is never heartbeated for again (_should_keep_alive finds no
   entry for it), so a stall between K and P would declare a live node dead.
3. J >= 2 (K + L): a survivor's rendezvous waits for the dead node's sweep (up to K: the round moves on only
   once every old participant has left, _remove_participant_epilogue), then the last call (L); the join
   timeout bounds that whole wait (next_rendezvous's deadline), twice over for a loaded backend.
4. M < K: the agent polls its workers and the wait list (num_nodes_waiting) more often than a node may
   stay silent.
"""


def nesting_problems(s: Settings) -> list[str]:
    """The rules of NESTING_RULE that `s` breaks, a line each (none: it is safe)."""
    problems = []
    if s.keep_alive_max_attempt < 2:
        problems.append("keep_alive_max_attempt < 2: one late heartbeat would drop a live node")
    if s.pg_timeout is not None and not s.pg_timeout < s.keep_alive_s:
        problems.append(
            f"pg timeout {s.pg_timeout:g}s >= keep-alive {s.keep_alive_s}s: a stall between them declares a live "
            "node dead while its workers train on"
        )
    if s.join_timeout < 2 * (s.keep_alive_s + s.last_call_timeout):
        problems.append(
            f"join {s.join_timeout}s < 2 x (keep-alive {s.keep_alive_s}s + last call {s.last_call_timeout}s): a "
            "survivor's rendezvous could time out waiting for a dead node's sweep"
        )
    if not s.monitor_interval < s.keep_alive_s:
        problems.append(f"monitor interval {s.monitor_interval:g}s >= keep-alive {s.keep_alive_s}s")
    return problems


# ---------------------------------------------------------------- the grid

WORKER_START_S = 10.0  # a restarted group's start and checkpoint load here (docs/FACTS: 9-10 s on 2 cores)
STEADY_S = 5.0  # the steady steps each fault waits for after its recovery
START_S = 60.0  # a cluster's start, to its first steps, on this shared machine
# How long the freeze the tuner provokes lasts (its provocation's duration).
FREEZE_S = (
    next(PROVOCATIONS[k].duration_s for k in TUNE_KINDS if FAULTS[PROVOCATIONS[k].fault].kind.freezes_node) or 25.0
)


def expected_recovery(s: Settings, kind: str) -> float:
    """What the settings let a kind's recovery be, from torch's mechanics (the grid's order and the budget's
    estimate, never a result): a node crash waits for the sweep (K) and the last call (L); a freeze, for the
    slower of its detectors (P, K; the freeze ends first if both are longer), then the last call, then the
    thawed node's rejoin; a joining node, for the monitor's next look (M) and the last call."""
    pg = s.pg_timeout if s.pg_timeout is not None else TORCH_DEFAULTS.pg_timeout
    provocation = PROVOCATIONS.get(kind)
    if provocation is None:
        return WORKER_START_S
    traits = FAULTS[provocation.fault].kind  # what the fault does, not its name
    if traits.freezes_node:
        detect = min(max(pg, s.keep_alive_s), FREEZE_S)
        return detect + 2 * (s.last_call_timeout + WORKER_START_S)
    if traits.removes_node:
        return s.keep_alive_s + s.last_call_timeout + WORKER_START_S
    if traits.changes_node_count and provocation.nodes == "more":
        return s.monitor_interval + s.last_call_timeout + WORKER_START_S
    if traits.ends_workers and not traits.silences_node:
        return s.monitor_interval + WORKER_START_S
    return WORKER_START_S


def point_cost_s(s: Settings, kinds: Sequence[str]) -> float:
    """One point's cluster, start to end: start, control window, each kind's recovery and steady steps (a
    joining node first needs a node taken away: its own regroup)."""
    cost = START_S + CONTROL_S
    for kind in kinds:
        cost += expected_recovery(s, kind) + STEADY_S
        provocation = PROVOCATIONS.get(kind)
        if provocation is not None and provocation.nodes == "more":  # a node joins: one left just before
            cost += s.last_call_timeout + WORKER_START_S + STEADY_S
    return cost


@dataclasses.dataclass(frozen=True)
class Grid:
    points: tuple[Settings, ...]  # to run, in order: the fastest expected first
    unsafe: tuple[tuple[Settings, tuple[str, ...]], ...]  # never run: the nesting rules they break
    cut: tuple[Settings, ...]  # safe, but beyond the budget
    clusters: int
    estimate_s: float  # the points to run, in batches of `clusters`
    budget_s: float


def make_grid(
    keep_alive: Sequence[tuple[int, int]],
    last_call: Sequence[int],
    join: Sequence[int] | None,
    monitor: Sequence[float],
    pg: Sequence[float] | None,
) -> tuple[list[Settings], list[tuple[Settings, tuple[str, ...]]]]:
    """Every combination, split into the safe ones and the unsafe ones (with the rules they break). `join`
    None: each point's join timeout is the least the nesting allows, rounded up to 10 s, at least 60 s."""
    safe, unsafe = [], []
    for (interval, attempts), lc, mi, p in itertools.product(keep_alive, last_call, monitor, pg or (None,)):
        joins = join if join else (max(60, -(-2 * (interval * attempts + lc) // 10) * 10),)
        for jt in joins:
            s = Settings(interval, attempts, lc, jt, mi, p)
            problems = nesting_problems(s)
            (unsafe.append((s, tuple(problems))) if problems else safe.append(s))
    return safe, unsafe


def order_points(points: Sequence[Settings], kinds: Sequence[str]) -> list[Settings]:
    """Fastest expected total recovery first; ties to the larger safety margins (keep-alive, then join)."""
    return sorted(
        points,
        key=lambda s: (sum(expected_recovery(s, k) for k in kinds), -s.keep_alive_s, -s.join_timeout),
    )


def batches_cost(points: Sequence[Settings], kinds: Sequence[str], clusters: int) -> float:
    costs = [point_cost_s(s, kinds) for s in points]
    return sum(max(costs[i : i + clusters]) for i in range(0, len(costs), clusters))


def fit_budget(
    points: Sequence[Settings],
    unsafe: Sequence[tuple[Settings, tuple[str, ...]]],
    kinds: Sequence[str],
    clusters: int,
    budget_s: float,
) -> Grid:
    """The points in order, cut to what `budget_s` holds in batches of `clusters`: the fastest expected kept,
    and the most conservative kept as a fallback where more than one fits."""
    ordered = order_points(points, kinds)
    if not ordered:
        raise UsageError(
            "the grid has no safe point: every combination breaks the nesting rule "
            f"({unsafe[0][1][0] if unsafe else 'none given'}); widen --keep-alive or --join"
        )
    keep = list(ordered)
    while len(keep) > 1 and batches_cost(keep, kinds, clusters) > budget_s:
        drop = -2 if len(keep) > 2 else -1  # the last (most conservative) stays as a fallback
        keep.pop(drop)
    if batches_cost(keep, kinds, clusters) > budget_s:
        need = batches_cost(keep, kinds, clusters)
        raise UsageError(
            f"--budget {budget_s:g}s: not even one point fits (one takes about {need:.0f} s here); "
            f"give --budget {math.ceil(need / 60)}m or more"
        )
    cut = tuple(s for s in ordered if s not in keep)
    return Grid(tuple(keep), tuple(unsafe), cut, clusters, batches_cost(keep, kinds, clusters), budget_s)


def parse_keep_alive(text: str) -> list[tuple[int, int]]:
    """`1x3,2x3`: interval x attempts pairs."""
    pairs = []
    for word in _words("--keep-alive", text):
        interval, sep, attempts = word.partition("x")
        if not sep or not interval.isdigit() or not attempts.isdigit() or int(interval) < 1 or int(attempts) < 1:
            raise UsageError(
                f"--keep-alive {word!r}: not INTERVALxATTEMPTS in whole seconds; use e.g. --keep-alive 1x3,2x3"
            )
        pairs.append((int(interval), int(attempts)))
    return pairs


def parse_whole(flag: str, text: str) -> list[int]:
    values = []
    for word in _words(flag, text):
        if not word.isdigit() or int(word) < 1:
            raise UsageError(f"{flag} {word!r}: torch reads whole seconds >= 1; use e.g. {flag} 1,3")
        values.append(int(word))
    return values


def parse_seconds(flag: str, text: str) -> list[float]:
    values = []
    for word in _words(flag, text):
        try:
            seconds = parse_duration(word)
        except UsageError:
            raise UsageError(f"{flag} {word!r}: not a duration; use e.g. {flag} 0.1,0.5 (seconds) or 5s") from None
        if not seconds > 0:
            raise UsageError(f"{flag} {word!r}: must be above zero")
        values.append(seconds)
    return values


def _words(flag: str, text: str) -> list[str]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise UsageError(f"{flag} {text!r}: names no value; give a comma-separated list")
    if len(set(words)) != len(words):
        raise UsageError(f"{flag} {text!r}: a value named twice; name each once")
    return words


def parse_kinds(text: str | None) -> tuple[str, ...]:
    if text is None:
        return TUNE_KINDS
    kinds = tuple(_words("--faults", text))
    for kind in kinds:
        if kind not in TUNE_KINDS:
            raise UsageError(f"--faults: {kind!r} is not one the settings decide; use some of {', '.join(TUNE_KINDS)}")
    return kinds


# ---------------------------------------------------------------- the process-group timeout in the script


@dataclasses.dataclass(frozen=True)
class PgTimeout:
    """Where the script's init_process_group timeout comes from. `how`: "arg" (an argparse option, `name` its
    flag), "env" (an environment variable, `name`), or "none" (not tunable: `why` says what was found)."""

    how: str
    name: str | None = None
    scale: float = 1.0  # seconds per unit of the option's value (timedelta(minutes=...): 60)
    line: int | None = None
    why: str = ""

    @property
    def tunable(self) -> bool:
        return self.how in ("arg", "env")

    def value(self, seconds: float) -> str:
        return f"{seconds / self.scale:g}"

    def describe(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        unit = {1.0: "seconds", 60.0: "minutes", 3600.0: "hours", 0.001: "milliseconds"}.get(self.scale, "units")
        if self.how == "arg":
            return f"the script's option {self.name} ({unit}) feeds init_process_group's timeout{at}"
        if self.how == "env":
            return f"the environment variable {self.name} ({unit}) feeds init_process_group's timeout{at}"
        return self.why


_UNITS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "milliseconds": 0.001, "days": 86400.0}
_TIMEOUT_INDEX = 2  # torch.distributed.init_process_group(backend, init_method, timeout, ...)


def find_pg_timeout(source: str, name: str = "the script") -> PgTimeout:
    """Where `source`'s init_process_group timeout comes from: followed back through local names, timedelta(...),
    conversions and the parameters of the functions it is passed through, to an argparse option or an
    environment read."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return PgTimeout("none", why=f"{name} does not parse ({error.msg}, line {error.lineno}): left out of the grid")
    tracer = _Tracer(tree)
    calls = tracer.torch_init_calls()
    if not calls:
        return PgTimeout("none", why=f"{name} calls no init_process_group: the process-group timeout is left out")
    for call in calls:
        timeout = next((k.value for k in call.keywords if k.arg == "timeout"), None)
        if timeout is None and len(call.args) > _TIMEOUT_INDEX:
            timeout = call.args[_TIMEOUT_INDEX]
        if timeout is None:
            continue
        found = tracer.sources(timeout, 1.0, depth=0)
        for kind, what, scale in found:
            if kind == "arg" and what in tracer.flags:
                return PgTimeout("arg", tracer.flags[what], scale, call.lineno)
            if kind == "env":
                return PgTimeout("env", what, scale, call.lineno)
        constants = [what for kind, what, _ in found if kind == "const"]
        if constants:
            return PgTimeout(
                "none",
                line=call.lineno,
                why=f"{name} hard-codes init_process_group's timeout ({constants[0]}, line {call.lineno}): left out "
                "of the grid; read it from an option or the environment to tune it",
            )
        reads = [what for kind, what, _ in found if kind == "arg"]
        if reads:
            return PgTimeout(
                "none",
                line=call.lineno,
                why=f"{name}'s process-group timeout comes from {reads[0]!r}, not an argparse option or the "
                f"environment (line {call.lineno}): left out of the grid",
            )
        return PgTimeout(
            "none",
            line=call.lineno,
            why=f"{name}'s process-group timeout (line {call.lineno}) could not be traced to an option or the "
            "environment: left out of the grid",
        )
    line = calls[0].lineno
    return PgTimeout(
        "none",
        line=line,
        why=f"{name} passes no timeout to init_process_group (line {line}): torch's default (30 min for gloo) "
        "holds, left out of the grid; pass timeout= from an option or the environment to tune it",
    )


class _Tracer:
    MAX_DEPTH = 8

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.flags: dict[str, str] = {}  # argparse dest -> its flag
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and _is_str(node.args[0]) and node.args[0].value[:2] == "--":
                flag = node.args[0].value
                dest = next((k.value.value for k in node.keywords if k.arg == "dest" and _is_str(k.value)), None)
                long = next((a.value for a in node.args if _is_str(a) and a.value.startswith("--")), flag)
                self.flags[dest or long[2:].replace("-", "_")] = long

    def torch_init_calls(self) -> list[ast.Call]:
        """init_process_group calls that are torch's: `dist.init_process_group(...)`, or a bare name the script
        did not define itself."""
        calls = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "init_process_group":
                calls.append(node)
            elif isinstance(func, ast.Name) and func.id == "init_process_group" and func.id not in self.functions:
                calls.append(node)
        return sorted(calls, key=lambda c: c.lineno)

    def _function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def sources(self, expr: ast.AST, scale: float, depth: int) -> list[tuple[str, str, float]]:
        """(kind, what, scale) of what `expr`'s value comes from: ("arg", dest), ("env", NAME), ("const", text)."""
        if depth > self.MAX_DEPTH or expr is None:
            return []
        found: list[tuple[str, str, float]] = []
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool):
                return [("const", f"{expr.value:g} x {scale:g} s", scale)]
            return []
        env = _env_read(expr)
        if env is not None:
            return [("env", env, scale)]
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            return [("arg", expr.attr, scale)]
        if isinstance(expr, ast.Call):
            func = expr.func
            fname = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if fname == "timedelta":
                for k in expr.keywords:
                    if k.arg in _UNITS:
                        found += self.sources(k.value, _UNITS[k.arg], depth + 1)
                if expr.args:  # timedelta(days, seconds, ...)
                    for value, unit in zip(expr.args, ("days", "seconds", "microseconds"), strict=False):
                        if unit in _UNITS:
                            found += self.sources(value, _UNITS[unit], depth + 1)
                if not found and any(
                    isinstance(a, ast.Constant) for a in [*expr.args, *(k.value for k in expr.keywords)]
                ):
                    found.append(("const", ast.unparse(expr), scale))
                return found
            for arg in [*expr.args, *(k.value for k in expr.keywords)]:
                found += self.sources(arg, scale, depth + 1)
            return found
        if isinstance(expr, ast.IfExp):
            return self.sources(expr.body, scale, depth + 1) + self.sources(expr.orelse, scale, depth + 1)
        if isinstance(expr, ast.BinOp):
            return self.sources(expr.left, scale, depth + 1) + self.sources(expr.right, scale, depth + 1)
        if isinstance(expr, ast.BoolOp):
            return [s for v in expr.values for s in self.sources(v, scale, depth + 1)]
        if isinstance(expr, ast.Name):
            return self._name_sources(expr, scale, depth)
        return found

    def _name_sources(self, name: ast.Name, scale: float, depth: int) -> list[tuple[str, str, float]]:
        func = self._function_of(name)
        scope = func if func is not None else self.tree
        found: list[tuple[str, str, float]] = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name.id for t in node.targets):
                found += self.sources(node.value, scale, depth + 1)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name.id:
                found += self.sources(node.value, scale, depth + 1)
        if func is None:
            return found
        params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
        if name.id in params or name.id in [a.arg for a in func.args.kwonlyargs]:
            index = params.index(name.id) if name.id in params else None
            for call in ast.walk(self.tree):
                if not (isinstance(call, ast.Call) and _called_name(call) == func.name):
                    continue
                given = next((k.value for k in call.keywords if k.arg == name.id), None)
                if given is None and index is not None and index < len(call.args):
                    given = call.args[index]
                found += self.sources(given, scale, depth + 1)
        return found


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _env_read(expr: ast.AST) -> str | None:
    """NAME of `os.environ["NAME"]`, `os.environ.get("NAME", ...)`, `os.getenv("NAME", ...)`."""
    if isinstance(expr, ast.Subscript) and ast.unparse(expr.value) in ("os.environ", "environ") and _is_str(expr.slice):
        return expr.slice.value
    if isinstance(expr, ast.Call) and expr.args and _is_str(expr.args[0]):
        func = ast.unparse(expr.func)
        if func in ("os.environ.get", "environ.get", "os.getenv", "getenv"):
            return expr.args[0].value
    return None


def script_pg_timeout(spec: ClusterSpec) -> PgTimeout:
    """find_pg_timeout on the job's script (the shipped trainer's source, where no script is given)."""
    path = Path(spec.script) if spec.script else SHIPPED_TRAINER_SOURCE
    label = path.name if spec.script else "the shipped trainer"
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return PgTimeout("none", why=f"{label} could not be read ({error}): the pg timeout is left out of the grid")
    return find_pg_timeout(source, label)


# ---------------------------------------------------------------- a point's spec and flags


def point_spec(spec: ClusterSpec, s: Settings, pg: PgTimeout, name: str) -> ClusterSpec:
    """`spec` (as the vet made it) with the point's settings: its rdzv-conf keys, monitor interval, and the
    process-group timeout through the script's own option or variable."""
    conf = {**dict(spec.rdzv_conf), **s.rdzv_conf()}
    changes: dict[str, Any] = {"rdzv_conf": tuple(conf.items()), "monitor_interval": s.monitor_interval, "name": name}
    if s.pg_timeout is not None and pg.how == "arg":
        changes["script_args"] = _with_arg(spec, pg.name or "", pg.value(s.pg_timeout))
    elif s.pg_timeout is not None and pg.how == "env":
        env = {**dict(spec.env), pg.name or "": pg.value(s.pg_timeout)}
        changes["env"] = tuple(env.items())
    return dataclasses.replace(spec, **changes)


def _with_arg(spec: ClusterSpec, flag: str, value: str) -> tuple[str, ...]:
    """The script's args with `flag` set to `value` (replaced where given, else added)."""
    if spec.script is None:
        return over_trainer_defaults((*(spec.script_args or ()), flag, value))
    args = list(spec.effective_script_args)
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == flag:
            skip = True
            continue
        if arg.startswith(flag + "="):
            continue
        out.append(arg)
    return (*out, flag, value)


def torchrun_flags(spec: ClusterSpec) -> str:
    """The torchrun command a node of `spec` runs (sim.core.torchrun), as one shell line."""
    return shlex.join(torchrun_argv(spec, 0, rdzv_id="JOB_ID"))


def k8s_form(spec: ClusterSpec, pg: PgTimeout) -> str:
    """The settings as `sim export k8s` writes them for this job: the PyTorchJob's elasticPolicy.rdzvConf and
    the worker container's torchrun args (and the pg-timeout variable), as YAML."""
    import yaml

    from sim.export.k8s import export_spec

    export = export_spec(spec)
    job = next(o for o in export.objects() if o.get("kind") == "PyTorchJob")
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    wanted: dict[str, Any] = {"name": container["name"], "args": container["args"]}
    if pg.how == "env":
        wanted["env"] = [e for e in container.get("env", ()) if e.get("name") == pg.name]
    fragment = {
        "apiVersion": job["apiVersion"],
        "kind": "PyTorchJob",
        "spec": {
            "elasticPolicy": {"rdzvConf": job["spec"]["elasticPolicy"].get("rdzvConf", [])},
            "pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [wanted]}}}},
        },
    }
    return yaml.safe_dump(fragment, sort_keys=False, width=100, default_flow_style=None)


# ---------------------------------------------------------------- false restarts


def false_restarts(run: RunModel, plan: Plan, nproc: int) -> list[str]:
    """What the history shows of restarts with nothing wrong, one line each:

    - in the no-fault control window (from the run's start to its first fault): an agent's worker group failed
      or was restarted for new nodes, a worker failed, a node's container died, or an agent joined a second
      rendezvous round;
    - in each fault's window (to the next fault, or the end): a round formed with fewer nodes than the fault
      leaves, i.e. a healthy node was declared dead or left out (it rejoins later: a restart of its own)."""
    fired = _fired(run, plan)
    first = next((f.t_invoke for f in fired if f is not None), run.t_end)
    lines = []
    for r in run.agent:
        if r.t < first and r.event in ("group_failed", "new_nodes", "worker_failed"):
            lines.append(f"control: {r.node} {r.event.replace('_', ' ')} with no fault")
    rounds = {r.round for r in run.agent_events("rdzv_joined") if r.t < first and r.round is not None}
    if len(rounds) > 1:
        lines.append(f"control: {len(rounds)} rendezvous rounds with no fault (rounds {sorted(rounds)})")
    for r in run.docker:
        if r.t < first and r.action == "die" and r.node and r.node.startswith("node"):
            lines.append(f"control: {r.node}'s container exited with no fault")
    times = [f.t_invoke for f in fired if f is not None] + [run.t_end]
    for fault, floor in zip(fired, _least_nodes(plan, nproc), strict=True):
        if fault is None:
            continue
        end = next(t for t in times if t > fault.t_invoke)
        for r in run.agent_events("rdzv_joined"):
            if fault.t_invoke < r.t < end and r.nodes is not None and r.nodes < floor:
                what = f"{fault.fault} {fault.target}" if fault.target else fault.fault
                lines.append(
                    f"{what}: round {r.round} formed with {r.nodes} node(s), fewer than the {floor} it leaves: "
                    "a healthy node was left out"
                )
                break
    return lines


def _fired(run: RunModel, plan: Plan) -> list:
    """Per gauntlet step, in order: the fault event that carried it out (None: it never took effect)."""
    from sim.faults.catalog import FAULTS

    fired, cursor = [], 0.0
    for step in plan.gauntlet:
        name = FAULTS[step.fault].kind.name  # as the history records it
        event = next((f for f in run.applied_faults if f.fault == name and f.t_invoke > cursor), None)
        fired.append(event)
        cursor = event.t_invoke if event else cursor
    return fired


def _least_nodes(plan: Plan, nproc: int) -> list[int]:
    """Per gauntlet step, in order: the fewest nodes a round after it may have (what the fault itself takes)."""
    least = []
    for step in plan.gauntlet:
        before = int(step.trigger.value) // nproc
        options = step.options.given()
        kind = FAULTS[step.fault].kind
        if kind.changes_node_count:
            least.append(min(before, int(options["nodes"])))
        elif step.undo_once_recovered is not None or kind.removes_node:
            least.append(before - 1)
        else:
            least.append(before)
    return least


# ---------------------------------------------------------------- the result


@dataclasses.dataclass(frozen=True)
class PointResult:
    settings: Settings
    cluster: str
    scores: tuple[FaultScore, ...]
    false: tuple[str, ...]
    run_dirs: tuple[str, ...]
    ended_early: str | None = None

    @property
    def survived(self) -> bool:
        return bool(self.scores) and all(f.outcome == "survived" for f in self.scores)

    @property
    def qualifies(self) -> bool:
        return self.survived and not self.false and self.total_s is not None

    @property
    def total_s(self) -> float | None:
        """The summed recovery of every kind; None when one has no figure."""
        figures = [f.recovery_s for f in self.scores]
        return None if not figures or any(v is None for v in figures) else round(sum(figures), 1)

    def recovery(self, kind: str) -> float | None:
        return next((f.recovery_s for f in self.scores if f.kind == kind), None)

    def verdict(self) -> str:
        if not self.scores:
            return f"not run: {self.ended_early or 'no fault scored'}"
        failed = [f"{f.kind} {f.outcome}" for f in self.scores if f.outcome != "survived"]
        if failed:
            return "FAIL: " + ", ".join(failed)
        if self.false:
            return f"FALSE RESTART: {self.false[0]}" + (f" (+{len(self.false) - 1})" if len(self.false) > 1 else "")
        if self.total_s is None:
            return "no recovery figure for every kind"
        return "ok"

    def as_dict(self) -> dict:
        return {
            "settings": self.settings.as_dict(),
            "cluster": self.cluster,
            "verdict": self.verdict(),
            "qualifies": self.qualifies,
            "total_recovery_s": self.total_s,
            "false_restarts": list(self.false),
            "faults": [dataclasses.asdict(f) for f in self.scores],
            "run_dirs": list(self.run_dirs),
        }


def choose(points: Sequence[PointResult]) -> PointResult | None:
    """The qualifying point with the least total recovery; ties to the larger keep-alive and join margins."""
    ok = [p for p in points if p.qualifies]
    if not ok:
        return None
    return min(ok, key=lambda p: (p.total_s, -p.settings.keep_alive_s, -p.settings.join_timeout))


@dataclasses.dataclass(frozen=True)
class TuneResult:
    script: str | None
    backend: str
    nodes: int
    nproc_per_node: int
    kinds: tuple[str, ...]
    pg: PgTimeout
    grid: Grid
    points: tuple[PointResult, ...]
    wall_s: float
    best: PointResult | None
    torchrun: str | None = None  # the winner's torchrun command
    k8s: str | None = None  # the winner as `sim export k8s` writes it
    vet_command: str | None = None  # `sim vet` with the winner, to check it beside torch's defaults
    vet_defaults: str | None = None  # the same `sim vet` under torch's defaults

    def as_dict(self) -> dict:
        return {
            "script": self.script,
            "backend": self.backend,
            "nodes": self.nodes,
            "nproc_per_node": self.nproc_per_node,
            "kinds": list(self.kinds),
            "pg_timeout": {**dataclasses.asdict(self.pg), "described": self.pg.describe()},
            "nesting_rule": NESTING_RULE,
            "torch_defaults": TORCH_DEFAULTS.as_dict(),
            "budget_s": self.grid.budget_s,
            "estimate_s": self.grid.estimate_s,
            "clusters": self.grid.clusters,
            "unsafe": [{"settings": s.as_dict(), "breaks": list(why)} for s, why in self.grid.unsafe],
            "cut": [s.as_dict() for s in self.grid.cut],
            "points": [p.as_dict() for p in self.points],
            "wall_s": self.wall_s,
            "recommended": None if self.best is None else self.best.settings.as_dict(),
            "torchrun": self.torchrun,
            "k8s": self.k8s,
            "vet_command": self.vet_command,
            "vet_defaults": self.vet_defaults,
        }


# ---------------------------------------------------------------- running it


def plan_text(grid: Grid, kinds: Sequence[str], pg: PgTimeout) -> str:
    """What the tune will do and cost, before it starts."""
    lines = [f"sim tune: {', '.join(kinds)} under each of {len(grid.points)} setting(s), {grid.clusters} at once"]
    lines.append(f"  process-group timeout: {pg.describe()}")
    for i, s in enumerate(grid.points, 1):
        lines.append(f"  p{i}: {s.label()}")
    for s, why in grid.unsafe:
        lines.append(f"  unsafe, not run: {s.label()}: {why[0]}")
    for s in grid.cut:
        lines.append(f"  cut (over the budget): {s.label()}")
    lines.append(
        f"  cost: about {grid.estimate_s / 60:.1f} min of the {grid.budget_s / 60:g} min budget "
        f"({CONTROL_S:g} s no-fault control per point)"
    )
    return "\n".join(lines)


def run_tune(
    spec: ClusterSpec,
    kinds: Sequence[str],
    grid: Grid,
    pg: PgTimeout,
    *,
    docker=None,
    progress: Progress = print,
    keep: bool = False,
) -> TuneResult:
    """Each point of `grid` as a vet plan on a cluster of its own, `grid.clusters` at once; each point scored;
    the winner chosen. A batch that would start past the budget is not started (said, and listed)."""
    started = time.monotonic()
    results: list[PointResult] = []
    specs = [point_spec(spec, s, pg, f"{spec.name[:30]}-p{i + 1}") for i, s in enumerate(grid.points)]
    slower = 1.0  # how much longer than estimated the batches so far took (a loaded machine): the next is scaled
    for at in range(0, len(specs), grid.clusters):
        batch = list(zip(grid.points[at : at + grid.clusters], specs[at : at + grid.clusters], strict=True))
        spent = time.monotonic() - started
        need = max(point_cost_s(s, kinds) for s, _ in batch) * slower
        if at and spent + need > grid.budget_s:
            progress(
                f"[tune] budget: {spent:.0f} s spent, the next batch needs about {need:.0f} s here: not run "
                f"({', '.join(ps.name for _, ps in batch)})"
            )
            results += [PointResult(s, ps.name, (), (), (), "the budget ran out first") for s, ps in batch]
            continue
        batch_started = time.monotonic()
        plans = [plan_vet(ps, kinds, chosen=True, control_s=CONTROL_S) for _, ps in batch]
        for (s, ps), _plan in zip(batch, plans, strict=True):
            progress(f"[tune] {ps.name}: {s.label()}")
        lanes = run_lanes(plans, docker=docker, progress=progress, keep=keep)
        for (s, ps), lane in zip(batch, lanes, strict=True):
            results.append(score_point(s, ps, lane.plan, lane.scores, lane.run_dirs, lane.ended_early))
        slower = max(slower, (time.monotonic() - batch_started) / max(point_cost_s(s, kinds) for s, _ in batch))
    best = choose(results)
    torchrun = k8s = vet_command = vet_defaults = None
    if best is not None:
        won = point_spec(spec, best.settings, pg, spec.name)
        torchrun = torchrun_flags(won)
        k8s = k8s_form(won, pg)
        vet_command = vet_line(won, best.settings, pg, kinds)
        torch = dataclasses.replace(TORCH_DEFAULTS, pg_timeout=TORCH_DEFAULTS.pg_timeout if pg.tunable else None)
        vet_defaults = vet_line(point_spec(spec, torch, pg, spec.name), torch, pg, kinds)
    return TuneResult(
        str(spec.script) if spec.script else None,
        spec.rdzv_backend,
        spec.nodes,
        spec.nproc_per_node,
        tuple(kinds),
        pg,
        grid,
        tuple(results),
        round(time.monotonic() - started, 1),
        best,
        torchrun,
        k8s,
        vet_command,
        vet_defaults,
    )


def score_point(
    s: Settings,
    spec: ClusterSpec,
    plan: Plan,
    scores: Sequence[FaultScore],
    run_dirs: Sequence[str],
    ended_early: str | None,
) -> PointResult:
    false: list[str] = []
    for run_dir in run_dirs[:1]:  # the gauntlet's run (no kind of the tune ends the job: no solo runs)
        run = RunModel(History(Path(run_dir) / FILE_NAME).read().records)
        false = false_restarts(run, plan, spec.nproc_per_node)
    return PointResult(s, spec.name, tuple(scores), tuple(false), tuple(run_dirs), ended_early)


def vet_line(spec: ClusterSpec, s: Settings, pg: PgTimeout, kinds: Sequence[str]) -> str:
    """The `sim vet` command that runs the same kinds under the winning settings (beside one under torch's)."""
    # `sim vet` takes a script: the shipped trainer's own source where the tune ran it.
    words = ["python", "-m", "sim", "vet", str(spec.script or SHIPPED_TRAINER_SOURCE)]
    words += ["--nodes", str(spec.nodes), "--nproc-per-node", str(spec.nproc_per_node)]
    words += ["--rdzv-backend", spec.rdzv_backend, "--faults", ",".join(kinds)]
    words += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in s.rdzv_conf().items())]
    words += ["--monitor-interval", f"{s.monitor_interval:g}"]
    if s.pg_timeout is not None and pg.how == "env":
        words += ["--env", f"{pg.name}={pg.value(s.pg_timeout)}"]
    args = spec.effective_script_args
    return shlex.join(words) + (" -- " + shlex.join(args) if args else "")


def memory_clusters(wanted: int, spec: ClusterSpec, docker) -> int:
    """How many of `wanted` clusters this machine's memory holds at once beside the others (vet's rule)."""
    from sim.engines.cluster import other_clusters_memory

    if wanted <= 1 or not getattr(docker, "local", False):
        return wanted
    return clusters_that_fit(wanted, spec, other_clusters_memory(docker, spec.name))


# ---------------------------------------------------------------- the outputs


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def table(tune: TuneResult) -> str:
    kinds = tune.kinds
    head = f"{'':4}{'settings':72} " + " ".join(f"{k:>11}" for k in kinds) + f" {'total':>8}  verdict"
    lines = [
        f"sim tune: {tune.script or 'the shipped trainer'} on {tune.nodes} nodes x {tune.nproc_per_node}, "
        f"{tune.backend}, {tune.wall_s:.0f} s ({len(tune.points)} point(s), {tune.grid.clusters} at once)",
        head,
    ]
    for i, p in enumerate(tune.points, 1):
        mark = "*" if tune.best is not None and p is tune.best else " "
        row = f"{mark}p{i:<2}{p.settings.label()[:72]:72} "
        row += " ".join(f"{_s(p.recovery(k)):>11}" for k in kinds) + f" {_s(p.total_s):>8}  {p.verdict()}"
        lines.append(row)
    return "\n".join(lines)


def render(tune: TuneResult) -> str:
    """The table, then the recommendation in torchrun's and Kubernetes' words."""
    out = [table(tune)]
    if tune.best is None:
        out.append(
            "no recommendation: no point survived every kind without a false restart; "
            "widen the grid (--keep-alive, --last-call) or read each point's verdict above"
        )
        return "\n".join(out)
    s = tune.best.settings
    out.append(f"recommended: {s.label()} (total recovery {tune.best.total_s:.1f} s)")
    if tune.pg.tunable and s.pg_timeout is not None:
        out.append(f"  process-group timeout: {tune.pg.describe()}: {tune.pg.name} {tune.pg.value(s.pg_timeout)}")
    else:
        out.append(f"  process-group timeout: {tune.pg.describe()}")
    out.append("torchrun:")
    out.append(f"  {tune.torchrun}")
    if tune.pg.how == "env" and s.pg_timeout is not None:
        out.append(f"  with {tune.pg.name}={tune.pg.value(s.pg_timeout)} in the workers' environment")
    out.append("Kubernetes (as `sim export k8s` writes it; the rest of the PyTorchJob unchanged):")
    out += [f"  {line}" for line in (tune.k8s or "").rstrip().splitlines()]
    out.append("check it beside torch's defaults (the two scorecards' recovery columns):")
    out.append(f"  {tune.vet_command}")
    out.append(f"  {tune.vet_defaults}")
    return "\n".join(out)


def render_html(tune: TuneResult) -> str:
    esc = html.escape
    kinds = tune.kinds
    head = "".join(f"<th>{esc(h)}</th>" for h in ("", "settings", *kinds, "total", "verdict"))
    rows = []
    for i, p in enumerate(tune.points, 1):
        best = tune.best is not None and p is tune.best
        cells = [f"{'★ ' if best else ''}p{i}", p.settings.label(), *(_s(p.recovery(k)) for k in kinds)]
        cells += [_s(p.total_s), p.verdict()]
        style = " class=best" if best else " class=skip" if not p.scores else " class=bad" if not p.qualifies else ""
        rows.append(f"<tr{style}>" + "".join(f"<td>{esc(str(c))}</td>" for c in cells) + "</tr>")
    extra = []
    for s, why in tune.grid.unsafe:
        extra.append(f"<li>unsafe, not run: {esc(s.label())}: {esc('; '.join(why))}</li>")
    for s in tune.grid.cut:
        extra.append(f"<li>cut (over the budget): {esc(s.label())}</li>")
    false = "".join(f"<li>p{i}: {esc(line)}</li>" for i, p in enumerate(tune.points, 1) for line in p.false)
    if tune.best is not None:
        s = tune.best.settings
        rec = (
            f"<h2>Recommended</h2><p>{esc(s.label())}: total recovery {tune.best.total_s:.1f} s</p>"
            f"<h3>torchrun</h3><pre>{esc(tune.torchrun or '')}</pre>"
            f"<h3>Kubernetes (as <code>sim export k8s</code> writes it)</h3><pre>{esc(tune.k8s or '')}</pre>"
            "<h3>Check it beside torch's defaults</h3><p>The recommendation, then torch's defaults: compare the "
            f"two scorecards' recovery columns.</p><pre>{esc(tune.vet_command or '')}\n"
            f"{esc(tune.vet_defaults or '')}</pre>"
        )
    else:
        rec = "<h2>No recommendation</h2><p>No point survived every kind without a false restart.</p>"
    rule = esc(NESTING_RULE)
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>sim tune</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:3px 6px;font-size:13px}.best{background:#e8f7e8;font-weight:bold}.bad{color:#a00}.skip{color:#888}"
        "pre{background:#f4f4f4;padding:8px;white-space:pre-wrap}</style></head><body>"
        f"<h1>sim tune</h1><p>{esc(tune.script or 'the shipped trainer')} on {tune.nodes} nodes x "
        f"{tune.nproc_per_node}, {esc(tune.backend)}: {esc(', '.join(kinds))}; {len(tune.points)} point(s), "
        f"{tune.grid.clusters} at once, {tune.wall_s:.0f} s of a {tune.grid.budget_s:.0f} s budget</p>"
        f"<p>Process-group timeout: {esc(tune.pg.describe())}</p>"
        f"<table><tr>{head}</tr>{''.join(rows)}</table>"
        + (f"<ul>{''.join(extra)}</ul>" if extra else "")
        + (f"<h2>False restarts</h2><ul>{false}</ul>" if false else "")
        + rec
        + f"<h2>The nesting rule</h2><pre>{rule}</pre>"
        f"<p>torch's defaults: {esc(TORCH_DEFAULTS.label())}</p></body></html>\n"
    )


def write_outputs(tune: TuneResult, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / "tune.json", "html": out_dir / "tune.html"}
    files["json"].write_text(json.dumps(tune.as_dict(), indent=2, default=str) + "\n", encoding="utf-8")
    files["html"].write_text(render_html(tune), encoding="utf-8")
    return files


def parse_grid(
    spec: ClusterSpec, options: Mapping[str, str | None]
) -> tuple[list[Settings], list[tuple[Settings, tuple[str, ...]]], PgTimeout]:
    """The grid from the user's lists, split safe and unsafe, and the script's process-group timeout: every input
    checked (one line each) before anything starts. `options`: keep_alive, last_call, join, monitor, pg_timeout,
    each a comma-separated list or None (DEFAULT_GRID's)."""
    if spec.rdzv_backend not in DYNAMIC_BACKENDS:
        raise UsageError(
            f"--rdzv-backend {spec.rdzv_backend}: its handler reads none of the tuned keys; tune on one of "
            f"{', '.join(DYNAMIC_BACKENDS)} (torch's dynamic rendezvous)"
        )
    pg = script_pg_timeout(spec)
    keep_alive = parse_keep_alive(options.get("keep_alive") or DEFAULT_GRID["keep_alive"])
    last_call = parse_whole("--last-call", options.get("last_call") or DEFAULT_GRID["last_call"])
    join = parse_whole("--join", options["join"]) if options.get("join") else None
    monitor = parse_seconds("--monitor", options.get("monitor") or DEFAULT_GRID["monitor"])
    pg_given = options.get("pg_timeout")
    if pg_given and not pg.tunable:
        raise UsageError(f"--pg-timeout {pg_given}: {pg.describe()}")
    pg_values = parse_seconds("--pg-timeout", pg_given or DEFAULT_GRID["pg_timeout"]) if pg.tunable else None
    safe, unsafe = make_grid(keep_alive, last_call, join, monitor, pg_values)
    return safe, unsafe, pg


def prepare(
    options: Mapping[str, Any],
    script_args: Sequence[str] | None,
    grid_options: Mapping[str, str | None],
    budget_s: float,
    *,
    parallel: int | None = None,
    docker=None,
) -> tuple[ClusterSpec, tuple[str, ...], Grid, PgTimeout]:
    """The job's spec as the vet runs it, the kinds, the grid cut to the budget and the script's pg timeout:
    every input checked before anything starts. Shared by `sim tune` and the pytest plugin's sim_tune."""
    from sim.vet.gauntlet import cluster_count
    from sim.vet.gauntlet import prepare as vet_prepare

    if not budget_s > 0:
        raise UsageError(f"--budget {budget_s:g}s: give a time above zero, e.g. --budget 10m")
    kinds = parse_kinds(grid_options.get("faults"))
    spec, kinds = vet_prepare(options, script_args, ",".join(kinds))
    safe, unsafe, pg = parse_grid(spec, grid_options)
    wanted = cluster_count(parallel, spec)
    if spec.engine == "swarm":
        raise UsageError("sim tune runs its clusters on this engine; drop --engine swarm")
    fit_budget(safe, unsafe, kinds, wanted, budget_s)  # refused now, before the engine is asked, if none fits
    clusters = memory_clusters(wanted, spec, docker) if docker is not None else wanted
    return spec, kinds, fit_budget(safe, unsafe, kinds, clusters, budget_s), pg
