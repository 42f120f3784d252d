"""Speed figures for images and start-up, printed, never asserted.

  cold image build        every image from nothing (a separate tag namespace, removed afterwards)
  no-op rebuild           the same build again (target: <= 2 s)
  rebuild after edit      the trainer changed by one comment line
  up -> first step        `sim up --nodes 4` (4 x 2 workers) with warm images, against the same job as
                          bare torchrun processes on the host (bench/recovery.py's two sides, fast
                          profile), c10d and etcd-v2, medians of interleaved repetitions, with the
                          sim's phases from its history; rows under "startup" in bench/results.json
                          (target ratio <= 1.05, issue 12)

Usage: .venv/bin/python bench/bench_up.py [--nodes 4] [--nproc-per-node 2] [--reps 3] [--skip-cold]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import quiet, save_results  # noqa: E402
from bench.recovery import BACKENDS, RESULTS, Case, EtcdParts, measure, measures, print_table  # noqa: E402
from sim import labels  # noqa: E402
from sim.docker import Docker  # noqa: E402
from sim.images import ImageBuilder  # noqa: E402
from sim.paths import TRAINER_DIR  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def bench_images(docker: Docker, skip_cold: bool) -> list[tuple[str, str]]:
    rows = []
    repo = "elastic-sim-bench"
    cache = Path(tempfile.mkdtemp(prefix="elastic-sim-bench-cache-"))
    trainer = Path(tempfile.mkdtemp(prefix="elastic-sim-bench-trainer-"))
    shutil.copytree(TRAINER_DIR, trainer, dirs_exist_ok=True)
    try:
        if skip_cold:
            builder = ImageBuilder(docker, progress=quiet, trainer_dir=trainer)
            builder.ensure()
        else:
            builder = ImageBuilder(docker, progress=quiet, trainer_dir=trainer, cache_dir=cache, repo=repo)
            seconds, result = timed(builder.ensure)
            rows.append(
                (
                    "cold image build (all images, wheelhouse included)",
                    f"{seconds:7.1f} s  built {', '.join(result.built)}",
                )
            )
        seconds, result = timed(builder.ensure)
        rows.append(
            ("no-op rebuild", f"{seconds:7.2f} s  built {', '.join(result.built) or 'nothing'}  (target <= 2 s)")
        )
        with open(trainer / "train.py", "a") as f:
            f.write(f"\n# benchmark edit {time.time()}\n")
        seconds, result = timed(builder.ensure)
        rows.append(("rebuild after a trainer edit", f"{seconds:7.2f} s  built {', '.join(result.built)}"))
    finally:
        if not skip_cold:
            docker.remove_images([t for t in docker.image_tags(labels.IMAGE) if t.startswith(f"{repo}/")])
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(trainer, ignore_errors=True)
    return rows


def bench_startup(docker: Docker, nodes: int, nproc: int, reps: int) -> list[dict]:
    """`sim up` to the first step against the same job as bare torchrun processes on this host (the
    recovery benchmark's two sides, bench/recovery.py: one spec, the fast profile), on each backend,
    interleaved repetitions; etcd-v2's bare side starts its own etcd server, as `up` does."""
    builder = ImageBuilder(docker, progress=quiet)
    builder.ensure(need_etcd=True)
    rows = []
    for backend in BACKENDS:
        case = Case("start-up", backend, "fast", nodes=nodes, nproc=nproc)
        etcd = EtcdParts.of(builder, case.spec("bench").etcd_server_version) if backend != "c10d" else None
        rows.append(measure(case, reps, docker, etcd))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold build (it takes minutes)")
    parser.add_argument("--reps", type=int, default=3, help="start-up repetitions per side (default 3)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = parser.parse_args()
    docker = Docker()
    docker.ping()
    rows = bench_images(docker, args.skip_cold)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(
        f"\nstart-up: {args.nodes} nodes x {args.nproc_per_node} workers a side, {args.reps} rep(s) a side, "
        "interleaved; from `up` (bare: the first process) to the first step",
        flush=True,
    )
    startup = bench_startup(docker, args.nodes, args.nproc_per_node, max(1, args.reps))
    save_results(args.out, "startup", startup, same=measures)
    print()
    print_table(startup)
    print(f"\nwritten: {args.out} (target: sim/bare <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
