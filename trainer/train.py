"""Default elastic-correct training script for elastic-sim; run it under torchrun.

Each rule below is what lets a job survive torchrun restarting it, on the
same or a different number of workers:

- Rank, local rank, world size, restart count and run id come from the
  environment on every start: after a restart each worker is a new process
  that may hold a different rank in a group of a different size.
- All job state (model, optimizer, LR scheduler, step, data position) lives in
  checkpoints, because a restart throws away everything in memory. Without the
  optimizer and scheduler state the resumed loss would jump.
- Checkpoints are written by global rank 0 only, atomically (temp file, fsync,
  os.replace) and with a sha256, and the previous one is kept: a worker killed
  mid-write must not leave a half-written "latest" checkpoint that stops the
  job from ever resuming.
- The data position is stored as (epoch, samples consumed in that epoch), not
  per rank, so that the rest of the epoch can be resharded over any world
  size without replaying or skipping samples.
- Each start builds its process group in a key namespace of its own: torchrun
  keeps one TCPStore across restarts, and a restarted group that read the dead
  group's gloo/NCCL addresses from it would fail or hang (init_process_group).
- The job ends by itself after --steps global steps, so the harness can tell
  "finished" from "lost".

Every line on stdout is one JSON object (see emit()); the harness reads them.
"""

import argparse
import functools
import hashlib
import io
import json
import math
import os
import re
import socket
import sys
import time
import uuid
import warnings
from datetime import timedelta

# torch warns at import when numpy is missing; it is never needed here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

try:  # in an elastic-sim node: the kernel's clock, also where the skew-clock fault has moved the node's,
    from elastic_sim_clock import wall_clock  # so the times in our lines stay on the history's clock
except ImportError:
    wall_clock = time.time

# The start line says when import torch finished, the process group was ready and the checkpoint
# load began (it ends with the line): where a restart's time went.
IMPORTED_AT = wall_clock()
CKPT_MAGIC = b"ELASTIC-SIM-CKPT-1"
CKPT_NAME = re.compile(r"^ckpt-(\d+)\.pt$")
CKPTS_KEPT = 2
INPUT_DIM, HIDDEN_DIM = 16, 32


# ---------------------------------------------------------------- sampling


def epoch_shard(dataset_size, seed, epoch, start_index, rank, world_size, batch_size):
    """Indices this rank reads for the rest of `epoch`, from `start_index` on.

    The permutation depends only on (seed, epoch), never on the world size, so
    "the first start_index samples of the epoch" means the same samples at any
    world size. Only whole global batches are kept (the partial tail of the
    epoch is dropped) so every rank takes the same number of steps. Sharding
    rank::world_size makes global step k consume exactly the contiguous slice
    [k*B, (k+1)*B) of the remaining permutation, B = batch_size * world_size:
    after any whole step the consumed samples are a prefix of the permutation.
    """
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    remaining = torch.randperm(dataset_size, generator=generator)[start_index:].tolist()
    global_batch = batch_size * world_size
    remaining = remaining[: len(remaining) // global_batch * global_batch]
    return remaining[rank::world_size]


class ElasticDistributedSampler(DistributedSampler):
    """DistributedSampler that starts the epoch at a given sample position."""

    def __init__(self, dataset, num_replicas, rank, batch_size, seed=0, start_index=0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.batch_size = batch_size
        self.start_index = start_index

    def set_epoch(self, epoch, start_index=0):
        super().set_epoch(epoch)
        self.start_index = start_index

    def _indices(self):
        return epoch_shard(
            len(self.dataset), self.seed, self.epoch, self.start_index, self.rank, self.num_replicas, self.batch_size
        )

    def __iter__(self):
        return iter(self._indices())

    def __len__(self):
        return len(self._indices())


def make_dataset(size, seed):
    """Noisy linear regression, identical in every process for a given seed."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    features = torch.randn(size, INPUT_DIM, generator=generator)
    true_weights = torch.randn(INPUT_DIM, 1, generator=generator)
    targets = features @ true_weights + 0.1 * torch.randn(size, 1, generator=generator)
    return TensorDataset(features, targets)


# ---------------------------------------------------------------- checkpoints


class CheckpointError(Exception):
    """A checkpoint file that is truncated, corrupt or not ours."""


def encode_checkpoint(state):
    """File bytes: one header line (magic, sha256, length) + torch.save payload.

    The checksum lives in the same file as the payload so that one os.replace
    publishes both together.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    return checkpoint_header(hashlib.sha256(payload).hexdigest().encode(), len(payload)) + payload


def checkpoint_header(digest, length):
    """The header line; the length zero-padded to a fixed width, so that write_checkpoint can fill it in last."""
    return b"%s %s %020d\n" % (CKPT_MAGIC, digest, length)


def decode_checkpoint(data):
    """Inverse of encode_checkpoint; raises CheckpointError unless intact."""
    header, newline, payload = data.partition(b"\n")
    fields = header.split(b" ")
    if not newline or len(fields) != 3 or fields[0] != CKPT_MAGIC:
        raise CheckpointError("bad header")
    if not fields[2].isdigit() or int(fields[2]) != len(payload):
        raise CheckpointError(f"payload is {len(payload)} bytes, header says {fields[2]!r}")
    if hashlib.sha256(payload).hexdigest().encode() != fields[1]:
        raise CheckpointError("sha256 mismatch")
    return torch.load(io.BytesIO(payload), weights_only=True)


def list_checkpoints(ckpt_dir):
    """(step, path) of the checkpoint files in ckpt_dir, newest first."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), os.path.join(ckpt_dir, name)) for name in names if (m := CKPT_NAME.match(name))]
    return sorted(found, reverse=True)


def checkpoint_path(ckpt_dir, step):
    return os.path.join(ckpt_dir, f"ckpt-{step:08d}.pt")


def write_checkpoint(ckpt_dir, step, state):
    """Atomically write the checkpoint for `step`, keep the newest CKPTS_KEPT.

    torch.save writes straight into the temp file, as a job's save to its checkpoint directory does
    (the instrumentation then times the save, to its os.replace: how long it blocks training). The
    header goes first with the digest's place held, and is filled in once the payload is written.
    """
    os.makedirs(ckpt_dir, exist_ok=True)
    path = checkpoint_path(ckpt_dir, step)
    tmp_path = f"{path}.tmp.{os.getpid()}"
    with open(tmp_path, "w+b") as tmp_file:
        tmp_file.write(checkpoint_header(b"0" * 64, 0))
        start = tmp_file.tell()
        torch.save(state, tmp_file)
        length = tmp_file.tell() - start
        tmp_file.seek(start)
        digest = hashlib.file_digest(tmp_file, "sha256").hexdigest()
        tmp_file.seek(0)
        tmp_file.write(checkpoint_header(digest.encode(), length))
        tmp_file.flush()
        os.fsync(tmp_file.fileno())
    os.replace(tmp_path, path)
    # fsync the directory too, or the rename itself may be lost on a crash.
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for _, old_path in list_checkpoints(ckpt_dir)[CKPTS_KEPT:]:
        os.remove(old_path)
    # Temp files of writers killed mid-write; only one rank 0 writes at a time.
    for name in os.listdir(ckpt_dir):
        if ".pt.tmp." in name and name != os.path.basename(tmp_path):
            os.remove(os.path.join(ckpt_dir, name))
    return path


def find_latest_checkpoint(ckpt_dir, warn):
    """(step, sha256 bytes, state) of the newest intact checkpoint, or (None, None, None).

    A corrupt or truncated file is reported through warn(message) and the next
    older one is tried.
    """
    for step, path in list_checkpoints(ckpt_dir):
        try:
            with open(path, "rb") as ckpt_file:
                data = ckpt_file.read()
            state = decode_checkpoint(data)
        except (OSError, CheckpointError) as error:
            warn(f"skipping unusable checkpoint {path}: {error}")
            continue
        return step, hashlib.sha256(data).digest(), state
    return None, None, None


# ---------------------------------------------------------------- rendezvous


def agree_on_start_token(store, rank, world_size, timeout_s, poll_s=0.02):
    """A fresh token that every rank of this start gets, for a key namespace.

    torchrun's agent keeps one TCPStore for all restarts and the workers'
    keys are not scoped per start, so a restarted gloo/NCCL group reads the
    dead group's addresses. Only unique keys are trusted here: each rank > 0
    posts a random nonce, rank 0 answers every nonce it sees with its token
    under a key named by the nonce, and waits until each rank confirms under
    a key named by the token. Stale hello keys only get answers no one reads.
    """
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        token, answered = uuid.uuid4().hex, {}
        confirmations = [f"sim-start/confirm/{token}/{peer}" for peer in range(1, world_size)]
        while confirmations and not store.check(confirmations):
            for peer in range(1, world_size):
                hello_key = f"sim-start/hello/{peer}"
                if store.check([hello_key]) and answered.get(peer) != (nonce := store.get(hello_key)):
                    store.set(f"sim-start/answer/{nonce.decode()}", token)
                    answered[peer] = nonce
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not confirm start token within {timeout_s}s")
            time.sleep(poll_s)
        return token
    nonce = uuid.uuid4().hex
    store.set(f"sim-start/hello/{rank}", nonce)
    store.wait([f"sim-start/answer/{nonce}"], timedelta(seconds=max(0.0, deadline - time.monotonic())))
    token = store.get(f"sim-start/answer/{nonce}").decode()
    store.set(f"sim-start/confirm/{token}/{rank}", "1")
    return token


def init_process_group(backend, rank, world_size, timeout_s):
    """init_process_group in a key namespace of its own for this start."""
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # env:// makes this start's rank 0 host a brand-new store: nothing stale.
        dist.init_process_group(backend, timeout=timeout)
        return
    shared = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    token = agree_on_start_token(shared, rank, world_size, timeout_s)
    dist.init_process_group(
        backend, store=dist.PrefixStore(f"sim-pg/{token}/", shared), rank=rank, world_size=world_size, timeout=timeout
    )


# ---------------------------------------------------------------- main


def emit(kind, ctx, **fields):
    """Print one JSON line; ctx holds the identity fields of this process."""
    line = json.dumps({"sim": kind, "t": wall_clock(), **ctx, **fields}) + "\n"
    # One write call per line: all workers share one stdout, and print() writes
    # the newline separately, which interleaves lines under PYTHONUNBUFFERED=1.
    sys.stdout.write(line)
    sys.stdout.flush()


def number(kind, above=None, at_least=None):
    """argparse type: a `kind` number with a lower bound."""

    def parse(text):
        value = kind(text)
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {value}")
        if (above is not None and value <= above) or (at_least is not None and value < at_least):
            bound = f"> {above}" if above is not None else f">= {at_least}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse names it in "invalid int value"
    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--steps", type=number(int, at_least=1), default=200, help="global optimizer steps of the job")
    add("--batch-size", type=number(int, at_least=1), default=16, help="per-worker batch size")
    add("--lr", type=number(float, above=0), default=0.01, help="initial SGD learning rate")
    add("--seed", type=int, default=0, help="seed of the data, its order and the initial weights")
    add("--dataset-size", type=number(int, at_least=1), default=4096, help="samples in the dataset")
    add(
        "--ckpt-dir",
        default=os.environ.get("SIM_CKPT_DIR", "/ckpt"),
        help="shared checkpoint directory (default: $SIM_CKPT_DIR, else /ckpt)",
    )
    add("--ckpt-interval", type=number(int, at_least=1), default=10, help="checkpoint every N steps")
    add("--step-time", type=number(float, at_least=0), default=0.0, help="minimum seconds per step")
    add("--pg-timeout", type=number(float, above=0), default=60.0, help="process group timeout (s)")
    add(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default=os.environ.get("SIM_BACKEND", "auto"),
        help="auto: nccl if CUDA is available, else gloo (default: $SIM_BACKEND, else auto)",
    )
    return parser.parse_args(argv)


class WholeErrorFile(ErrorHandler):
    """torch's error handler, its error file written whole or not at all (a temp file renamed into place): torch
    opens the file for writing, then writes it, and an agent that read it empty between the two (the worker killed
    there) died of a JSONDecodeError in its own poll (seen once in CI). Without the file the agent names the exit."""

    def record_exception(self, e: BaseException) -> None:
        final = self._get_error_file_path()
        if not final:
            return super().record_exception(e)
        partial = f"{final}.partial.{os.getpid()}"
        self._get_error_file_path = lambda: partial
        try:
            super().record_exception(e)
        finally:
            del self._get_error_file_path
        os.replace(partial, final)


@functools.partial(record, error_handler=WholeErrorFile())
def main(argv=None):
    args = parse_args(argv)
    started = wall_clock()
    # Read fresh on every start: a restarted worker is a new process whose
    # rank and world size may differ from the previous incarnation's.
    if not {"RANK", "LOCAL_RANK", "WORLD_SIZE"} <= os.environ.keys():
        raise SystemExit("train.py: RANK, LOCAL_RANK and WORLD_SIZE are unset: run it under torchrun")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    ctx = {
        "node": socket.gethostname(),
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "run_id": os.environ.get("TORCHELASTIC_RUN_ID"),
    }

    global_batch = args.batch_size * world_size
    if args.dataset_size < global_batch:  # an epoch would hold no whole step
        raise SystemExit(f"--dataset-size {args.dataset_size} is smaller than one global batch ({global_batch})")

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    init_process_group(backend, rank, world_size, args.pg_timeout)
    pg_ready_at = wall_clock()

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts them anyway)
    model = torch.nn.Sequential(
        torch.nn.Linear(INPUT_DIM, HIDDEN_DIM), torch.nn.ReLU(), torch.nn.Linear(HIDDEN_DIM, 1)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)

    # Rank 0 picks the checkpoint (warning about fallbacks once) and tells the
    # others its step and sha256, so no rank resumes from another file. A plain
    # tensor, not broadcast_object_list: that one needs numpy, which may be absent.
    ckpt_began_at = wall_clock()
    choice = torch.full((33,), -1, dtype=torch.int64)  # [step, 32 digest bytes]
    if rank == 0:
        found_step, digest, _ = find_latest_checkpoint(args.ckpt_dir, lambda msg: emit("warning", ctx, message=msg))
        if found_step is not None:
            choice = torch.tensor([found_step, *digest], dtype=torch.int64)
    choice = choice.to(device)
    dist.broadcast(choice, src=0)
    choice = choice.tolist()
    step, epoch, seen_in_epoch, ckpt_world_size = 0, 0, 0, None
    if choice[0] >= 0:
        ckpt_path = checkpoint_path(args.ckpt_dir, choice[0])
        with open(ckpt_path, "rb") as ckpt_file:
            data = ckpt_file.read()
        if hashlib.sha256(data).digest() != bytes(choice[1:]):
            raise RuntimeError(f"{ckpt_path} differs from what rank 0 read: is {args.ckpt_dir} shared?")
        state = decode_checkpoint(data)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, seen_in_epoch = state["step"], state["epoch"], state["samples_seen_in_epoch"]
        ckpt_world_size = state["world_size"]
    emit(
        "start",
        ctx,
        resumed_from=step,
        ckpt_world_size=ckpt_world_size,
        backend=backend,
        pid=os.getpid(),
        t_imported=IMPORTED_AT,
        t_pg_ready=pg_ready_at,
        t_ckpt_began=ckpt_began_at,
    )
    start_step = step

    ddp_model = DistributedDataParallel(model, device_ids=[local_rank] if backend == "nccl" else None)
    dataset = make_dataset(args.dataset_size, args.seed)
    sampler = ElasticDistributedSampler(dataset, world_size, rank, args.batch_size, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    loss_fn = torch.nn.MSELoss()

    while step < args.steps:
        sampler.set_epoch(epoch, start_index=seen_in_epoch)
        for features, targets in loader:
            step_began = time.monotonic()
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(features.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            seen_in_epoch += global_batch
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)  # report the job's loss, not one shard's
            mean_loss = mean_loss.item() / world_size
            emit("progress", ctx, step=step, epoch=epoch, loss=mean_loss)
            if rank == 0 and (step % args.ckpt_interval == 0 or step == args.steps):
                path = write_checkpoint(
                    args.ckpt_dir,
                    step,
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "step": step,
                        "epoch": epoch,
                        "samples_seen_in_epoch": seen_in_epoch,
                        "world_size": world_size,
                        "loss": mean_loss,
                    },
                )
                emit("checkpoint", ctx, step=step, path=path)
            time.sleep(max(0.0, args.step_time - (time.monotonic() - step_began)))
            if step >= args.steps:
                break
        else:  # epoch exhausted (only whole global batches are used)
            epoch, seen_in_epoch = epoch + 1, 0

    if rank == 0:
        emit("summary", ctx, final_step=step, elapsed=wall_clock() - started, steps_run_this_start=step - start_step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
