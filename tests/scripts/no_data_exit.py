"""A plain gloo trainer that looks for its data before it starts and, not finding it, says so and exits 0: a
job that ends "successfully" without training one step, whatever the devices. A verdict must not call that a
PASS.

    torchrun --nproc-per-node 1 no_data_exit.py [--data PATH]
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
    parser.add_argument("--data", default="/data/train.bin")
    parser.add_argument("--steps", type=int, default=80)
    args = parser.parse_args()
    if not os.path.exists(args.data):
        print(f"no data at {args.data}, exiting", flush=True)
        sys.exit(0)
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
