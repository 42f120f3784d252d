"""A seed-style training job: a package (trainer/), a YAML config read with pyyaml, a mounted data
folder, third-party libraries from requirements.txt, checkpoints in a shared folder named by the config.

Run from the project's root (its working folder):  torchrun --nproc-per-node 2 train.py
Prints "step N loss X" on rank 0.
"""

import csv
import os
import time

import torch
import torch.distributed as dist
import tqdm
import yaml
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from trainer.model import Net


def load_samples(path, input_dim):
    with open(path, newline="") as f:
        rows = [[float(v) for v in row] for row in csv.reader(f)]
    data = torch.tensor(rows)
    return data[:, :input_dim], data[:, input_dim:]


@record
def main():
    with open("config.yaml") as f:  # relative: the job's own tree is its working folder
        config = yaml.safe_load(f)
    train = config["train"]
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    x_all, y_all = load_samples(config["data_file"], config["model"]["input_dim"])

    torch.manual_seed(0)
    model = DistributedDataParallel(Net(config["model"]["input_dim"], config["model"]["hidden"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=train["lr"], momentum=0.9)
    os.makedirs(config["checkpoint_dir"], exist_ok=True)
    path = os.path.join(config["checkpoint_dir"], "checkpoint.pt")
    start = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = checkpoint["step"]
    if rank == 0:
        print(f"rank 0 of {dist.get_world_size()}: starting at step {start}", flush=True)

    for step in tqdm.tqdm(range(start + 1, train["steps"] + 1), disable=True):
        generator = torch.Generator().manual_seed(step * 97 + rank)
        index = torch.randint(0, len(x_all), (train["batch_size"],), generator=generator)
        loss = torch.nn.functional.mse_loss(model(x_all[index]), y_all[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(train["step_time"])
        if step % train["ckpt_every"] == 0:
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            if rank == 0:
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)
            if local_rank == 0:
                torch.save(state, config["snapshot"])  # relative: this node's own copy of the tree
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
