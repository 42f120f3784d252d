import json
import sys

import torch.distributed as dist


def load_config(path):
    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    config = load_config(sys.argv[1] if len(sys.argv) > 1 else "configs/train.json")
    dist.init_process_group("gloo")
