"""`sim vet`'s default gauntlet: its wall time, beside the same faults run as separate scenarios, in one run.

A 3-node x 1-worker job with a 0.1 s step (tests/scripts/fixed_name_ckpt.py, a 10 s process-group
timeout) on etcd-v2. First the gauntlet (as `sim vet` runs it: two clusters at once, each with its share of
the faults one after another, each once the job is steady again; the faults that end the job by design on a
cluster of their own), then each kind alone:
a cluster of its own, steady, the fault, steady again (as a scenario per fault runs). Prints both wall
times and their ratio. Targets (README "sim vet"): at most 6 minutes, at most 0.4 of the separate runs.

    flock /tmp/elastic-sim-docker.lock .venv/bin/python bench/vet_time.py [--kinds a,b] [--skip-separate]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import print_columns, quiet, save_results  # noqa: E402
from sim.vet.gauntlet import DEFAULT_GAUNTLET, prepare, run_vet  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "fixed_name_ckpt.py"
ARGS = ["--steps", "1000000", "--step-time", "0.1", "--pg-timeout", "10"]


def vet_once(kinds: tuple[str, ...], name: str, chosen: bool) -> tuple[float, list]:
    options = {"nodes": 3, "nproc_per_node": 1, "script": str(SCRIPT), "name": name, "rdzv_backend": "etcd-v2"}
    spec, kinds = prepare(options, ARGS, ",".join(kinds) if chosen else None)
    began = time.monotonic()
    result, _ = run_vet(spec, kinds, chosen=chosen, progress=quiet)
    return time.monotonic() - began, list(result.faults)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", help="only these kinds (default: the default gauntlet)")
    parser.add_argument("--skip-separate", action="store_true", help="time the gauntlet only")
    args = parser.parse_args()
    kinds = tuple(args.kinds.split(",")) if args.kinds else DEFAULT_GAUNTLET
    gauntlet_s, scores = vet_once(kinds, "bench-vet", chosen=bool(args.kinds))
    outcomes = {s.kind: s.outcome for s in scores}
    survived = sum(o == "survived" for o in outcomes.values())
    print(f"gauntlet: {gauntlet_s:.0f} s for {len(kinds)} kinds ({survived} survived)")
    rows = [("kind", "gauntlet outcome", "alone (s)", "alone outcome")]
    separate_s = 0.0
    alone: dict[str, float] = {}
    if not args.skip_separate:
        for kind in kinds:
            if outcomes.get(kind) == "not applicable":
                rows.append((kind, "not applicable", "-", "-"))
                continue
            seconds, [score] = vet_once((kind,), f"bench-vet-{kind}"[:33], chosen=True)
            alone[kind] = round(seconds, 1)
            separate_s += seconds
            rows.append((kind, outcomes.get(kind, "?"), f"{seconds:.0f}", score.outcome))
        print_columns(rows)
        ratio = gauntlet_s / separate_s if separate_s else None
        print(
            f"gauntlet {gauntlet_s:.0f} s vs separate runs {separate_s:.0f} s: ratio "
            f"{'-' if ratio is None else f'{ratio:.2f}'} (targets: <= 360 s, <= 0.4)"
        )
    save_results(
        ROOT / "bench" / "results.json",
        "vet_time_gauntlet" if args.skip_separate else "vet_time",  # a gauntlet-only run keeps the ratio's row
        [
            {
                "kinds": list(kinds),
                "gauntlet_s": round(gauntlet_s, 1),
                "separate_s": round(separate_s, 1) if alone else None,
                "alone_s": alone,
                "outcomes": outcomes,
                "date": time.strftime("%Y-%m-%d"),
            }
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
