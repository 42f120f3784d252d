"""An FSDP2 trainer in the shape of the current PyTorch FSDP2 example (device-generic, torch >= 2.7): it
gates on torch.accelerator (at least 2 accelerators, else it says so and exits 0), binds the process
group to its device (get_default_backend_for_device, device_id=), builds a small Transformer on the meta
device, shards each layer and then the root with fully_shard over a device mesh, materializes the shards
with to_empty(device=...) and initializes them, and keeps torch.distributed.checkpoint (DCP) checkpoints
of the sharded model and optimizer: every start resumes from the newest.

    torchrun --nproc-per-node 2 fsdp2_dcp.py [--steps N] [--ckpt-dir DIR] [--ckpt-every N] [--step-time S]
                                             [--pg-timeout S] [--mixed-precision]

Prints "step N loss X" on rank 0.
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attention = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(torch.nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq_len):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(seq_len, dim)
        self.layers = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.output = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))

    def reset_parameters(self):
        for module in self.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)):
                module.reset_parameters()
            elif isinstance(module, torch.nn.MultiheadAttention):
                module._reset_parameters()


def verify_min_gpu_count(min_gpus: int = 2) -> bool:
    return torch.accelerator.is_available() and torch.accelerator.device_count() >= min_gpus


def latest_step(ckpt_dir):
    try:
        with open(os.path.join(ckpt_dir, "latest")) as f:
            return int(f.read())
    except FileNotFoundError:
        return 0


def main():
    parser = argparse.ArgumentParser(description="FSDP2 with DCP checkpoints")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ckpt-dir", default="/ckpt/fsdp2_dcp")
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--pg-timeout", type=float, default=60.0)
    parser.add_argument("--mixed-precision", action="store_true", help="bfloat16 parameters, float32 reduction")
    args = parser.parse_args()

    min_gpus = 2
    if not verify_min_gpu_count(min_gpus):
        print(f"Unable to locate sufficient {min_gpus} gpus to run this example. Exiting.")
        return
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"{torch.accelerator.current_accelerator()}:{local_rank}")
    torch.accelerator.set_device_index(local_rank)
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, device_id=device, timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))

    vocab, seq_len, batch = 256, 32, 8
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(vocab, dim=64, heads=4, layers=4, seq_len=seq_len)
    fsdp_kwargs = {"mesh": mesh}
    if args.mixed_precision:
        fsdp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    assert isinstance(model, FSDPModule) and isinstance(model.output.weight, DTensor)
    model.to_empty(device=device)
    model.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    start = latest_step(args.ckpt_dir)
    if start:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt_dir, f"step-{start}"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if rank == 0:
            print(f"resumed from the DCP checkpoint of step {start}", flush=True)

    # The data: a fixed cyclic sequence to learn, drawn per step from a seed (the same after a resume).
    for step in range(start + 1, args.steps + 1):
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        offsets = torch.randint(0, vocab, (batch, 1), generator=generator)
        tokens = ((offsets + torch.arange(seq_len + 1)) * 7 % vocab).to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(args.step_time)
        if rank == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if step % args.ckpt_every == 0:
            model_state, optim_state = get_state_dict(model, optimizer)
            folder = os.path.join(args.ckpt_dir, f"step-{step}")
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
            if rank == 0:  # only a whole checkpoint is named: dcp.save returns once every rank's part is written
                with open(os.path.join(args.ckpt_dir, "latest.tmp"), "w") as f:
                    f.write(str(step))
                os.replace(os.path.join(args.ckpt_dir, "latest.tmp"), os.path.join(args.ckpt_dir, "latest"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
