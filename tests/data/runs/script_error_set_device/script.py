import os

import torch
import torch.distributed as dist

if __name__ == "__main__":
    dist.init_process_group("gloo")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
