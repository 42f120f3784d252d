"""DDP over a DataLoader with torch's ElasticDistributedSampler, resuming mid-epoch.

The pattern of torch's elastic examples: the checkpoint holds model,
optimizer, epoch and how many samples of the epoch were consumed, and the
sampler is rebuilt on every start with start_index at that position, so the
epoch is finished over whatever number of processes there is now.

What it does not give: ElasticDistributedSampler shuffles the indices
start_index..N-1 afresh, it does not continue the permutation that was being
read. After a mid-epoch resume some samples of that epoch are read twice and
others never (the same happens to any change of world size mid-epoch).

Run:  torchrun --nnodes 1 --nproc-per-node 2 elastic_sampler.py --ckpt-dir /tmp/ckpt
Prints "epoch E step N loss X" on rank 0.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.utils.data import ElasticDistributedSampler
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

INPUT_DIM = 16


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="global steps in all")
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds to sleep per step")
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--dataset-size", type=int, default=1024)
    return parser.parse_args()


def make_dataset(size):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(size, INPUT_DIM, generator=generator)
    w = torch.linspace(-1.0, 1.0, INPUT_DIM).unsqueeze(1)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(size, 1, generator=generator)
    return TensorDataset(x, y)


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(INPUT_DIM, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataset = make_dataset(args.dataset_size)

    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, "sampler_ckpt.pt")
    state = {"step": 0, "epoch": 0, "start_index": 0}
    if os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        state = {key: checkpoint[key] for key in state}
        if rank == 0:
            print(f"resumed at step {state['step']}, epoch {state['epoch']}, sample {state['start_index']}", flush=True)

    step, epoch, start_index = state["step"], state["epoch"], state["start_index"]
    while step < args.steps:
        sampler = ElasticDistributedSampler(dataset, num_replicas=world_size, rank=rank, start_index=start_index)
        sampler.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.step_time)
            step += 1
            start_index += args.batch_size * world_size
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
                if step % args.ckpt_every == 0:
                    torch.save(
                        {
                            "model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "step": step,
                            "epoch": epoch,
                            "start_index": start_index,
                        },
                        path,
                    )
            if step >= args.steps:
                break
        else:  # the epoch's last whole batch was read
            epoch, start_index = epoch + 1, 0

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
