"""Readiness as pluggable wait strategies with a timeout (as in testcontainers).

A strategy looks at the cluster once per poll and answers: ready, not yet, or
failed (with why). `wait_for` polls until ready, a failure, or the timeout.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol

from .errors import ClusterError


@dataclasses.dataclass(frozen=True)
class Check:
    ready: bool
    failure: str | None = None  # set when waiting longer cannot help
    detail: str = ""


class WaitStrategy(Protocol):
    description: str

    def check(self) -> Check: ...


def wait_for(strategy: WaitStrategy, timeout: float, interval: float = 1.0,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Check:
    deadline = clock() + timeout
    last = Check(False)
    while True:
        last = strategy.check()
        if last.ready:
            return last
        if last.failure:
            raise ClusterError(f"{strategy.description}: {last.failure}")
        if clock() >= deadline:
            detail = f" ({last.detail})" if last.detail else ""
            raise ClusterError(f"{strategy.description}: not reached within {timeout:g}s{detail}")
        sleep(interval)
