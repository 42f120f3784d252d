"""A DDP trainer in the shape of the current PyTorch distributed examples (device-generic, torch >= 2.7):
it gates on torch.accelerator (at least 2 accelerators, else it says so and exits 0), takes the device
from torch.accelerator.current_accelerator(), sets it with torch.accelerator.set_device_index, picks the
backend with torch.distributed.get_default_backend_for_device and binds the group with device_id=.
Its config is hydra's (conf/config.yaml; hydra-core from requirements.txt); mixed precision with
torch.amp.autocast(float16) and torch.amp.GradScaler; a DataLoader with worker processes and a
DistributedSampler; rank 0 keeps a snapshot (model, optimizer, scaler, epoch) and every start resumes it.

Run from this folder:  torchrun --nproc-per-node 2 train.py [hydra overrides, e.g. train.max_epochs=4]
Prints "[cuda:0] epoch E | step N loss X" on rank 0.
"""

import datetime
import os
import time

import hydra
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Regression(Dataset):
    """Made from a seed: every rank and every loader worker holds the same samples."""

    def __init__(self, samples, dim):
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(samples, dim, generator=generator)
        weight = torch.randn(dim, 1, generator=generator)
        self.y = self.x @ weight + 0.1 * torch.randn(samples, 1, generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def verify_min_gpu_count(min_gpus: int = 2) -> bool:
    return torch.accelerator.is_available() and torch.accelerator.device_count() >= min_gpus


class Trainer:
    def __init__(self, cfg: DictConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.rank = dist.get_rank()
        dataset = Regression(cfg.data.samples, cfg.model.input_dim)
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(
            dataset,
            batch_size=cfg.data.batch_size,
            sampler=self.sampler,
            num_workers=cfg.data.num_workers,
            pin_memory=True,
        )
        model = torch.nn.Sequential(
            torch.nn.Linear(cfg.model.input_dim, cfg.model.hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(cfg.model.hidden, 1),
        ).to(device)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
        self.scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp)
        self.epochs_run = 0
        if os.path.exists(cfg.snapshot_path):
            self._load_snapshot(model)
        self.model = DDP(model, device_ids=[device.index])

    def _load_snapshot(self, model):
        snapshot = torch.load(self.cfg.snapshot_path, map_location=self.device)
        model.load_state_dict(snapshot["model"])
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])
        self.epochs_run = snapshot["epochs_run"]
        if self.rank == 0:
            print(f"Resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {
            "model": self.model.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epochs_run": epoch,
        }
        os.makedirs(os.path.dirname(self.cfg.snapshot_path), exist_ok=True)
        partial = f"{self.cfg.snapshot_path}.partial"
        torch.save(snapshot, partial)
        os.replace(partial, self.cfg.snapshot_path)  # a kill mid-save leaves the last whole snapshot

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.amp.autocast(device_type=self.device.type, dtype=torch.float16, enabled=self.cfg.train.amp):
            output = self.model(source)
            loss = F.mse_loss(output.float(), targets)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.item()

    def train(self):
        steps_per_epoch = len(self.loader)
        for epoch in range(self.epochs_run, self.cfg.train.max_epochs):
            self.sampler.set_epoch(epoch)
            for i, (source, targets) in enumerate(self.loader):
                source, targets = source.to(self.device), targets.to(self.device)
                loss = self._run_batch(source, targets)
                time.sleep(self.cfg.train.step_time)  # stands in for a real model's step
                if self.rank == 0:
                    step = epoch * steps_per_epoch + i + 1
                    print(f"[{self.device}] epoch {epoch} | step {step} loss {loss:.4f}", flush=True)
            if self.rank == 0 and (epoch + 1) % self.cfg.train.save_every == 0:
                self._save_snapshot(epoch + 1)
            torch.accelerator.synchronize()
        if self.rank == 0:
            peak = torch.accelerator.max_memory_allocated()
            print(f"done: {self.cfg.train.max_epochs} epochs, peak memory {peak} bytes", flush=True)


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig):
    min_gpus = 2
    if not verify_min_gpu_count(min_gpus):
        print(f"Unable to locate sufficient {min_gpus} gpus to run this example. Exiting.")
        return
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"{torch.accelerator.current_accelerator()}:{local_rank}")
    torch.accelerator.set_device_index(local_rank)
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, device_id=device, timeout=datetime.timedelta(seconds=cfg.dist.timeout_s))
    torch.manual_seed(0)
    Trainer(cfg, device).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
