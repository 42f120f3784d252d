"""DDP training with Adam that checkpoints ONLY the model's weights.

A classic mistake: the optimizer's state (Adam's moment estimates and step
count) is not saved, so after a restart Adam starts from scratch on a trained
model and its first updates are far too large: the loss jumps right after
every resume, then settles again.

Run:  torchrun --nnodes 1 --nproc-per-node 2 model_only_ckpt.py --ckpt-dir /tmp/ckpt
Prints "step N loss X" on rank 0.
"""

import argparse
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
    parser.add_argument("--lr", type=float, default=0.05)
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
    dist.init_process_group("gloo")

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(INPUT_DIM, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, "model.pt")
    start_step = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        start_step = checkpoint["step"]
        if rank == 0:
            print(f"loaded model weights from {path} (step {start_step})", flush=True)
    if rank == 0:
        print(f"training on {world_size} processes from step {start_step}", flush=True)

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
                # The pitfall: optimizer.state_dict() is not saved.
                torch.save({"model": model.module.state_dict(), "step": step}, path)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
