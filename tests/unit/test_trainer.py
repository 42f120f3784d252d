"""Unit tests of the pure parts of trainer/train.py (no torchrun, no process group)."""

import hashlib
import importlib.util
import os
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

TRAIN_PY = Path(__file__).resolve().parents[2] / "trainer" / "train.py"
_spec = importlib.util.spec_from_file_location("elastic_sim_train", TRAIN_PY)
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)


def permutation(size, seed, epoch):
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator).tolist()


def consumed_by_steps(size, seed, epoch, start, world_size, batch_size, steps):
    """Samples all ranks read in `steps` global steps from position `start`."""
    shards = [train.epoch_shard(size, seed, epoch, start, rank, world_size, batch_size) for rank in range(world_size)]
    return [index for shard in shards for index in shard[: steps * batch_size]]


# ---------------------------------------------------------------- sampling


def test_shards_of_a_fresh_epoch_are_disjoint_and_cover_whole_global_batches():
    size, batch_size, world_size = 1000, 16, 3
    shards = [train.epoch_shard(size, 0, 0, 0, rank, world_size, batch_size) for rank in range(world_size)]
    everything = [index for shard in shards for index in shard]
    global_batch = batch_size * world_size
    assert len(everything) == len(set(everything)) == size // global_batch * global_batch
    assert {len(shard) for shard in shards} == {size // global_batch * batch_size}


def test_each_global_step_consumes_the_next_contiguous_slice_of_the_permutation():
    size, batch_size, world_size, start = 1000, 4, 3, 100
    perm = permutation(size, 7, 2)
    shards = [train.epoch_shard(size, 7, 2, start, rank, world_size, batch_size) for rank in range(world_size)]
    global_batch = batch_size * world_size
    for step in range(len(shards[0]) // batch_size):
        read = {i for shard in shards for i in shard[step * batch_size : (step + 1) * batch_size]}
        assert read == set(perm[start + step * global_batch : start + (step + 1) * global_batch])


def test_reshard_from_world_size_2_to_3_reads_every_remaining_sample_exactly_once():
    size, seed, epoch, batch_size = 4096, 0, 1, 16
    steps_at_2 = 37
    before = consumed_by_steps(size, seed, epoch, 0, 2, batch_size, steps_at_2)
    samples_seen_in_epoch = steps_at_2 * batch_size * 2  # what the checkpoint stores
    after = [
        i for rank in range(3) for i in train.epoch_shard(size, seed, epoch, samples_seen_in_epoch, rank, 3, batch_size)
    ]

    assert len(before) + len(after) == len(set(before) | set(after)), "a sample was replayed"
    perm = permutation(size, seed, epoch)
    assert set(before) == set(perm[:samples_seen_in_epoch])
    # Only the last partial global batch at the new world size is left out.
    tail = (size - samples_seen_in_epoch) % (batch_size * 3)
    assert set(before) | set(after) == set(perm[: size - tail])
    assert tail < batch_size * 3


def test_reshard_to_a_smaller_world_size_too():
    size, batch_size = 512, 8
    before = consumed_by_steps(size, 3, 0, 0, 4, batch_size, 5)
    after = [i for rank in range(2) for i in train.epoch_shard(size, 3, 0, 5 * 32, rank, 2, batch_size)]
    assert not set(before) & set(after)
    assert len(set(before) | set(after)) == size  # 512 - 160 = 352 = 22 whole batches of 16


def test_permutation_depends_on_seed_and_epoch_not_world_size():
    one_worker = train.epoch_shard(256, 5, 3, 0, 0, 1, 1)
    assert one_worker == permutation(256, 5, 3)
    assert train.epoch_shard(256, 5, 4, 0, 0, 1, 1) != one_worker
    assert train.epoch_shard(256, 6, 3, 0, 0, 1, 1) != one_worker


def test_start_index_at_or_past_the_epoch_end_yields_nothing():
    assert train.epoch_shard(100, 0, 0, 100, 0, 2, 4) == []
    assert train.epoch_shard(100, 0, 0, 95, 0, 2, 4) == []  # 5 left, less than one global batch


def test_sampler_with_dataloader_yields_the_shard_and_honours_set_epoch():
    dataset = train.make_dataset(200, seed=0)
    sampler = train.ElasticDistributedSampler(dataset, num_replicas=2, rank=1, batch_size=4, seed=9)
    sampler.set_epoch(2, start_index=40)
    expected = train.epoch_shard(200, 9, 2, 40, 1, 2, 4)
    assert list(sampler) == expected and len(sampler) == len(expected)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    batches = list(loader)
    assert len(batches) == len(expected) // 4
    assert torch.equal(batches[0][0], dataset.tensors[0][expected[:4]])
    sampler.set_epoch(3)
    assert list(sampler) == train.epoch_shard(200, 9, 3, 0, 1, 2, 4)


def test_dataset_is_deterministic():
    first, second = train.make_dataset(64, seed=1), train.make_dataset(64, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(first.tensors, second.tensors, strict=True))
    assert not torch.equal(first.tensors[0], train.make_dataset(64, seed=2).tensors[0])


# ---------------------------------------------------------------- checkpoints


def training_state(step):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "epoch": 1,
        "samples_seen_in_epoch": 64,
        "world_size": 2,
        "loss": 0.5,
    }


def test_checkpoint_round_trip_keeps_model_optimizer_and_scheduler_state():
    state = training_state(7)
    loaded = train.decode_checkpoint(train.encode_checkpoint(state))
    assert {k: loaded[k] for k in ("step", "epoch", "samples_seen_in_epoch", "world_size", "loss")} == {
        "step": 7,
        "epoch": 1,
        "samples_seen_in_epoch": 64,
        "world_size": 2,
        "loss": 0.5,
    }
    assert torch.equal(loaded["model"]["weight"], state["model"]["weight"])
    momentum = loaded["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, state["optimizer"]["state"][0]["momentum_buffer"])
    assert loaded["scheduler"]["last_epoch"] == 1


@pytest.mark.parametrize("damage", ["flip_payload_byte", "truncate", "flip_digest", "garbage", "empty"])
def test_decode_rejects_damaged_checkpoints(damage):
    data = train.encode_checkpoint(training_state(1))
    header_end = data.index(b"\n") + 1
    damaged = {
        "flip_payload_byte": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
        "truncate": data[: header_end + (len(data) - header_end) // 2],
        "flip_digest": data[:30] + (b"0" if data[30:31] != b"0" else b"1") + data[31:],
        "garbage": b"PK\x03\x04 not a checkpoint",
        "empty": b"",
    }[damage]
    with pytest.raises(train.CheckpointError):
        train.decode_checkpoint(damaged)


def test_write_checkpoint_is_atomic_keeps_the_last_two_and_clears_stale_temp_files(tmp_path):
    ckpt_dir = tmp_path / "new" / "ckpt"  # created on demand
    for step in (10, 20):
        train.write_checkpoint(str(ckpt_dir), step, training_state(step))
    (ckpt_dir / "ckpt-00000030.pt.tmp.99999").write_bytes(b"half a write")
    path = train.write_checkpoint(str(ckpt_dir), 30, training_state(30))
    assert path == str(ckpt_dir / "ckpt-00000030.pt")
    assert sorted(os.listdir(ckpt_dir)) == ["ckpt-00000020.pt", "ckpt-00000030.pt"]
    assert [step for step, _ in train.list_checkpoints(str(ckpt_dir))] == [30, 20]


def test_write_checkpoint_saves_with_torch_save_into_the_temp_file_it_then_renames(tmp_path, monkeypatch):
    """A real job's save: torch.save into a file in the checkpoint directory, renamed into place (what the
    instrumentation times as the save's cost), not into memory first."""
    targets = []
    save = torch.save

    def spy(obj, f, *args, **kwargs):
        targets.append(getattr(f, "name", f))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", spy)
    path = train.write_checkpoint(str(tmp_path), 10, training_state(10))
    assert targets == [f"{path}.tmp.{os.getpid()}"]
    step, _, state = train.find_latest_checkpoint(str(tmp_path), pytest.fail)
    assert (step, state["step"]) == (10, 10)
    assert train.decode_checkpoint(Path(path).read_bytes())["step"] == 10


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path):
    for step in (10, 20):
        train.write_checkpoint(str(tmp_path), step, training_state(step))
    warnings = []
    step, digest, state = train.find_latest_checkpoint(str(tmp_path), warnings.append)
    assert (step, state["step"], warnings) == (20, 20, [])

    latest = tmp_path / "ckpt-00000020.pt"
    latest.write_bytes(latest.read_bytes()[:-100])  # a truncated write
    step, digest, state = train.find_latest_checkpoint(str(tmp_path), warnings.append)
    assert (step, state["step"]) == (10, 10)
    assert len(warnings) == 1 and "ckpt-00000020.pt" in warnings[0]
    assert digest == hashlib.sha256((tmp_path / "ckpt-00000010.pt").read_bytes()).digest()


def test_no_usable_checkpoint_means_start_from_scratch(tmp_path):
    warnings = []
    assert train.find_latest_checkpoint(str(tmp_path / "missing"), warnings.append) == (None, None, None)
    (tmp_path / "ckpt-00000010.pt").write_bytes(b"junk")
    (tmp_path / "ckpt-00000020.pt.tmp.1").write_bytes(b"junk")  # temp files are never candidates
    assert train.find_latest_checkpoint(str(tmp_path), warnings.append) == (None, None, None)
    assert len(warnings) == 1


# ---------------------------------------------------------------- start token


def test_every_rank_agrees_on_a_fresh_token_despite_stale_keys_of_an_earlier_start():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    server.set("sim-start/hello/1", "nonce-of-a-dead-worker")  # left over by the last start
    server.set("sim-start/hello/2", "another-dead-nonce")

    def one_start(world_size):
        tokens = [None] * world_size

        def run(rank):
            client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
            tokens[rank] = train.agree_on_start_token(client, rank, world_size, timeout_s=10)

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        return tokens

    first = one_start(3)
    assert first[0] is not None and first == [first[0]] * 3
    second = one_start(2)  # a restart, at another world size
    assert second[0] is not None and second == [second[0]] * 2 and second[0] != first[0]


# ---------------------------------------------------------------- arguments


def test_defaults():
    args = train.parse_args([])
    assert (args.steps, args.batch_size, args.ckpt_interval, args.dataset_size) == (200, 16, 10, 4096)
    assert (args.step_time, args.pg_timeout, args.seed, args.backend) == (0.0, 60.0, 0, "auto")


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--steps", "x"],
        ["--lr", "-1"],
        ["--step-time", "-0.5"],
        ["--pg-timeout", "0"],
        ["--backend", "mpi"],
        ["--step-time", "nan"],
        ["--no-such-flag"],
    ],
)
def test_bad_arguments_exit_non_zero(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_harness_knows_the_trainers_own_defaults():
    from sim.core.spec import SHIPPED_TRAINER_DEFAULTS

    args = train.parse_args([])
    assert SHIPPED_TRAINER_DEFAULTS == {"--steps": args.steps, "--ckpt-interval": args.ckpt_interval}
