"""A DDP trainer in the shape of today's PyTorch distributed examples (torch >= 2.7, device-generic): it gates
on `torch.accelerator` before anything else and exits 0 when there are not enough devices. On nodes where the
gate fails, the job "succeeds" without training one step: a verdict must not call that a PASS.

    torchrun --nproc-per-node 1 accelerator_gate.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= 2):
        print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
        sys.exit(0)
    device = torch.accelerator.current_accelerator()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.accelerator.set_device_index(local_rank)
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend)
    model = DDP(nn.Linear(16, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(8, 16, device=device)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
