"""A tiny gloo job for the end-to-end test: all-reduce the ranks, fail once on request, write the result."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

with open(os.path.join(os.environ["E2E_OUT"], f"pid{os.getpid()}"), "w") as pid_file:
    pid_file.write(str(os.getpid()))
dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # fail fast, not after gloo's 30 min
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if os.environ.get("E2E_FAIL_FIRST_ATTEMPT") == "1" and restart == 0 and rank == 1:
    sys.exit(3)  # a worker crash: both agents go to a new rendezvous round
total = torch.tensor([float(rank)])
dist.all_reduce(total)
with open(os.path.join(os.environ["E2E_OUT"], f"rank{rank}"), "w") as out:
    out.write(f"world={world} sum={int(total.item())} restart={restart}\n")
dist.destroy_process_group()
