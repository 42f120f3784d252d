"""The cost of the device emulation (images/node/elastic_sim_devices.py) per training step, printed.

One process on this machine's CPU trains a small DDP model (a one-process gloo group) the way a GPU
script does: the batch moved with .to(device), the loss's backward (DDP's all-reduce), an optimizer
step, one dist.all_reduce of the loss for logging and its .item(). The emulation is installed exactly
as in a node (elastic_sim_devices.install), then switched per step by putting its wrappers in place or
taking them out. Each pair of steps runs one step with it (device "cuda", emulated) and one without
(device "cpu", torch's own functions), in a random order per pair, a few milliseconds apart in the
same process. The figure is the trimmed mean (10 % off each end) of the paired differences over the
median step time; --control runs both halves without the emulation (the bench's noise floor, ~0).

Usage: .venv/bin/python bench/devices_cost.py [--pairs 2000] [--width 256] [--block 1] [--control]
                                              [--optimizer sgd|adamw]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "images" / "node"))


def _namespaces(torch):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    return [
        torch,
        torch.Tensor,
        torch.nn.Module,
        torch.cuda,
        torch.autograd,
        dist,
        distributed_c10d,
        DistributedDataParallel,
        DataLoader,
        torch.amp,
        torch.UntypedStorage,
        torch.accelerator,  # AdamW's step asks it (its graph-capture check): the off half must be torch's own
        torch.accelerator.memory,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--control", action="store_true")
    parser.add_argument(
        "--optimizer",
        choices=("sgd", "adamw"),
        default="sgd",
        help="adamw: its step asks torch.accelerator (an emulated call that answers torch's own code as the CPU)",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        help="steps per half of a pair, each half's figure their median (the wrappers put in place or taken out "
        "once per half: a type's attribute changed drops the interpreter's caches for it, a cost no node pays)",
    )
    args = parser.parse_args()

    import elastic_sim_devices as devices
    import torch
    import torch.distributed as dist

    os.environ.setdefault("LOCAL_RANK", "0")
    spaces = _namespaces(torch)
    before = [dict(vars(space)) for space in spaces]
    emulator = devices.Emulator(write=None, env={"LOCAL_RANK": "0", "SIM_DEVICES_PER_NODE": "1"})
    devices.install(torch, emulator)
    # A patch either replaces a namespace's own attribute or adds one over an inherited one (Tensor.to is
    # TensorBase's): "off" puts the first back and deletes the second, so that half runs torch's own code.
    added = object()
    changed = [
        (space, name, old.get(name, added), value)
        for space, old in zip(spaces, before, strict=True)
        for name, value in vars(space).items()
        if old.get(name, added) is not value
    ]

    def emulate(on: bool) -> None:
        for space, name, original, patched in changed:
            if on:
                setattr(space, name, patched)
            elif original is added:
                if name in vars(space):
                    delattr(space, name)
            else:
                setattr(space, name, original)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emulate(True)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(0), device_ids=[0])
    if args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    data = [(torch.randn(64, args.width), torch.randn(64, 1)) for _ in range(8)]

    def step(i: int, device: str) -> float:
        x, y = data[i % len(data)]
        began = time.perf_counter()
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        logged.item()
        return time.perf_counter() - began

    for i in range(100):  # warm up both paths
        emulate(i % 2 == 0)
        step(i, "cuda" if i % 2 == 0 else "cpu")
    on_times, off_times, diffs = [], [], []
    rng = random.Random(0)
    for i in range(args.pairs):
        order = [True, False]
        rng.shuffle(order)
        times = {}
        for on in order:
            emulate(on and not args.control)
            device = "cuda" if on and not args.control else "cpu"
            times[on] = statistics.median(step(i * args.block + j, device) for j in range(args.block))
        on_times.append(times[True])
        off_times.append(times[False])
        diffs.append(times[True] - times[False])
    emulate(True)
    dist.destroy_process_group()
    diffs.sort()
    cut = len(diffs) // 10
    trimmed = diffs[cut : len(diffs) - cut]
    median = statistics.median(off_times)
    figure = {
        "pairs": args.pairs,
        "block": args.block,
        "control": args.control,
        "median_step_ms": round(median * 1000, 3),
        "mean_added_us": round(statistics.fmean(trimmed) * 1e6, 2),
        "overhead_pct": round(100 * statistics.fmean(trimmed) / median, 2),
        "wrappers": len(changed),
    }
    print(json.dumps(figure))
    print(
        f"device emulation: {figure['overhead_pct']:+.2f} % of a {figure['median_step_ms']:.2f} ms step "
        f"({figure['mean_added_us']:+.1f} us per step){' [control]' if args.control else ''}; target < 2 %"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
