import torch.distributed as dist
import yaml_not_here

if __name__ == "__main__":
    dist.init_process_group("gloo")
    print(yaml_not_here.safe_load("a: 1"))
