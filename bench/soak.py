"""Soak: many seeded random faults on one long job, per backend, and what each kind of fault cost.

    .venv/bin/python bench/soak.py                       # 50 faults, 4 nodes, etcd-v2 and c10d
    .venv/bin/python bench/soak.py --faults 10 --backends c10d --seed 3

The faults: worker, agent and node kills (a node whose agent or container was killed is started again
once the others have regrouped without it), short freezes, partitions of one node from its peers,
packet loss, and on etcd-v2 etcd restarts. On c10d nothing
touches node0, which hosts the rendezvous store (its loss ends the job: store-host-loss.yaml). Each
fault fires at a training step, so the job has recovered from the one before it first. Prints a table
per fault kind (injected, recovered, recovery p50/p95, steps lost) and the checkpoints the job resumed
from damaged (must be 0); writes the rows into bench/results.json under "soak". Where the job does not
survive, the verdict's own words (the failed checks and the diagnoses) say why.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import save_results  # noqa: E402
from bench.scenario_runs import (  # noqa: E402
    damaged_resumes,
    print_recovery_table,
    recovery_rows,
    run_generated,
    unusable_checkpoints,
)

RESULTS = Path(__file__).resolve().parent / "results.json"
STEPS_APART = 40  # each fault this many training steps after the one before (checkpoints every 10)
FIRST_STEP = 20
# Slots a started node's join takes before the next fault (a slot trains 4 s at 0.1 s a step).
JOIN_SLOTS = 3


def fault_steps(kind: str, target: str, step: int) -> list[dict]:
    """The scenario steps of one soak fault at training step `step`."""
    at = {"at": {"step": step}}
    if kind in ("kill-node", "kill-agent"):  # the agent is its container's main process: the node goes too
        # Started again once the others regrouped without it (STEPS_APART steps on): then it joins
        # a running job, a recovery of its own, rather than one tangled with the kill's. Its join
        # (container, agent, import, the others' restart) takes longer than a slot: see JOIN_SLOTS.
        return [
            {"fault": kind, "target": target, **at},
            {"fault": "start-node", "target": target, "at": {"step": step + STEPS_APART}},
        ]
    if kind == "pause":
        return [{"fault": "pause", "target": target, "duration": "3s", **at}]
    if kind == "partition":
        return [{"fault": "partition", "from_peers": [target], "duration": "5s", **at}]
    if kind == "netem":
        return [{"fault": "netem", "target": target, "loss": "10%", "duration": "10s", **at}]
    if kind == "etcd-restart":
        return [{"fault": "etcd-restart", **at}]
    return [{"fault": kind, "target": target, **at}]


def soak_scenario(backend: str, faults: int, nodes: int, rng: random.Random) -> dict:
    names = [f"node{i}" for i in range(nodes)]
    targets = names[1:] if backend == "c10d" else names  # c10d: never the store host
    kinds = ["kill-worker", "kill-agent", "kill-node", "pause", "partition", "netem"]
    if backend == "etcd-v2":
        kinds.append("etcd-restart")
    steps, at = [], FIRST_STEP
    for _ in range(faults):
        fault = fault_steps(rng.choice(kinds), rng.choice(targets), at)
        steps += fault
        at += STEPS_APART * (1 + JOIN_SLOTS * (len(fault) - 1))
    return {
        "name": f"soak-{backend}",
        "description": f"{faults} seeded random faults on {nodes} nodes (bench/soak.py)",
        "cluster": {
            "nodes": nodes,
            "min_nodes": 2,
            "max_nodes": nodes,
            "nproc_per_node": 1,
            "max_restarts": 4 * faults,  # torch counts per agent
            "rdzv_backend": backend,
        },
        "trainer": {"steps": at + 40, "step_time": 0.1, "pg_timeout": 10},
        "steps": steps,
        "expect": {"outcome": "recovers"},
        "timeout": f"{10 + faults}m",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--backends", default="etcd-v2,c10d")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    results, survived = [], True
    for backend in args.backends.split(","):
        rng = random.Random(f"{args.seed}-{backend}")
        result, report = run_generated(soak_scenario(backend, args.faults, args.nodes, rng), backend, args.seed)
        rows = recovery_rows(report)
        damaged, clean = damaged_resumes(report)
        print_recovery_table(f"{backend} ({args.faults} faults, {args.nodes} nodes, seed {args.seed})", rows)
        skipped = unusable_checkpoints(result)
        print(
            f"job: {report['verdict']}; damaged checkpoints found and skipped at a resume: {len(skipped)}; "
            f"resumes from a damaged checkpoint: {'0' if clean else 'some (see the run)'}"
        )
        if not result.passed:
            survived = False
            print(result.summary)
        results.append(
            {
                "backend": backend,
                "faults": args.faults,
                "nodes": args.nodes,
                "seed": args.seed,
                "verdict": report["verdict"],
                "run": str(result.run_dir),
                "damaged_steps": damaged,
                "no_damaged_resume": clean,
                "unusable_checkpoints": len(skipped),
                "by_fault": rows,
            }
        )
    save_results(RESULTS, "soak", results)
    return 0 if survived else 1


if __name__ == "__main__":
    sys.exit(main())
