"""Chaos scenario files (YAML): a cluster, a schedule of faults and the outcome expected.

A file is parsed and checked whole before anything starts, and every error is one line naming
the file, the line and the field, e.g.
`chaos/scenarios/x.yaml:14: steps[1].at.step: 'ten' is not a whole number; use e.g. step: 30`.
To know lines, the file is read as PyYAML's node tree (`compose`), not as plain Python values.
The format, field by field, is in chaos/scenarios/FORMAT.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.core.errors import UsageError
from sim.core.faultoptions import FLAG, NODE_TARGET, NODES, NODES_PAIR, TARGET, FaultOptions, Option, option_of
from sim.core.hostpaths import check_mount, parse_mount
from sim.core.parse import parse_duration
from sim.core.sidechannel import compile_progress_regex
from sim.core.spec import (
    DEFAULT_PIDS,
    DEFAULT_TRAINER_ARGS,
    DEVICE_MODES,
    ETCD_BACKENDS,
    FAILURE_TIMINGS,
    NO_LIMIT,
    RDZV_BACKENDS,
    ClusterSpec,
    GpuRequest,
    check_fits_in_memory,
    check_script_path,
    node_name,
    parse_size,
    spec_from_options,
)
from sim.faults.catalog import FAULTS
from sim.faults.targets import ETCD, ROLE_TARGETS
from sim.verdict.checkers import CHECKERS

OUTCOMES = ("recovers", "fails", "hangs")  # as sim.verdict.checkers.RunSpec.expected
TRIGGER_KINDS = ("time", "step", "after", "world_size", "round", "recovered", "joining")
# `recovered: N`: every rank of a world of N trained this many steps in a row (by step number) since its
# newest start, after the previous step acted (the job is steady again: `sim vet` waits for it between faults).
RECOVERED_STEPS = 5
DEFAULT_PROFILE = "fast"
DEFAULT_TIMEOUT_S = 600.0
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")

PROFILES: dict[str, dict[str, dict]] = {
    # Feedback in seconds: torch's defaults wait 30 s per rendezvous below max nodes, notice a
    # lost node after 15 s, and gloo times out after 30 minutes. Whole numbers: torch reads these
    # with get_as_int, and only these keys: it ignores unknown ones silently.
    "fast": {
        "rdzv_conf": {
            "last_call_timeout": 2,
            "join_timeout": 120,
            "keep_alive_interval": 1,
            "keep_alive_max_attempt": 3,
            "close_timeout": 5,
        },
        "trainer": {"pg_timeout": 15},
        # torch 2.13's shared rendezvous TCP store makes joining nodes hang (README, known torch behaviour).
        "env": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
    },
    "torch-defaults": {},
}


# ---------------------------------------------------------------- the scenario as data


@dataclass(frozen=True)
class Trigger:
    """When a step fires: `time`/`after` in seconds, the others whole numbers."""

    kind: str
    value: float | int
    lag_s: float = 0.0  # `after` beside another trigger: fire this long after that one is reached

    def __post_init__(self) -> None:
        if not isinstance(self.lag_s, (int, float)) or isinstance(self.lag_s, bool) or not self.lag_s >= 0:
            raise UsageError(f"trigger lag {self.lag_s!r}: must be a number of seconds >= 0")
        if self.kind not in TRIGGER_KINDS:
            raise UsageError(f"trigger {self.kind!r}: unknown; use one of {', '.join(TRIGGER_KINDS)}")
        seconds = self.kind in ("time", "after")
        least = 1 if self.kind in ("world_size", "recovered", "joining") else 0
        if (
            isinstance(self.value, bool)
            or not isinstance(self.value, (int, float) if seconds else int)
            or not self.value >= least
        ):
            unit = "a number of seconds" if seconds else "a whole number"
            raise UsageError(f"trigger {self.kind} {self.value!r}: must be {unit} >= {least}")
        if seconds:
            object.__setattr__(self, "value", float(self.value))


@dataclass(frozen=True)
class Step:
    """One fault of the schedule. `options` are the fault's (sim.faults.catalog), defaults filled in;
    a mapping of option names to parsed values is turned into them."""

    fault: str
    options: FaultOptions | Mapping[str, Any] = field(default_factory=dict)
    trigger: Trigger = Trigger("after", 0.0)
    duration_s: float | None = None  # undo after this long (reversible faults only)
    repeat_times: int = 1
    repeat_every_s: float | None = None
    line: int = 0  # in the scenario file; 0 when built in Python
    # Undo sooner, once the job is steady at this world size since the fault acted (`sim vet`: a frozen
    # node is thawed as soon as the others have regrouped without it; duration_s stays the longest hold).
    undo_once_recovered: int | None = None

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise UsageError(f"fault {self.fault!r}: unknown; use one of {', '.join(FAULTS)}")
        fault = FAULTS[self.fault]
        if not isinstance(self.options, fault.options):
            object.__setattr__(self, "options", fault.make_options(self.options))
        _check_duration(self.fault, self.duration_s)
        if self.undo_once_recovered is not None and (self.duration_s is None or self.undo_once_recovered < 1):
            raise UsageError(f"fault {self.fault}: undo_once_recovered needs a duration and a world size >= 1")
        _check_repeat(self.repeat_times, self.repeat_every_s, self.duration_s)


@dataclass(frozen=True)
class Expectation:
    """The verdict the checkers must reach, per backend, and the bounds they enforce."""

    outcome_by_backend: dict[str, str]
    max_recovery_s: float | None = None
    max_steps_lost: int | None = None
    hang_s: float | None = None
    fail_fast_s: float | None = None
    checkers: tuple[str, ...] | None = None  # None: every checker that applies to the outcome

    def __post_init__(self) -> None:
        for name in self.checkers or ():
            if name not in CHECKERS:
                raise UsageError(f"checker {name!r}: unknown; use some of {', '.join(CHECKERS)}")
        for backend, outcome in self.outcome_by_backend.items():
            if outcome not in OUTCOMES:
                raise UsageError(f"outcome {outcome!r} for {backend}: use one of {', '.join(OUTCOMES)}")
        for name in ("max_recovery_s", "hang_s", "fail_fast_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise UsageError(f"{name} {value!r}: must be a number of seconds > 0")
        if self.max_steps_lost is not None and not _is_whole(self.max_steps_lost, 0):
            raise UsageError(f"max_steps_lost {self.max_steps_lost!r}: must be a whole number >= 0")

    def outcome(self, backend: str) -> str:
        if backend not in self.outcome_by_backend:
            given = ", ".join(self.outcome_by_backend) or "none"
            raise UsageError(f"backend {backend!r}: no expected outcome (given for {given})")
        return self.outcome_by_backend[backend]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    path: str | None = None  # the file it came from
    cluster: dict = field(default_factory=dict)  # ClusterSpec keyword arguments, rdzv_backend aside
    backends: tuple[str, ...] = ("etcd-v2",)  # the scenario runs once per backend
    trainer: dict = field(default_factory=dict)  # the shipped trainer's args (TRAINER_KEYS)
    profile: str = DEFAULT_PROFILE
    seed: int | None = None  # None: chosen at run time, and recorded
    steps: tuple[Step, ...] = ()
    expect: Expectation | None = None  # None: recovers, on every backend
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_description(self.description)
        if self.profile not in PROFILES:
            raise UsageError(f"profile {self.profile!r}: unknown; use one of {', '.join(PROFILES)}")
        _check_backends(tuple(self.backends))
        object.__setattr__(self, "backends", tuple(self.backends))
        object.__setattr__(self, "steps", tuple(self.steps))
        if self.expect is None:
            object.__setattr__(self, "expect", Expectation(dict.fromkeys(self.backends, "recovers")))
        for backend in self.backends:
            self.expect.outcome(backend)
        if self.seed is not None and not _is_whole(self.seed, 0):
            raise UsageError(f"seed {self.seed!r}: must be a whole number >= 0")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise UsageError(f"timeout {self.timeout_s!r}: must be a number of seconds > 0")


def _is_whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name):
        raise UsageError(f"{name!r} is not a scenario name; use lowercase letters, digits and '-', e.g. worker-crash")


def _check_description(text: str) -> None:
    if not text.strip() or "\n" in text.strip():
        raise UsageError("a description is one line of text, shown by `sim chaos list`")


def _check_backends(backends: tuple[str, ...]) -> None:
    if not backends:
        raise UsageError("no backend; name at least one, e.g. etcd-v2")
    for backend in backends:
        if backend not in RDZV_BACKENDS:
            raise UsageError(f"backend {backend!r}: unknown; use one of {', '.join(RDZV_BACKENDS)}")
        if backends.count(backend) > 1:
            raise UsageError(f"backend {backend!r} named twice; name each once")


def _check_duration(fault: str, duration_s: float | None) -> None:
    if duration_s is None:
        return
    if not FAULTS[fault].reversible:
        reversible = ", ".join(name for name, kind in FAULTS.items() if kind.reversible)
        raise UsageError(f"{fault} cannot be undone, so it takes no duration; only {reversible} do")
    if not duration_s > 0:
        raise UsageError(f"duration {duration_s!r}: must be above zero, e.g. 20s")


def _check_repeat(times: int, every_s: float | None, duration_s: float | None) -> None:
    if not _is_whole(times, 1):
        raise UsageError(f"repeat times {times!r}: must be a whole number >= 1")
    if times > 1 and not (every_s is not None and every_s > 0):
        raise UsageError("repeat: give every, the time between repetitions, e.g. every: 20s")
    if times > 1 and duration_s is not None and duration_s >= every_s:
        raise UsageError(
            f"repeat every {every_s:g}s, but each lasts {duration_s:g}s: the next would start "
            "before the last is undone; make every longer than duration"
        )


# ---------------------------------------------------------------- the file, node by node


class _Field:
    """One YAML node and where it is: the file, its line and the path of keys to it."""

    def __init__(self, node: yaml.Node, path: str, doc: _Doc):
        self.node, self.path, self.doc = node, path, doc

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    @property
    def key(self) -> str:
        """The last key of the path: "step" of steps[1].at.step."""
        return self.path.rsplit(".", 1)[-1]

    def child(self, path: str, node: yaml.Node | None = None) -> _Field:
        return _Field(self.node if node is None else node, f"{self.path}.{path}" if self.path else path, self.doc)

    def absent(self, key: str) -> _Field:
        """A key not given, as if given empty (null), at this field's line."""
        mark = self.node.start_mark
        return self.child(key, yaml.ScalarNode("tag:yaml.org,2002:null", "", mark, mark))

    def error(self, problem: str) -> UsageError:
        return UsageError(f"{self.doc.source}:{self.line}: {self.path or 'top level'}: {problem}")

    def checked(self, build: Callable, *args: Any, **kwargs: Any) -> Any:
        """build(...), a UsageError from it placed at this field."""
        try:
            return build(*args, **kwargs)
        except UsageError as error:
            raise self.error(str(error)) from None

    def is_null(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode) and self.value() is None

    def what(self) -> str:
        if isinstance(self.node, yaml.ScalarNode):
            return repr(self.node.value) if self.node.value else "nothing"
        return "a list" if isinstance(self.node, yaml.SequenceNode) else "a mapping"

    # --- shapes

    def mapping(self, keys: Sequence[str] | None, required: Iterable[str] = ()) -> dict[str, _Field]:
        """Its values by key. Keys outside `keys` (None: any) are errors; nothing given is empty."""
        if self.is_null():
            fields = {}
        elif not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"expected a mapping (key: value lines); got {self.what()}")
        else:
            try:
                self.doc.loader.flatten_mapping(self.node)  # YAML merge keys (<<: *defaults)
            except yaml.MarkedYAMLError as error:  # e.g. `<<: [1, 2]`: only mappings merge
                raise self.error(f"{error.problem}; merge (<<) only mappings, e.g. <<: *defaults") from None
            fields = {}
            for key_node, value_node in self.node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                at_key = self.child(str(name), key_node)
                if not name:
                    raise at_key.error("a key must be a plain name")
                if keys is not None and name not in keys:
                    hint = _did_you_mean(name, keys)
                    raise at_key.error(f"unknown key {name!r}{hint}; use one of: {', '.join(keys)}")
                if name in fields:
                    raise at_key.error("given twice; keep one")
                fields[name] = self.child(name, value_node)
        for name in required:
            if name not in fields:
                raise self.child(name).error("missing; it is required here")
        return fields

    def items(self) -> list[_Field]:
        if self.is_null():
            return []
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"expected a list; got {self.what()}")
        return [_Field(node, f"{self.path}[{i}]", self.doc) for i, node in enumerate(self.node.value)]

    # --- single values

    def value(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error(f"expected a single value; got {self.what()}")
        try:
            return self.doc.loader.construct_object(self.node)
        except yaml.YAMLError as error:
            raise self.error(getattr(error, "problem", None) or str(error)) from None
        except ValueError:  # Python refuses to read an int of more than 4300 digits
            raise self.error(
                f"a number of {len(self.node.value)} digits is too long to read; use a number of a few digits"
            ) from None

    def text(self) -> str:
        """The scalar as written (so 1:30 stays "1:30", not YAML 1.1's sexagesimal 90)."""
        if self.value() is None:
            raise self.error("no value; give one")
        return self.node.value

    def whole(self, least: int, example: int) -> int:
        value = self.value()
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"{self.node.value!r} is not a whole number; use e.g. {self.key}: {example}")
        if value < least:
            raise self.error(f"{value} is below {least}; use e.g. {self.key}: {example}")
        return value

    def seconds(self, positive: bool = False) -> float:
        seconds = self.checked(parse_duration, self.text())
        if positive and seconds <= 0:
            raise self.error(f"{self.node.value!r} must be above zero; use e.g. {self.key}: 30s")
        return seconds

    def flag(self) -> bool:
        value = self.value()
        if not isinstance(value, bool):
            raise self.error(f"{self.node.value!r} is not true or false")
        return value

    def choice(self, choices: Sequence[str], what: str) -> str:
        text = self.text()
        if text not in choices:
            hint = _did_you_mean(text, choices)
            raise self.error(f"{text!r} is not {what}{hint}; use one of: {', '.join(choices)}")
        return text


@dataclass
class _Doc:
    source: str
    loader: yaml.SafeLoader  # constructs scalars (ints, bools, nulls) as YAML types them


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------- a step's options, where it stands


@dataclass(frozen=True)
class _Where:
    """What a step may name at its place in the schedule: the nodes that exist then (a `scale`
    step before it changes them), the backends, the largest world size torchrun allows, and the
    shipped trainer's last step (None for a user script)."""

    nodes: tuple[str, ...]
    backends: tuple[str, ...]
    max_world: int
    last_step: int | None

    def check_node(self, field: _Field, name: str) -> None:
        if name not in self.nodes:
            known = ", ".join(self.nodes) or "no nodes"
            raise field.error(f"unknown node {name!r}; the cluster has {known} at this step")

    def require_etcd(self, field: _Field, what: str) -> None:
        for backend in self.backends:
            if backend not in ETCD_BACKENDS:
                raise field.error(
                    f"{what} needs an etcd backend ({', '.join(ETCD_BACKENDS)}), "
                    f"but the scenario runs on {backend}, which has no etcd"
                )


def _read_option(f: _Field, option: Option, where: _Where) -> Any:
    """One option of a step, read as its Kind says; YAML types whole numbers and flags itself."""
    kind = option.kind
    if kind is FLAG:
        return f.flag()
    if kind.name == "whole":
        return f.whole(kind.least, kind.example)
    if kind is NODES_PAIR:
        sides = f.items()
        if len(sides) != 2:
            raise f.error("give [from, to], e.g. one_way: [node0, etcd]")
        return tuple(map(_read_nodes, sides))
    if kind is NODES:
        return _read_nodes(f)
    value = f.checked(kind.parse, f.text())
    if kind in (TARGET, NODE_TARGET):
        _check_target(f, value, where, allow_etcd=kind is TARGET)
    return value


def _read_nodes(f: _Field) -> tuple[str, ...]:
    """A YAML list of node names, or one comma-separated string as on the command line."""
    if isinstance(f.node, yaml.SequenceNode):
        return tuple(item.text() for item in f.items())
    return f.checked(NODES.parse, f.text())


def _check_target(f: _Field, target: str, where: _Where, *, allow_etcd: bool) -> None:
    if target == ETCD:
        if not allow_etcd:
            raise f.error("this fault acts on a node's training processes, which etcd has none of; name a node")
        where.require_etcd(f, "target etcd")
    elif target == "store-host":
        for backend in where.backends:
            if backend in ETCD_BACKENDS:
                raise f.error(f"with backend {backend} the store is etcd; target etcd instead")
    elif target not in ROLE_TARGETS:
        where.check_node(f, target)


# ---------------------------------------------------------------- reading each section

_TOP_KEYS = ("name", "description", "cluster", "trainer", "profile", "seed", "steps", "expect", "timeout")
_CLUSTER_WHOLE = {"nodes": 1, "min_nodes": 1, "max_nodes": 1, "nproc_per_node": 1, "max_restarts": 0}  # -> least
_CLUSTER_KEYS = (
    *_CLUSTER_WHOLE,
    "monitor_interval",
    "gpus",
    "rdzv_backend",
    "rdzv_conf",
    "env",
    "env_show",
    "script",
    "script_args",
    "progress",
    "instrument",
    "memory",
    "pids",
    "ckpt_size",
    "devices",
    "failure_timing",
    "project_dir",
    "mounts",
    "requirements",
    "image",
)
_TRAINER_READERS: dict[str, Callable[[_Field], Any]] = {
    "steps": lambda f: f.whole(1, 120),
    "step_time": lambda f: f.seconds(),
    "ckpt_interval": lambda f: f.whole(1, 10),
    "pg_timeout": lambda f: f.seconds(positive=True),
    "batch_size": lambda f: f.whole(1, 16),
}
TRAINER_KEYS = tuple(_TRAINER_READERS)
# Under the profile's and the scenario's trainer args: `sim up`'s own defaults for the shipped trainer.
_TRAINER_BASE = {
    flag[2:].replace("-", "_"): float(value) if "." in value else int(value)
    for flag, value in zip(DEFAULT_TRAINER_ARGS[::2], DEFAULT_TRAINER_ARGS[1::2], strict=True)
}
_STEP_KEYS = ("fault", "at", "duration", "repeat")
_TRIGGER_EXAMPLES = {"step": 30, "world_size": 4, "round": 1, "recovered": 3, "joining": 3}
_EXPECT_KEYS = ("outcome", "checkers", "max_recovery_s", "max_steps_lost", "hang_s", "fail_fast_s")


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such scenario file") from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise UsageError(
            f"{path}:{line}: not UTF-8 text (byte 0x{error.object[error.start]:02x}); save the file as UTF-8"
        ) from None
    except IsADirectoryError:
        raise UsageError(f"{path}: a directory; give a scenario file (.yaml) or a shipped name") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read it ({error.strerror}); check the path and its permissions") from None
    return parse_scenario(text, str(path))


def parse_scenario(text: str, source_name: str = "<scenario>") -> Scenario:
    """Parse and check a whole scenario; relative script paths are relative to `source_name`."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        raise UsageError(f"{source_name}:{mark.line + 1 if mark else 1}: not valid YAML: {error.problem}") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{source_name}:1: not valid YAML: {error}") from None
    except RecursionError:
        raise _too_deep(source_name, loader) from None
    if root is None:
        raise UsageError(f"{source_name}:1: empty; a scenario needs at least name, description and expect")
    try:
        return _read_scenario(_Field(root, "", _Doc(source_name, loader)))
    except RecursionError:  # YAML merge keys (<<) are flattened recursively too
        raise _too_deep(source_name, loader) from None
    finally:
        loader.dispose()


def _too_deep(source_name: str, loader: yaml.SafeLoader) -> UsageError:
    # PyYAML reads nested lists and mappings by recursion, so a runaway nesting exhausts Python's stack.
    return UsageError(
        f"{source_name}:{loader.get_mark().line + 1}: nested too deeply to read; a scenario needs "
        "only a few levels of lists and mappings: look for unclosed [ or {, or runaway indentation"
    )


def _read_scenario(top: _Field) -> Scenario:
    fields = top.mapping(_TOP_KEYS, required=("name", "description", "expect"))
    name, description = fields["name"].text(), fields["description"].text()
    fields["name"].checked(_check_name, name)
    fields["description"].checked(_check_description, description)
    cluster_field = fields.get("cluster") or top.absent("cluster")
    cluster, backends = _read_cluster(cluster_field, Path(top.doc.source).parent)
    trainer = _read_trainer(fields["trainer"], cluster) if "trainer" in fields else {}
    profile = fields["profile"].choice(tuple(PROFILES), "a profile") if "profile" in fields else DEFAULT_PROFILE
    for backend in backends:  # the cluster `sim up` would make, checked now rather than at `up`
        cluster_field.checked(spec_from_options, _spec_options(profile, cluster, trainer, backend), None)
    seed = None if "seed" not in fields or fields["seed"].is_null() else fields["seed"].whole(0, 7)
    where = _where(cluster, backends, None if "script" in cluster else _trainer_args(profile, trainer)["steps"])
    steps = []
    for item in fields["steps"].items() if "steps" in fields else []:
        steps.append(_read_step(item, where))
        if FAULTS[steps[-1].fault].kind.changes_node_count:
            nproc = cluster.get("nproc_per_node", ClusterSpec.nproc_per_node)
            item.checked(check_fits_in_memory, "scale to", steps[-1].options.nodes, nproc)
            where = dataclasses.replace(where, nodes=_node_names(steps[-1].options.nodes))
    expect = _read_expect(fields["expect"], backends)
    timeout = fields["timeout"].seconds(positive=True) if "timeout" in fields else DEFAULT_TIMEOUT_S
    return top.checked(
        Scenario,
        name,
        description,
        top.doc.source,
        cluster,
        backends,
        trainer,
        profile,
        seed,
        tuple(steps),
        expect,
        timeout,
    )


def _read_cluster(f: _Field, base_dir: Path) -> tuple[dict, tuple[str, ...]]:
    fields = f.mapping(_CLUSTER_KEYS)
    cluster: dict[str, Any] = {
        key: fields[key].whole(least, 2) for key, least in _CLUSTER_WHOLE.items() if key in fields
    }
    if "monitor_interval" in fields:
        cluster["monitor_interval"] = fields["monitor_interval"].seconds(positive=True)
    if "gpus" in fields:
        cluster["gpus"] = fields["gpus"].checked(GpuRequest.parse, fields["gpus"].text())
    for key in ("rdzv_conf", "env"):
        if key in fields:
            cluster[key] = tuple((name, value.text()) for name, value in fields[key].mapping(None).items())
    for key in ("project_dir", "requirements"):  # host paths, relative to the scenario file
        if key in fields and not fields[key].is_null():
            path = base_dir / fields[key].text()
            if not path.exists():
                raise fields[key].error(f"no such path {str(path)!r}; give a path relative to the scenario file")
            cluster[key] = str(path)
    if "mounts" in fields:
        cluster["mounts"] = tuple(_read_mount(item, base_dir) for item in fields["mounts"].items())
    if "image" in fields and not fields["image"].is_null():
        cluster["image"] = fields["image"].text()
    if "script" in fields and not fields["script"].is_null():
        script = base_dir / fields["script"].text()
        if not script.exists():
            raise fields["script"].error(f"no such file {str(script)!r}; give a path relative to the scenario file")
        cluster["script"] = fields["script"].checked(check_script_path, "script", script)
    if "script_args" in fields:
        if "script" not in cluster:
            raise fields["script_args"].error(
                "only for a user script (cluster.script); give the shipped trainer's args under trainer:"
            )
        cluster["script_args"] = tuple(arg.text() for arg in fields["script_args"].items())
    if "progress" in fields and not fields["progress"].is_null():
        pattern = fields["progress"].text()
        fields["progress"].checked(compile_progress_regex, pattern, flag="")
        cluster["progress_regex"] = pattern
    if "instrument" in fields:
        cluster["instrument"] = fields["instrument"].flag()
    if "env_show" in fields:
        cluster["env_show"] = fields["env_show"].flag()
    if "devices" in fields:
        cluster["devices"] = fields["devices"].choice(DEVICE_MODES, "a device mode")
    if "failure_timing" in fields:
        cluster["failure_timing"] = fields["failure_timing"].choice(FAILURE_TIMINGS, "a failure timing")
    for key in ("memory", "ckpt_size"):  # sizes: 2g, 64m (memory: none lifts the default limit)
        if key in fields:
            cluster[key] = fields[key].text()
            if not (key == "memory" and cluster[key].strip().lower() == NO_LIMIT):
                fields[key].checked(parse_size, key, cluster[key])
    if "pids" in fields:
        cluster["pids"] = fields["pids"].whole(1, DEFAULT_PIDS)
    backends = _read_backends(fields["rdzv_backend"]) if "rdzv_backend" in fields else (ClusterSpec.rdzv_backend,)
    return cluster, backends


def _read_mount(f: _Field, base_dir: Path) -> tuple[str, str, bool]:
    """One `cluster.mounts` item, `HOST:CONTAINER[:rw]`, the host path relative to the scenario file."""
    host, target, writable = f.checked(parse_mount, f.text())
    return f.checked(check_mount, str(base_dir / host), target, writable)


def _read_backends(f: _Field) -> tuple[str, ...]:
    items = f.items() if isinstance(f.node, yaml.SequenceNode) else [f]
    backends = tuple(item.choice(RDZV_BACKENDS, "a rendezvous backend") for item in items)
    f.checked(_check_backends, backends)
    return backends


def _read_trainer(f: _Field, cluster: Mapping[str, Any]) -> dict:
    if "script" in cluster:
        raise f.error(
            "args of the shipped trainer, but cluster.script names your own; pass its args in cluster.script_args"
        )
    return {key: _TRAINER_READERS[key](value) for key, value in f.mapping(TRAINER_KEYS).items()}


def _node_names(count: int) -> tuple[str, ...]:
    return tuple(node_name(i) for i in range(count))


def _where(cluster: Mapping[str, Any], backends: tuple[str, ...], last_step: int | None) -> _Where:
    nodes = cluster.get("nodes", ClusterSpec.nodes)
    max_nodes = cluster.get("max_nodes") or max(nodes, cluster.get("min_nodes", ClusterSpec.min_nodes))
    max_world = max_nodes * cluster.get("nproc_per_node", ClusterSpec.nproc_per_node)
    return _Where(_node_names(nodes), backends, max_world, last_step)


def _read_step(item: _Field, where: _Where) -> Step:
    fault_field = item.mapping(None, required=("fault",))["fault"]
    fault = FAULTS[fault_field.choice(tuple(FAULTS), "a fault")]
    fields = item.mapping((*_STEP_KEYS, *fault.option_names), required=("at", *fault.required))
    if fault.needs_etcd:
        where.require_etcd(fault_field, fault.name)
    given = {f.name: _read_option(fields[f.name], option_of(f), where) for f in fault.fields if f.name in fields}
    options = item.checked(fault.make_options, given)
    if fault.check_nodes:
        # Built on each backend now, so a bad shape (a node named twice, unknown) fails before the run.
        at = fields[next(iter(given))] if len(given) == 1 else item
        for backend in where.backends:
            at.checked(fault.check_nodes, options, where.nodes, backend in ETCD_BACKENDS)
    trigger = _read_trigger(fields["at"], where)
    duration = None
    if "duration" in fields:
        duration = fields["duration"].seconds()
        fields["duration"].checked(_check_duration, fault.name, duration)
    times, every = _read_repeat(fields["repeat"], duration) if "repeat" in fields else (1, None)
    return item.checked(Step, fault.name, options, trigger, duration, times, every, item.line)


def _read_trigger(f: _Field, where: _Where) -> Trigger:
    fields = f.mapping(TRIGGER_KINDS)
    # `after` beside another trigger is a lag: `{joining: 3, after: 3s}` fires 3 s after 3 agents joined.
    lag = fields.pop("after").seconds() if "after" in fields and len(fields) == 2 else 0.0
    if len(fields) != 1:
        raise f.error(f"give exactly one of {', '.join(TRIGGER_KINDS)}; got {' and '.join(fields) or 'none'}")
    ((kind, value),) = fields.items()
    if kind in ("time", "after"):
        return value.checked(Trigger, kind, value.seconds(), lag)
    trigger = value.checked(Trigger, kind, value.whole(0, _TRIGGER_EXAMPLES[kind]), lag)
    if kind in ("world_size", "recovered") and trigger.value > where.max_world:
        raise value.error(f"{trigger.value} is never reached: at most max_nodes x nproc_per_node = {where.max_world}")
    if kind == "step" and where.last_step is not None and trigger.value > where.last_step:
        raise value.error(f"{trigger.value} is never reached: the trainer runs {where.last_step} steps (trainer.steps)")
    return trigger


def _read_repeat(f: _Field, duration: float | None) -> tuple[int, float | None]:
    fields = f.mapping(("times", "every"), required=("times",))
    times = fields["times"].whole(1, 3)
    every = fields["every"].seconds(positive=True) if "every" in fields else None
    f.checked(_check_repeat, times, every, duration)
    return times, every


def _read_expect(f: _Field, backends: tuple[str, ...]) -> Expectation:
    fields = f.mapping(_EXPECT_KEYS, required=("outcome",))
    outcome = fields["outcome"]
    if isinstance(outcome.node, yaml.MappingNode):
        by_backend = {
            backend: value.choice(OUTCOMES, "an outcome")
            for backend, value in outcome.mapping(backends, required=backends).items()
        }
    else:
        by_backend = dict.fromkeys(backends, outcome.choice(OUTCOMES, "an outcome"))
    bounds = {
        key: fields[key].seconds(positive=True) for key in ("max_recovery_s", "hang_s", "fail_fast_s") if key in fields
    }
    if "max_steps_lost" in fields:
        bounds["max_steps_lost"] = fields["max_steps_lost"].whole(0, 10)
    if "checkers" in fields:
        names = tuple(item.choice(tuple(CHECKERS), "a checker") for item in fields["checkers"].items())
        bounds["checkers"] = names
    return f.checked(Expectation, by_backend, **bounds)


# ---------------------------------------------------------------- to a cluster


def _trainer_args(profile_name: str, trainer: Mapping[str, Any]) -> dict:
    return {**_TRAINER_BASE, **PROFILES[profile_name].get("trainer", {}), **trainer}


def scenario_spec_options(scenario: Scenario, backend: str) -> dict:
    """Options for sim.core.spec.spec_from_options(options, None) to build the cluster on `backend`."""
    if backend not in scenario.backends:
        raise UsageError(f"backend {backend!r}: scenario {scenario.name} runs on {', '.join(scenario.backends)}")
    return _spec_options(scenario.profile, scenario.cluster, scenario.trainer, backend)


def _spec_options(profile_name: str, cluster: Mapping[str, Any], trainer: Mapping[str, Any], backend: str) -> dict:
    profile = PROFILES[profile_name]
    options = {**cluster, "rdzv_backend": backend}
    for key in ("rdzv_conf", "env"):  # the scenario's pairs over the profile's
        merged = {name: str(value) for name, value in profile.get(key, {}).items()}
        merged.update(cluster.get(key, ()))
        options[key] = tuple(merged.items())
    if cluster.get("script") is None:
        args = _trainer_args(profile_name, trainer)
        options["script_args"] = tuple(
            part for key in TRAINER_KEYS if key in args for part in ("--" + key.replace("_", "-"), str(args[key]))
        )
    return options
