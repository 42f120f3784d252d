"""Plain DistributedDataParallel training with SGD, checkpointed with torch.save.

The textbook torchrun script: rank, local rank and world size come from the
environment, rank 0 writes model + optimizer + step to one file every
--ckpt-every steps, and every start resumes from that file when it exists.

Run:  torchrun --nnodes 1 --nproc-per-node 2 ddp_sgd.py --ckpt-dir /tmp/ckpt
Prints "step N loss X" on rank 0.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

INPUT_DIM = 16


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds to sleep per step")
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    return parser.parse_args()


def batch(step, rank, batch_size):
    """A fresh batch of a fixed regression task; each rank sees its own samples."""
    generator = torch.Generator().manual_seed(1000 + step * 97 + rank)
    x = torch.randn(batch_size, INPUT_DIM, generator=generator)
    w = torch.linspace(-1.0, 1.0, INPUT_DIM).unsqueeze(1)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(batch_size, 1, generator=generator)
    return x, y


@record
def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(INPUT_DIM, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, "checkpoint.pt")
    start_step = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_step = checkpoint["step"]
    if rank == 0:
        print(f"rank {rank} (local {local_rank}) of {world_size}: starting at step {start_step}", flush=True)

    for step in range(start_step + 1, args.steps + 1):
        x, y = batch(step, rank, args.batch_size)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step % args.ckpt_every == 0:
                torch.save(
                    {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path
                )

    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
