import os

import torch
import torch.distributed as dist


def setup():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


if __name__ == "__main__":
    setup()
