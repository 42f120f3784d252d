"""DDP training with Adam, checkpointed with torch.distributed.checkpoint (DCP).

Every rank takes part in each save and load: DCP writes one directory per
checkpoint (shards plus a .metadata file) and reshards on load, so a restart
on a different number of processes still resumes. Rank 0 writes a "latest"
file naming the newest complete checkpoint after every save.

Run:  torchrun --nnodes 1 --nproc-per-node 2 dcp_ckpt.py --ckpt-dir /tmp/ckpt
Prints "step N loss X" on rank 0.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

INPUT_DIM = 16


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds to sleep per step")
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=32)
    return parser.parse_args()


def batch(step, rank, batch_size):
    generator = torch.Generator().manual_seed(1000 + step * 97 + rank)
    x = torch.randn(batch_size, INPUT_DIM, generator=generator)
    w = torch.linspace(-1.0, 1.0, INPUT_DIM).unsqueeze(1)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(batch_size, 1, generator=generator)
    return x, y


def latest_checkpoint(ckpt_dir):
    try:
        with open(os.path.join(ckpt_dir, "latest")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    return os.path.join(ckpt_dir, name) if name else None


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
    start_step = 0
    checkpoint = latest_checkpoint(args.ckpt_dir)
    if checkpoint is not None:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=checkpoint)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start_step = int(state["step"])
        if rank == 0:
            print(f"resumed from {checkpoint} at step {start_step}", flush=True)
    if rank == 0:
        print(f"world size {world_size}", flush=True)

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
            model_state, optim_state = get_state_dict(model, optimizer)
            name = f"step-{step:06d}"
            dcp.save(
                {"model": model_state, "optim": optim_state, "step": torch.tensor(step)},
                checkpoint_id=os.path.join(args.ckpt_dir, name),
            )
            if rank == 0:
                # dcp.save returns once every rank's shards and the metadata are written.
                tmp = os.path.join(args.ckpt_dir, "latest.tmp")
                with open(tmp, "w") as f:
                    f.write(name)
                os.replace(tmp, os.path.join(args.ckpt_dir, "latest"))

    # torch 2.13's gloo group can deadlock when destroyed while its thread still releases the last
    # collective's tensors (pytorch/pytorch#75097; sim's stuck-at-exit diagnosis): give it a moment.
    time.sleep(1)
    dist.destroy_process_group()
    del model, optimizer


if __name__ == "__main__":
    main()
