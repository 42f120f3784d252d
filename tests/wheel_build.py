"""Build elastic-sim's wheel the way a release does: an sdist of the working tree, then a wheel
from that sdist (as `python -m build` does), so both MANIFEST.in and setup.py's build step count."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def working_tree_copy(dest: Path) -> Path:
    """The files git would commit now (tracked and new, not ignored): the build never writes into
    the shared checkout, and .venv, build/ or *.egg-info there cannot leak into the wheel."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def build_wheel(work: Path) -> Path:
    """sdist, then wheel from it, with this interpreter's setuptools (offline, no build isolation)."""
    source = working_tree_copy(work / "src")
    dist = work / "dist"
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"], source)
    (sdist,) = dist.glob("elastic_sim-*.tar.gz")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(sdist)],
        work,
    )
    (wheel,) = dist.glob("elastic_sim-*.whl")
    return wheel


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
