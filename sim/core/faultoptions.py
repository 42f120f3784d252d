"""What a fault's options hold and how each is spelt: the part of a fault kind a person types (a CLI
argument, a scenario value). A kind's options are a frozen dataclass of `option(...)` fields that checks
itself (FaultOptions); sim/scenarios/scenario.py and sim/cli/faults.py generate the scenario format and
the CLI from them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from signal import Signals
from typing import Any

from sim.core.errors import UsageError
from sim.core.parse import parse_duration, parse_percent, parse_rate, parse_signal
from sim.core.partition import parse_groups
from sim.core.spec import parse_size


@dataclass(frozen=True)
class OptionKind:
    """What an option holds: `parse` makes it from what a person typed (a CLI argument, a
    scenario value written as text), `accepts` says whether a value is one (for options built
    in Python), `show` writes a value back as a person would type it."""

    name: str
    parse: Callable[[Any], Any]
    accepts: Callable[[Any], bool]
    expects: str  # what `accepts` wants, for the error: "a whole number >= 0"
    show: Callable[[Any], str] = str
    nargs: int | None = None  # on the CLI: words taken (one_way takes FROM and TO)
    least: int = 0  # whole numbers: the smallest allowed, and an example
    example: int = 0


def is_number(value: Any, least: float = 0, most: float = float("inf")) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and least <= value <= most


def is_names(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(name, str) for name in value)


def _checked_number(text: str, what: str, example: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{what} {text!r}: not a number; use e.g. {example}") from None


def whole(least: int, example: int) -> OptionKind:
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*-?\d+\s*", text):
            raise UsageError(f"{text!r} is not a whole number; use e.g. {example}")
        return int(text)

    return OptionKind(
        "whole",
        parse,
        lambda v: is_number(v, least) and isinstance(v, int),
        f"a whole number >= {least}",
        least=least,
        example=example,
    )


def _text(what: str) -> OptionKind:
    return OptionKind("text", str, lambda v: isinstance(v, str) and bool(v), what)


TARGET = _text("a node name, or random, store-host, rank0, etcd")


NODE_TARGET = _text("a node name, or random, store-host, rank0")  # a node's training processes: not etcd


TEXT = _text("a word")


FLAG = OptionKind("flag", bool, lambda v: isinstance(v, bool), "true or false")


SECONDS = OptionKind("seconds", parse_duration, is_number, "a number of seconds >= 0", show=lambda v: f"{v:g}s")


SIGNAL = OptionKind(
    "signal",
    parse_signal,
    lambda v: isinstance(v, Signals),
    "a signal (signal.Signals)",
    show=lambda v: v.name.removeprefix("SIG"),
)


PERCENT = OptionKind("percent", parse_percent, lambda v: is_number(v, 0, 100), "a percentage from 0 to 100")


RATE = OptionKind("rate", parse_rate, lambda v: is_number(v, 1) and isinstance(v, int), "a whole number of bits/s > 0")


CPUS = OptionKind(
    "cpus",
    lambda text: _checked_number(text, "cpus", "0.2"),
    lambda v: is_number(v, 0.001),
    "a number of CPUs > 0, e.g. 0.2",
)


SIZE = OptionKind(
    "size",
    lambda text: parse_size("size", text, least=0),
    lambda v: is_number(v, 0) and isinstance(v, int),
    "a size in bytes >= 0",
    show=lambda v: f"{v >> 20}m" if v and not v % 2**20 else str(v),
)


MOST_SKEW_S = 365 * 86400.0


def parse_offset(text: str) -> float:
    """A clock offset: a duration with a sign, "60s", "+5s", "-10m" (seconds, ahead when positive)."""
    spoken = str(text).strip()
    sign = -1.0 if spoken.startswith("-") else 1.0
    try:
        seconds = sign * parse_duration(spoken.removeprefix("-").removeprefix("+"))
    except UsageError:
        raise UsageError(f"offset {text!r}: not an offset; use e.g. 60s, +5s, -10m (ahead, or behind with -)") from None
    if not seconds:
        raise UsageError(f"offset {text!r}: no skew; use e.g. 60s, +5s, -10m (heal sets a clock back)")
    if abs(seconds) > MOST_SKEW_S:
        raise UsageError(f"offset {text!r}: more than a year; use e.g. 60s, -10m, 2h")
    return seconds


OFFSET = OptionKind(
    "offset",
    parse_offset,
    lambda v: is_number(v, -MOST_SKEW_S, MOST_SKEW_S) and v != 0,
    "a number of seconds, not 0, at most a year either way",
    show=lambda v: f"{v:+g}s",
)


DIRECTORY = OptionKind(
    "directory",
    str,
    lambda v: isinstance(v, str) and v.startswith("/") and len(v) > 1,
    "an absolute path inside the node, e.g. /ckpt",
)


def _comma_names(text: str) -> tuple[str, ...]:
    """Node names as typed on the command line: "node0,node2"."""
    return tuple(name.strip() for name in text.split(","))


NODES = OptionKind("nodes", _comma_names, is_names, "a list of node names")


GROUPS = OptionKind(
    "groups",
    parse_groups,
    lambda v: isinstance(v, (tuple, list)) and all(map(is_names, v)),
    "groups of node names",
)


NODES_PAIR = OptionKind(
    "nodes pair",
    lambda sides: tuple(map(_comma_names, sides)),
    lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(map(is_names, v)),
    "[from, to], two lists of node names",
    nargs=2,
)


@dataclass(frozen=True)
class Option:
    """How one option of a fault is spelt and explained (a field of its options dataclass)."""

    kind: OptionKind
    help: str
    positional: bool = False  # on the CLI: `sim pause node1`, not `--target node1`
    metavar: str | tuple[str, ...] | None = None


def option(
    kind: OptionKind,
    help: str,
    default: Any = None,
    *,
    required: bool = False,
    positional: bool = False,
    metavar: str | tuple[str, ...] | None = None,
) -> Any:
    """A field of a fault's options; None (the default default) means not given."""
    spelling = {"metadata": {"option": Option(kind, help, positional, metavar)}}
    return field(**spelling) if required else field(default=default, **spelling)


def option_of(f: dataclasses.Field) -> Option:
    return f.metadata["option"]


@dataclass(frozen=True)
class FaultOptions:
    """The base of every fault's options: each value is checked against its OptionKind (what it holds), then the
    rules among them (problem)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), option_of(f).kind
            if value is not None and not kind.accepts(value):
                raise UsageError(f"{f.name} {value!r}: not {kind.expects}")
        problem = self.problem()
        if problem:
            raise UsageError(problem)

    def problem(self) -> str | None:
        """What is wrong among the options, as one line naming the fix; None when nothing is."""
        return None

    def given(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


def exactly_one(options: FaultOptions, names: Sequence[str], *, at_most: bool = False) -> str | None:
    given = [name for name in names if getattr(options, name) is not None and getattr(options, name) is not False]
    if len(given) > 1 or (not at_most and not given):
        rule = "at most one" if at_most else "exactly one"
        return f"give {rule} of {', '.join(names)}; got {' and '.join(given) or 'none'}"
    return None
