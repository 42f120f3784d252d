"""Parsers for what a person types on the command line or in a scenario file.

Each returns a plain value or raises UsageError whose one line names the input, the problem
and the fix.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from decimal import Decimal

from sim.core.errors import UsageError

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# Units in falling order, each at most once: 1h2m3s, 1m30s, 500ms. "m" must not eat the "m" of "ms".
_DURATION = re.compile(
    rf"(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m(?!s))?(?:(?P<s>{_NUMBER})s)?(?:(?P<ms>{_NUMBER})ms)?"
)
_SECONDS_PER = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}

# tc's rate units (tc(8)): "bit" units count bits, "bps" units count bytes; prefixes are SI (1000).
_BITS_PER_SECOND = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
    "tbps": 8 * 10**12,
}


def parse_duration(text: str) -> float:
    """Seconds in "500ms", "30s", "2m", "1m30s", "1h" or a plain number of seconds ("2.5")."""
    spoken = text.strip().lower()
    if spoken.startswith("-"):
        raise UsageError(f"duration {text!r}: negative; use a duration of zero or more, e.g. 30s")
    if re.fullmatch(_NUMBER, spoken):
        return float(spoken)
    match = _DURATION.fullmatch(spoken)
    if not spoken or not match:
        raise UsageError(f"duration {text!r}: not a duration; use e.g. 500ms, 30s, 2m, 1m30s")
    return sum(float(v) * _SECONDS_PER[unit] for unit, v in match.groupdict().items() if v is not None)


def parse_signal(text: str) -> signal.Signals:
    """A signal by name, with or without SIG, any case ("KILL", "sigterm"), or by number ("9")."""
    name = text.strip().upper()
    try:
        if name.isdigit():
            return signal.Signals(int(name))
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise UsageError(
            f"signal {text!r}: not a signal; use a name or number, e.g. KILL, TERM, INT, SEGV, STOP or 9"
        ) from None


def parse_rate(text: str) -> int:
    """Bits per second in tc's units: "1mbit", "500kbit", "100kbps" (kbit = 1000 bit/s, kbps = 1000 byte/s)."""
    match = re.fullmatch(rf"({_NUMBER})\s*([a-z]+)", text.strip().lower())
    if not match or match.group(2) not in _BITS_PER_SECOND:
        raise UsageError(
            f"rate {text!r}: not a rate; use a number and a unit, e.g. 1mbit, 500kbit or 100kbps"
            " (kbit = 1000 bits/s, kbps = 1000 bytes/s)"
        )
    bits = int(Decimal(match.group(1)) * _BITS_PER_SECOND[match.group(2)])
    if bits <= 0:
        raise UsageError(f"rate {text!r}: below 1 bit/s; use a rate above zero, e.g. 1mbit")
    return bits


def parse_percent(text: str) -> float:
    """A percentage from 0 to 100: "30%", "30", "0.5%"."""
    spoken = text.strip().removesuffix("%").strip()
    if not re.fullmatch(rf"-?{_NUMBER}", spoken):
        raise UsageError(f"percentage {text!r}: not a number; use a number from 0 to 100, e.g. 30% or 0.5%")
    value = float(spoken)
    if not 0 <= value <= 100:
        raise UsageError(f"percentage {text!r}: out of range; use a number from 0 to 100, e.g. 30%")
    return value


def check_node_names(names: Iterable[str], known: Sequence[str] | None, source: str) -> tuple[str, ...]:
    """`names` as a tuple, after checking that there is at least one, none is empty or named twice,
    and (when `known` is given) each is known. Errors start with `source`, which names the input."""
    if isinstance(names, str):
        raise TypeError(f"{source}: pass a list of node names, not the string {names!r}")
    names = tuple(names)
    if not names:
        raise UsageError(f"{source}: no nodes named; name at least one, e.g. node0")
    seen: set[str] = set()
    for name in names:
        if not name:
            raise UsageError(f"{source}: empty node name; separate names with single commas, e.g. node0,node2")
        if known is not None and name not in known:
            raise UsageError(f"{source}: unknown node {name!r}; known nodes: {', '.join(known)}")
        if name in seen:
            raise UsageError(f"{source}: node {name!r} named twice; name each node once")
        seen.add(name)
    return names


def go_duration(seconds: float | None, *, signed: bool = False) -> str:
    """Seconds as a Go duration (Chaos Mesh parses durations with time.ParseDuration): 90 -> "90s", 0.1 -> "100ms"."""
    seconds = float(seconds or 0.0)
    millis = round(seconds * 1000)
    text = f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"
    if millis < 0:
        text = f"-{abs(millis) // 1000}s" if millis % 1000 == 0 else f"-{abs(millis)}ms"
    return f"+{text}" if signed and millis > 0 else text
