"""DDP on gloo/CPU with the per-rank checkpoint many hand-written trainers keep, and its pitfalls.

Each rank saves its own `/ckpt/rank{RANK}.pt` every --save-every steps: the model and the optimizer,
but not its StepLR scheduler or its AMP GradScaler. Each rank loads its own file on start, after
DDP has wrapped the model (so DDP's broadcast of rank 0's weights at construction does not cover it).
Its DistributedSampler shuffles, but `set_epoch` is never called: every epoch the same order. It does
not save on SIGTERM. The pitfalls `sim vet` names on it:
  - checkpoint without scheduler / scaler state (the first save);
  - DistributedSampler.set_epoch never called (the sampler's epoch stays 0);
  - rank-derived checkpoint paths: after a regroup a rank loads the file another rank wrote;
  - replicas diverged: a rank with no file of its own keeps its fresh weights while the others load theirs;
  - no checkpoint on SIGTERM: a preemption loses the steps since the last save.

Run:  torchrun --nnodes 1 --nproc-per-node 2 rank_ckpt.py --steps 2000
"""

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--pg-timeout", type=float, default=10.0)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank's own start: DDP broadcasts rank 0's weights at construction
    model = DDP(torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu")

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 16, generator=generator), torch.randn(256, 1, generator=generator))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=True))

    path = os.path.join(args.ckpt_dir, f"rank{rank}.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])  # after DDP's broadcast: this rank's own weights
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank}: resumed from {path} at step {step}", flush=True)

    while step < args.steps:
        for inputs, targets in loader:  # no loader.sampler.set_epoch(epoch)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            time.sleep(args.step_time)
            if step % args.save_every == 0:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save(state, path)
                print(f"rank {rank}: step {step} loss {loss.item():.4f} saved {path}", flush=True)
            if step >= args.steps:
                break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
