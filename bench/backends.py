"""Rendezvous latency and recovery time per rendezvous backend, as sim containers: printed, never asserted.

The same job (bench/recovery.py's: the shipped trainer, 3 nodes x 1 worker, the fault on node2) runs
on each backend, in interleaved repetitions (every backend once per repetition and figure, in a
rotating order, so a machine that gets busier loads them alike):

  c10d      torch's TCPStore-backed rendezvous, the store on node0
  etcd-v2   torch's etcd-v2 backend on etcd 3.4 with its v2 API (--enable-v2)
  etcd-v3   rendezvous-etcd-v3 on etcd 3.5 without the v2 API

and for each, the medians of: the start-up rendezvous (the last agent to arrive, from entering the
rendezvous to its completion: bench.recovery.startup_rendezvous), and for each figure (worker-kill,
node-loss: bench/recovery.py) the recovery time from the fault to the first step after it and its
rendezvous phase (sim.verdict.recovery.RecoveryPhases.rendezvous_s: from the last agent noticing to the last
rendezvous complete), each also as a ratio to c10d's median in the same run.

Usage: .venv/bin/python bench/backends.py [--reps 3] [--figures worker-kill,node-loss]
       [--backends c10d,etcd-v2,etcd-v3] [--profile fast] [--prefix bench-backends] [--out bench/results.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_columns, save_results  # noqa: E402
from bench.recovery import (  # noqa: E402
    MAX_NODES,
    PHASES,
    PROFILE_NAMES,
    RESULTS,
    TRAINER,
    VICTIM,
    Case,
    Sample,
    Unrecovered,
    _num,
    choices,
    median,
    median_phases,
    run_sim,
)
from sim.core.errors import SimError  # noqa: E402
from sim.engines.docker import Docker  # noqa: E402

FIGURES = ("worker-kill", "node-loss")
BACKENDS = ("c10d", "etcd-v2", "etcd-v3")
BASELINE = "c10d"
# Each row's figures: (column, key in the row).
COLUMNS = (
    ("recovery s", "recovery_s"),
    ("vs c10d", "recovery_ratio"),
    ("rdzv s", "rdzv_s"),
    ("vs c10d", "rdzv_ratio"),
    ("start-up rdzv s", "startup_rdzv_s"),
    ("vs c10d", "startup_rdzv_ratio"),
)


def run_all(cases: list[Case], reps: int, docker: Docker, prefix: str, out: Path) -> list[dict]:
    """Every case `reps` times; the rows so far written to `out` after each run (a stop keeps them)."""
    samples: dict[Case, list[Sample]] = {case: [] for case in cases}
    notes = []
    for rep in range(reps):
        for index in range(len(cases)):
            case = cases[(index + rep) % len(cases)]
            label = f"{case.figure} {case.backend} rep {rep + 1}"
            try:
                sample = run_sim(case, docker, prefix)
            except (Unrecovered, SimError, ValueError) as error:
                notes.append(f"{label}: {error}")
                print(f"  {label}: FAILED ({error})", flush=True)
                save_results(out, "backends", rows_of(samples, notes))
                continue
            samples[case].append(sample)
            save_results(out, "backends", rows_of(samples, notes))
            rdzv = getattr(sample.phases, "rendezvous_s", None)
            print(
                f"  {label}: recovery {sample.seconds:.2f} s, rendezvous {_num(rdzv)} s, "
                f"start-up rendezvous {_num(sample.startup_rdzv_s)} s",
                flush=True,
            )
    return rows_of(samples, notes)


def rows_of(samples: dict[Case, list[Sample]], notes: list[str]) -> list[dict]:
    rows = []
    for case, found in samples.items():
        phases = median_phases([s.phases for s in found])
        rows.append(
            {
                "figure": case.figure,
                "backend": case.backend,
                "profile": case.profile,
                "recovery_s": median([s.seconds for s in found]),
                "rdzv_s": phases["rendezvous_s"] if phases else None,
                "startup_rdzv_s": median([s.startup_rdzv_s for s in found if s.startup_rdzv_s is not None]),
                "reps": len(found),
                "phases": phases,
                "notes": [note for note in notes if note.startswith(f"{case.figure} {case.backend} ")],
            }
        )
    for row in rows:
        base = next(r for r in rows if r["figure"] == row["figure"] and r["backend"] == BASELINE)
        for key in ("recovery_s", "rdzv_s", "startup_rdzv_s"):
            ours, theirs = row[key], base[key]
            row[key.removesuffix("_s") + "_ratio"] = round(ours / theirs, 2) if ours and theirs else None
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("figure", "backend", *(title for title, _ in COLUMNS), "reps")
    lines = [head] + [(r["figure"], r["backend"], *(_num(r[key]) for _, key in COLUMNS), str(r["reps"])) for r in rows]
    print_columns(lines)
    print("\nmedian phases (s): " + ", ".join(name.removesuffix("_s") for name in PHASES))
    for r in rows:
        if r["phases"]:
            print(f"  {r['figure']} {r['backend']}: " + "  ".join(_num(r["phases"][name]) for name in PHASES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per backend and figure (default 3)")
    parser.add_argument("--figures", default=",".join(FIGURES))
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"{BASELINE} is always run: the baseline")
    parser.add_argument("--profile", default="fast", choices=PROFILE_NAMES)
    parser.add_argument("--prefix", default="bench-backends", help="cluster names: PREFIX-BACKEND")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    args = parser.parse_args()
    figures = choices(args.figures, FIGURES, "--figures")
    backends = choices(args.backends, BACKENDS, "--backends")
    backends = (BASELINE, *(b for b in backends if b != BASELINE))
    reps = max(1, args.reps)
    docker = Docker()
    docker.ping()
    print(
        f"backends: {MAX_NODES} nodes x 1 worker, trainer {TRAINER}, fault on node{VICTIM}, profile {args.profile}, "
        f"{reps} rep(s) per backend and figure, interleaved; {os.cpu_count()} CPUs",
        flush=True,
    )
    # SIGTERM (a `timeout`) ends the run through the same clean-up as Ctrl-C: clusters down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cases = [Case(figure, backend, args.profile) for figure in figures for backend in backends]
    rows = run_all(cases, reps, docker, args.prefix, args.out)
    print()
    print_table(rows)
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
