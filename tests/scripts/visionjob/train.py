"""A small box-regression job on torchvision's compiled ops, DDP on gloo, checkpointed and resumed.

The shape of a detection job's training loop: images augmented with torchvision.transforms.v2 (colour jitter),
a small conv backbone, torchvision.ops.roi_align over each image's proposal boxes (a compiled op, forward and
backward), a box head trained with a smooth L1 loss and a score head whose target is the box's IoU over 0.5,
and the predictions filtered with torchvision.ops.nms (a compiled op). Rank 0 saves model + optimizer + step to
one file every --ckpt-every steps (atomically); every start resumes from it.

Needs torchvision (requirements.txt beside it). Prints "step N loss X iou I kept K" on rank 0.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torchvision
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torchvision.ops import box_iou, nms, roi_align
from torchvision.transforms import v2

IMAGE = 32
PROPOSALS = 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR", "/ckpt"))
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    return parser.parse_args()


class BoxNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1)
        )
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 64), torch.nn.ReLU())
        self.boxes = torch.nn.Linear(64, 4)
        self.scores = torch.nn.Linear(64, 1)

    def forward(self, images, proposals):
        features = self.backbone(images)
        pooled = roi_align(features, proposals, output_size=(4, 4), spatial_scale=1.0, aligned=True)
        hidden = self.head(pooled)
        deltas = self.boxes(hidden)
        boxes = torch.cat(proposals) + deltas
        return boxes, self.scores(hidden).squeeze(1)


def batch(step, rank, size):
    """Images with one bright square each; its box is the target, the proposals are jittered copies."""
    generator = torch.Generator().manual_seed(1000 + step * 97 + rank)
    images = 0.1 * torch.rand(size, 3, IMAGE, IMAGE, generator=generator)
    targets, proposals = [], []
    for i in range(size):
        x0, y0 = torch.randint(0, IMAGE - 12, (2,), generator=generator).tolist()
        images[i, :, y0 : y0 + 10, x0 : x0 + 10] += 0.9
        box = torch.tensor([x0, y0, x0 + 10, y0 + 10], dtype=torch.float32)
        targets.append(box.expand(PROPOSALS, 4))
        proposals.append(box + 2.0 * torch.randn(PROPOSALS, 4, generator=generator))
    return images, proposals, torch.cat(targets)


@record
def main():
    args = parse_args()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(BoxNet())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    augment = v2.Compose([v2.ColorJitter(brightness=0.2), v2.ToDtype(torch.float32)])

    os.makedirs(args.ckpt_dir, exist_ok=True)
    path = os.path.join(args.ckpt_dir, "vision.pt")
    start = 0
    if os.path.exists(path):
        checkpoint = torch.load(path, map_location="cpu")
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = checkpoint["step"]
    if rank == 0:
        print(f"torchvision {torchvision.__version__} on torch {torch.__version__}: rank 0 of {world_size}, "
              f"starting at step {start}", flush=True)  # fmt: skip

    for step in range(start + 1, args.steps + 1):
        images, proposals, targets = batch(step, rank, args.batch_size)
        boxes, scores = model(augment(images), proposals)
        with torch.no_grad():
            iou = box_iou(boxes, targets).diagonal()
        # The box head regresses the target; the score head learns which boxes hit it (IoU over 0.5).
        objectness = torch.nn.functional.binary_cross_entropy_with_logits(scores, (iou > 0.5).float())
        loss = torch.nn.functional.smooth_l1_loss(boxes, targets) + objectness
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            kept = nms(boxes.detach(), scores.detach().sigmoid(), iou_threshold=0.5)
        time.sleep(args.step_time)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} iou {iou.mean().item():.3f} kept {kept.numel()}", flush=True)
            if step % args.ckpt_every == 0:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
                torch.save(state, path + ".tmp")
                os.replace(path + ".tmp", path)

    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
