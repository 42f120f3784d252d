"""A collectives-only loop: all_reduce and broadcast every iteration, no model, no optimizer.

Stands for jobs whose "step" is not an optimizer step (evaluation sweeps,
hand-written parameter averaging, communication benchmarks). Rank 0 saves
the iteration and the running total with torch.save and every start resumes
from them.

Run:  torchrun --nnodes 1 --nproc-per-node 2 collectives_only.py --ckpt-dir /tmp/ckpt
Prints "iter N total X" on rank 0.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="iterations")
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds to sleep per iteration")
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--ckpt-every", type=int, default=10)
    return parser.parse_args()


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")

    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, "collectives.pt")
    state = {"iteration": 0, "total": 0.0}
    if os.path.exists(path):
        state = torch.load(path)
    if rank == 0:
        print(f"world size {world_size}, resuming at iteration {state['iteration']}", flush=True)

    for iteration in range(state["iteration"] + 1, args.steps + 1):
        contribution = torch.tensor([float(rank + 1)])
        dist.all_reduce(contribution)  # 1 + 2 + ... + world_size
        total = torch.tensor([state["total"] + contribution.item()])
        dist.broadcast(total, src=0)  # rank 0's running total is the truth
        state = {"iteration": iteration, "total": total.item()}
        time.sleep(args.step_time)
        if rank == 0:
            print(f"iter {iteration} total {state['total']:.0f}", flush=True)
            if iteration % args.ckpt_every == 0:
                torch.save(state, path)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
