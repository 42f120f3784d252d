"""Checkpoint integrity under repetition: kill rank 0's worker inside its checkpoint write, many times.

    .venv/bin/python bench/ckpt_kills.py                     # 100 kills, etcd-v2
    .venv/bin/python bench/ckpt_kills.py --kills 10 --backend c10d

Each kill is the kill-during-checkpoint fault: a watcher in the node SIGKILLs the worker the moment it
opens a checkpoint file for writing, so every kill lands inside a write window on purpose. The job
then resumes; every resume must load a valid, checksummed checkpoint (the shipped trainer checks its
sha256 and falls back to the one before; the checkpoint_integrity checker holds that no start resumed
from a checkpoint whose write was killed). Prints the counts; writes them into bench/results.json under
"ckpt_kills".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import save_results  # noqa: E402
from bench.scenario_runs import damaged_resumes, run_generated, unusable_checkpoints  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results.json"


CKPT_INTERVAL = 10


def kills_scenario(backend: str, kills: int) -> dict:
    # Each kill takes the first write after it: landed, the job resumes from the checkpoint before and trains
    # the same steps again; missed (the watcher armed late under load), the job moves one interval on. So the
    # job's length holds one interval per kill and more: it cannot end while kills remain. (When it could, the
    # last write's kill left rank 0 restarting alone after rank 1 had finished: a rendezvous timeout.)
    return {
        "name": f"ckpt-kills-{backend}",
        "description": f"{kills} kills of rank 0's worker inside its checkpoint write (bench/ckpt_kills.py)",
        "cluster": {"nodes": 2, "nproc_per_node": 1, "max_restarts": kills + 5, "rdzv_backend": backend},
        "trainer": {"steps": CKPT_INTERVAL * (kills + 3), "step_time": 0.05, "ckpt_interval": CKPT_INTERVAL},
        "steps": [
            {"fault": "kill-during-checkpoint", "target": "rank0", "at": {"step": 15} if i == 0 else {"after": "1s"}}
            for i in range(kills)
        ],
        "expect": {"outcome": "recovers", "max_steps_lost": 10},
        "timeout": f"{5 + kills}m",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--backend", default="etcd-v2")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    result, report = run_generated(kills_scenario(args.backend, args.kills), args.backend, args.seed)
    landed = [r for r in report.get("recoveries", []) if r["fault"] == "kill-during-checkpoint"]
    resumes = sum(
        1 for r in report.get("recoveries", []) if r["fault"] == "kill-during-checkpoint" and r.get("recovery_s")
    )
    damaged, clean = damaged_resumes(report)
    skipped = unusable_checkpoints(result)
    print(
        f"{args.backend}: kills inside a checkpoint write: {len(damaged)} of {args.kills} asked ({len(landed)} fired)"
    )
    print(f"  recoveries: {resumes}; checkpoints found damaged and skipped at a resume: {len(skipped)}")
    print(f"  resumes from a damaged checkpoint: {'0' if clean else 'some (see the run)'}; job: {report['verdict']}")
    if not result.passed:
        print(result.summary)
    save_results(
        RESULTS,
        "ckpt_kills",
        [
            {
                "backend": args.backend,
                "kills_asked": args.kills,
                "kills_in_write": len(damaged),
                "recoveries": resumes,
                "unusable_checkpoints": len(skipped),
                "no_damaged_resume": clean,
                "verdict": report["verdict"],
                "run": str(result.run_dir),
            }
        ],
    )
    return 0 if result.passed and clean else 1


if __name__ == "__main__":
    sys.exit(main())
