"""Progress lines for a person watching a long command (builds, start-up)."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[str], None]


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
