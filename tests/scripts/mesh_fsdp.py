"""FSDP2 over a CUDA device mesh, in the style of the public FSDP2 examples: init_device_mesh("cuda"),
fully_shard on each block and the root, bf16-free (plain fp32), a torch.distributed.checkpoint save and
resume of the sharded state. Written for GPUs and the nccl backend; unchanged on CPU-only nodes.

    torchrun ... mesh_fsdp.py --steps N [--ckpt-dir DIR] [--step-time S]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.linear(x)) + x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ckpt-dir", default="/ckpt/mesh_fsdp")
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.0)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(32) for _ in range(3)], torch.nn.Linear(32, 1)).to("cuda")
    for block in model[:3]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    start = 0
    marker = os.path.join(args.ckpt_dir, "latest")
    if os.path.exists(marker):
        with open(marker) as f:
            start = int(f.read())
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt_dir, f"step-{start}"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        print(f"resumed from step {start}", flush=True)

    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, 32, generator=generator).cuda()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(args.step_time)
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.5f}", flush=True)
        if step % args.ckpt_every == 0:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save(
                {"model": model_state, "optim": optim_state}, checkpoint_id=os.path.join(args.ckpt_dir, f"step-{step}")
            )
            if dist.get_rank() == 0:
                with open(marker + ".tmp", "w") as f:
                    f.write(str(step))
                os.replace(marker + ".tmp", marker)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
