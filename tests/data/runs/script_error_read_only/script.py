import os

import torch
import torch.distributed as dist


def save(model):
    torch.save(model.state_dict(), os.path.join(os.path.dirname(os.path.abspath(__file__)), "snapshot.pt"))


if __name__ == "__main__":
    dist.init_process_group("gloo")
    save(torch.nn.Linear(2, 2))
