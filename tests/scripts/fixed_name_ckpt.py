"""DDP training with Adam that always checkpoints to the same file, checkpoint.pt.

Rank 0 writes model + optimizer + step every --ckpt-every steps the careful way: torch.save into a
temp file of its own, flushed and fsynced, then os.replace onto checkpoint.pt, so a crash mid-write
never leaves a partial checkpoint. Every start resumes from checkpoint.pt when it exists.

The pitfall: nothing ties a write to the round that made it. A worker of a superseded round (its
node froze, the others regrouped without it and went on) that wakes up in the middle of a save
finishes it and renames its old state onto checkpoint.pt, over the newer round's: the next
resume goes back to the old step, silently.

Run:  torchrun --nnodes 1 --nproc-per-node 2 fixed_name_ckpt.py --ckpt-dir /tmp/ckpt
Prints "step N loss X" on rank 0.
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

INPUT_DIM = 16


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds to sleep per step")
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--pg-timeout", type=float, default=None, help="process group timeout, seconds (torch's)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=32)
    return parser.parse_args()


def batch(step, rank, batch_size):
    generator = torch.Generator().manual_seed(1000 + step * 97 + rank)
    x = torch.randn(batch_size, INPUT_DIM, generator=generator)
    w = torch.linspace(-1.0, 1.0, INPUT_DIM).unsqueeze(1)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(batch_size, 1, generator=generator)
    return x, y


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    timeout = None if args.pg_timeout is None else datetime.timedelta(seconds=args.pg_timeout)
    dist.init_process_group("gloo", timeout=timeout)

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(INPUT_DIM, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, "checkpoint.pt")
    start_step = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_step = checkpoint["step"]
    if rank == 0:
        print(f"world size {world_size}, starting at step {start_step}", flush=True)

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
                tmp = f"{path}.tmp.{os.getpid()}"
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                with open(tmp, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)

    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
