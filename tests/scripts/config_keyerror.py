"""A trainer that looks up its node's settings in a table keyed by host name at start, and the table lacks one
node: `KeyError` there at every start, before the process group is set up, while the other node's worker goes on
into `init_process_group` and waits for it. At torch's defaults the failing node's agent uses up its restarts and
exits; the other's worker then waits in init_process_group for a peer that is gone, up to torch's default
process-group timeout (30 minutes). `sim up` must end with the KeyError first, not follow that wait.

    torchrun --nproc-per-node 1 config_keyerror.py
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

# Per-host settings (a real job's come from a YAML file): the table names node0 only, so node1 fails. (node0
# hosts the agents' shared store, rank 0's, at torch's defaults: it stays up, and its worker waits.)
NODE_SETTINGS = {"node0": {"threads": 1, "batch_size": 8}}


def main() -> None:
    settings = NODE_SETTINGS[socket.gethostname()]
    torch.set_num_threads(settings["threads"])
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 81):
        loss = model(torch.randn(settings["batch_size"], 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
