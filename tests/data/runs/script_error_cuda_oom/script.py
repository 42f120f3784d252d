import os

import torch
import torch.distributed as dist


def setup():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def activation_buffer(batch: int, seq: int, hidden: int):
    return torch.empty(batch, seq, hidden, device="cuda")


if __name__ == "__main__":
    setup()
    buffer = activation_buffer(4096, 32768, 8192)  # 4 TiB of float32: more than any device holds
