"""A multi-node DDP trainer in the shape of the public PyTorch tutorials (multinode.py): written for
GPUs, run by torchrun, unchanged. NCCL backend, torch.cuda.set_device(LOCAL_RANK), the model moved
with .to(local_rank), DDP(device_ids=[local_rank]), and a snapshot loaded with a cuda map_location.

    torchrun --nnodes ... --nproc-per-node ... multinode_ddp.py TOTAL_EPOCHS SAVE_EVERY [--snapshot PATH]

--batch-time stands in for a real model's step time (a tiny model steps in a millisecond); --pg-timeout
gives init_process_group a timeout= (seconds), as a script tuned for node loss does (none: torch's default).
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomPairs(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.rand(1, generator=generator)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup(pg_timeout):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    timeout = datetime.timedelta(seconds=pg_timeout) if pg_timeout else None
    dist.init_process_group(backend="nccl", timeout=timeout)


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, batch_time=0.0):
        self.batch_time = batch_time
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model.to(self.local_rank)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print(f"[GPU{self.global_rank}] Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.local_rank])

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=f"cuda:{self.local_rank}")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"[GPU{self.global_rank}] Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source, targets = source.to(self.local_rank), targets.to(self.local_rank)
            loss = self._run_batch(source, targets)
            time.sleep(self.batch_time)
        steps = len(self.train_data)
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Steps: {steps} | loss {loss.item():.4f}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        tmp = self.snapshot_path + ".tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def main(total_epochs, save_every, snapshot_path, batch_size, samples, batch_time=0.0, pg_timeout=None):
    ddp_setup(pg_timeout)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dataset = RandomPairs(samples)
    train_data = DataLoader(
        dataset, batch_size=batch_size, pin_memory=True, shuffle=False, sampler=DistributedSampler(dataset)
    )
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, batch_time)
    trainer.train(total_epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="multi-node DDP, tutorial style")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-time", type=float, default=0.0, help="seconds each batch takes on top")
    parser.add_argument("--pg-timeout", type=float, help="init_process_group's timeout= in seconds")
    parser.add_argument("--snapshot", default=os.environ.get("SNAPSHOT_PATH", "/ckpt/snapshot.pt"))
    args = parser.parse_args()
    main(
        args.total_epochs,
        args.save_every,
        args.snapshot,
        args.batch_size,
        args.samples,
        args.batch_time,
        args.pg_timeout,
    )
