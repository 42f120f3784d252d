"""Readiness as pluggable wait strategies with a timeout (as in testcontainers).

A strategy looks once per poll and answers: ready, not yet, or failed (with why).
`wait_for` polls until ready, a failure, or the timeout: the harness's wait for one condition with
a deadline (the runner's triggers and the collector follow a history instead).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

from sim.core.errors import ClusterError


@dataclasses.dataclass(frozen=True)
class Check:
    ready: bool
    failure: str | None = None  # set when waiting longer cannot help
    detail: str = ""


class WaitStrategy(Protocol):
    description: str

    def check(self) -> Check: ...


@dataclasses.dataclass(frozen=True)
class Condition:
    """A strategy from a predicate: ready once it is true."""

    description: str
    predicate: Callable[[], object]

    def check(self) -> Check:
        return Check(bool(self.predicate()))


def wait_for(
    strategy: WaitStrategy,
    timeout: float | None,
    interval: float = 1.0,
    *,
    raise_errors: bool = True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> Check:
    """Poll until ready, a failure, or `timeout` seconds (None: no limit). A failure or the timeout
    raises ClusterError, unless raise_errors=False: then the last check is returned as it is
    (not ready, with or without a failure), for callers that go on either way."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        last = strategy.check()
        if last.ready:
            return last
        if last.failure:
            if raise_errors:
                raise ClusterError(f"{strategy.description}: {last.failure}")
            return last
        if deadline is not None and clock() >= deadline:
            if raise_errors:
                detail = f" ({last.detail})" if last.detail else ""
                raise ClusterError(f"{strategy.description}: not reached within {timeout:g}s{detail}")
            return last
        sleep(interval)
