"""Speed figures for images and start-up, printed, never asserted.

  cold image build        every image from nothing (a separate tag namespace, removed afterwards)
  no-op rebuild           the same build again (target: <= 2 s)
  rebuild after edit      the trainer changed by one comment line
  up -> first step        `sim up --nodes 4` (4 x 2 workers) with warm images, against the same job as
                          bare torchrun processes on the host (bench/recovery.py's two sides, fast
                          profile), c10d and etcd-v2, medians of interleaved repetitions, with the
                          sim's phases from its history; rows under "startup" in bench/results.json
                          (target ratio <= 1.05, issue 12)
  own environment         (--environment) a requirements layer (tests/scripts/seedjob/requirements.txt) and an
                          own image's thin layer (--image IMAGE), each built and then asked again: the second
                          time must build nothing; and the node-start copy of a project tree of 5 files and of
                          300 files (8 KiB each), 3 times each, in the same run
The image figures go under "images" in bench/results.json (--skip-cold keeps the last cold build's).

Usage: .venv/bin/python bench/bench_up.py [--nodes 4] [--nproc-per-node 2] [--reps 3] [--skip-cold]
       .venv/bin/python bench/bench_up.py --environment [--image IMAGE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import quiet, save_results  # noqa: E402
from bench.recovery import BACKENDS, RESULTS, Case, EtcdParts, measure, measures, print_table  # noqa: E402
from sim.core import labels  # noqa: E402
from sim.core.paths import TRAINER_DIR  # noqa: E402
from sim.engines.docker import Docker  # noqa: E402
from sim.engines.images import ImageBuilder  # noqa: E402

COLD_BUILD_TARGET_S = 120  # issue 12's targets
NOOP_CHECK_TARGET_S = 2


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def bench_images(docker: Docker, skip_cold: bool) -> dict:
    """The image figures: a cold build of every image (its own repository and cache: the wheelhouse is
    fetched again), the warm no-op check, and the rebuild after a trainer edit; seconds each."""
    figures: dict = {"cold_build_s": None, "built_cold": None}
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
            figures.update(cold_build_s=round(seconds, 1), built_cold=list(result.built))
        seconds, result = timed(builder.ensure)
        figures.update(noop_check_s=round(seconds, 2), built_noop=list(result.built))
        with open(trainer / "train.py", "a") as f:
            f.write(f"\n# benchmark edit {time.time()}\n")
        seconds, result = timed(builder.ensure)
        figures.update(trainer_edit_rebuild_s=round(seconds, 2), built_after_edit=list(result.built))
    finally:
        if not skip_cold:
            docker.remove_images([t for t in docker.image_tags(labels.IMAGE) if t.startswith(f"{repo}/")])
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(trainer, ignore_errors=True)
    return figures


def print_images(figures: dict) -> None:
    def built(key: str) -> str:
        return ", ".join(figures[key]) or "nothing"

    lines = []
    if figures["cold_build_s"] is not None:
        lines.append(
            (
                "cold image build (all images, wheelhouse included)",
                f"{figures['cold_build_s']:7.1f} s  built {built('built_cold')}  (target <= {COLD_BUILD_TARGET_S} s)",
            )
        )
    lines.append(
        (
            "no-op rebuild",
            f"{figures['noop_check_s']:7.2f} s  built {built('built_noop')}  (target <= {NOOP_CHECK_TARGET_S} s)",
        )
    )
    lines.append(
        (
            "rebuild after a trainer edit",
            f"{figures['trainer_edit_rebuild_s']:7.2f} s  built {built('built_after_edit')}",
        )
    )
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name:<{width}}  {value}")


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


def bench_environment(docker: Docker, image: str | None) -> list[tuple[str, str]]:
    """Seconds of the job-environment layers, first `up` and second `up` (what each built), and of the
    project copy a node makes at its start (a 5-file tree and a 300-file one)."""
    from sim.core.spec import ClusterSpec
    from sim.engines.userimages import UserImages

    builder = ImageBuilder(docker, progress=quiet)
    node = builder.ensure().images.node
    seedjob = ROOT / "tests" / "scripts" / "seedjob"
    cases = [("requirements layer (pyyaml, tqdm)", {"requirements": str(seedjob / "requirements.txt")})]
    if image:
        cases.append((f"own image thin layer ({image})", {"image": image}))
    rows = []
    for name, options in cases:
        spec = ClusterSpec(nodes=1, nproc_per_node=1, script=str(seedjob / "train.py"), **options)
        for attempt in ("first up", "second up"):
            builder.built = []
            seconds, _ = timed(lambda spec=spec: UserImages(builder, docker).node_image(spec, node))
            rows.append((f"{name}, {attempt}", f"{seconds:6.2f} s  built {', '.join(builder.built) or 'nothing'}"))
    for files in COPY_TREES:  # the seed job's size, then a few hundred files: the same run, the same machine
        copies = [copy_once(node, files) for _ in range(COPY_REPS)]
        size = files * len(MODULE_TEXT) / 2**20
        shown = ", ".join(f"{ms} ms" for ms in copies)
        name = f"project copy at node start ({files} files, {size:.2g} MiB)"
        rows.append((name, f"median {median(copies)} ms ({shown})"))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return rows


COPY_TREES = (5, 300)
COPY_REPS = 3
MODULE_TEXT = "# module\n" + "x = 1\n" * 1350  # 8 KiB: a source file of a typical project, without its data


def copy_once(node: str, files: int) -> int:
    """Milliseconds the node-start copy (images/node/elastic-sim-project, in a fresh container) of a tree of
    `files` source files in 10 folders takes, as that script reports it."""
    import re
    import subprocess

    tree = Path(tempfile.mkdtemp(prefix="elastic-sim-bench-tree-"))
    tree.chmod(0o755)  # the node's user reads it
    try:
        for i in range(files):
            folder = tree / f"pkg{i % 10}"
            folder.mkdir(exist_ok=True)
            (folder / f"mod{i}.py").write_text(MODULE_TEXT)
        argv = ["docker", "run", "--rm", "--label", f"{labels.IMAGE}=bench", "--network", "none", "-v",
                f"{tree}:/opt/sim/user:ro", node, "elastic-sim-project", "/opt/sim/user", "/opt/sim/project",
                ".git", "--", "true"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        found = re.search(rf"project copied .*: {files} files in (\d+) ms", done.stderr)
        if found is None:
            raise SystemExit(f"bench_up: the project copy of {files} files said {done.stderr.strip()[-300:]!r}")
        return int(found.group(1))
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold build (it takes minutes)")
    parser.add_argument("--reps", type=int, default=3, help="start-up repetitions per side (default 3)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    parser.add_argument("--environment", action="store_true", help="only the own-environment figures")
    parser.add_argument("--image", help="with --environment: also an own image's thin layer")
    args = parser.parse_args()
    docker = Docker()
    docker.ping()
    if args.environment:
        bench_environment(docker, args.image)
        return 0
    images = bench_images(docker, args.skip_cold)
    print_images(images)
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.skip_cold:  # the file keeps the last cold build's figures
        found = json.loads(args.out.read_text()).get("images", []) if args.out.exists() else []
        last = found[0] if found else {}
        images.update({key: last.get(key) for key in ("cold_build_s", "built_cold", "cold_when")})
    else:
        images["cold_when"] = now
    save_results(args.out, "images", [{**images, "when": now}])
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
