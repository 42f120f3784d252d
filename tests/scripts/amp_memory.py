"""Mixed precision and GPU bookkeeping in the style of the public AMP recipes: torch.autocast("cuda"),
torch.amp.GradScaler("cuda") with unscale_ and gradient clipping, CUDA events to time each step, and a
log line of torch.cuda.memory_allocated() after torch.cuda.synchronize(). NCCL backend, DDP with
device_ids, a checkpoint that holds the scaler's state, loaded with a map_location function.
Written for GPUs; unchanged on CPU-only nodes.

    torchrun ... amp_memory.py --steps N [--ckpt PATH] [--step-time S]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ckpt", default="/ckpt/amp_memory.pt")
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.manual_seed_all(0)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 1)).to(device),
        device_ids=[local_rank],
        output_device=local_rank,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    start = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, map_location=lambda storage, loc: storage.cuda(local_rank))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        start = state["step"]
        print(f"rank {rank} resumed at step {start}", flush=True)

    generator = torch.Generator().manual_seed(rank)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 64, generator=generator).to(device, non_blocking=True)
        y = x.sum(dim=1, keepdim=True).to(device)
        begin.record()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        end.record()
        torch.cuda.synchronize()
        time.sleep(args.step_time)
        if rank == 0:
            memory = torch.cuda.memory_allocated(device) / 2**20
            print(
                f"step {step} loss {loss.item():.4f} step_ms {begin.elapsed_time(end):.1f} memory_mib {memory:.1f}",
                flush=True,
            )
        if rank == 0 and step % args.ckpt_every == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            state.update(scaler=scaler.state_dict(), step=step)
            torch.save(state, args.ckpt + ".tmp")
            os.replace(args.ckpt + ".tmp", args.ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
