"""Speed figures for images and start-up, printed, never asserted.

  cold image build        every image from nothing (a separate tag namespace, removed afterwards)
  no-op rebuild           the same build again (target: <= 2 s)
  rebuild after edit      the trainer changed by one comment line
  up -> first step        `sim up --nodes 4` with warm images, against the same trainer under bare
                          torchrun processes on the host, same settings (target ratio <= 1.05, issue 12)

Usage: .venv/bin/python bench/bench_up.py [--nodes 4] [--nproc-per-node 2] [--skip-cold]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import NODE_ENV, first_step_time, quiet  # noqa: E402
from sim import cluster as cluster_mod  # noqa: E402
from sim import labels  # noqa: E402
from sim.docker import Docker  # noqa: E402
from sim.images import ImageBuilder  # noqa: E402
from sim.paths import TRAINER_DIR  # noqa: E402
from sim.spec import ClusterSpec  # noqa: E402
from sim.wait import Condition, wait_for  # noqa: E402

TRAINER_ARGS = ["--steps", "20", "--step-time", "0.05"]


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


def bench_sim_up(docker: Docker, nodes: int, nproc: int, backend: str) -> float:
    spec = ClusterSpec(
        name=f"bench-{backend}",
        nodes=nodes,
        nproc_per_node=nproc,
        rdzv_backend=backend,
        script_args=tuple(TRAINER_ARGS),
    )
    t0 = time.time()
    cluster = cluster_mod.up(spec, docker, progress=quiet)
    try:
        # `up` returns once the agents start their workers, before the first step: wait for node0's
        # (one log, every 2 s: start-up is CPU-bound), then take the earliest node's. The trainer
        # stamps each line with the wall clock: the same clock as ours.
        def first_step(node: str) -> float | None:
            return first_step_time(cluster.logs(node).splitlines(), t0)

        wait_for(Condition("waiting for the first training step", lambda: first_step("node0")), 300, interval=2.0)
        return min(t for t in (first_step(n.node) for n in cluster.nodes()) if t is not None)
    finally:
        cluster.down(save_logs=False)


def bench_bare(nodes: int, nproc: int) -> float:
    """The same trainer and settings as `bench_sim_up` with c10d, as plain processes on this host."""
    ckpt = tempfile.mkdtemp(prefix="elastic-sim-bench-ckpt-")
    env = {**os.environ, **NODE_ENV}
    port = 29400 + os.getpid() % 500
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                f"1:{nodes}",
                "--nproc-per-node",
                str(nproc),
                "--max-restarts",
                "3",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "bench",
                str(TRAINER_DIR / "train.py"),
                *TRAINER_ARGS,
                "--ckpt-dir",
                ckpt,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for _ in range(nodes)
    ]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(ckpt, ignore_errors=True)
    times = [t for t in (first_step_time(o.splitlines(), t0) for o in outputs) if t is not None]
    if not times:
        raise SystemExit("bare torchrun baseline never reached a training step:\n" + outputs[0][-2000:])
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold build (it takes minutes)")
    args = parser.parse_args()
    docker = Docker()
    docker.ping()
    rows = bench_images(docker, args.skip_cold)
    bare = bench_bare(args.nodes, args.nproc_per_node)
    sim_c10d = bench_sim_up(docker, args.nodes, args.nproc_per_node, "c10d")
    sim_etcd = bench_sim_up(docker, args.nodes, args.nproc_per_node, "etcd-v2")
    rows += [
        (f"bare torchrun x{args.nodes} on the host -> first step (c10d)", f"{bare:7.1f} s  (baseline)"),
        (
            f"sim up --nodes {args.nodes} -> first step (c10d)",
            f"{sim_c10d:7.1f} s  ratio {sim_c10d / bare:.2f} (target <= 1.05)",
        ),
        (f"sim up --nodes {args.nodes} -> first step (etcd-v2)", f"{sim_etcd:7.1f} s  ratio {sim_etcd / bare:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
