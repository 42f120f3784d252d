"""The node image's device emulation (images/node/elastic_sim_devices.py): pure parts in-process, then
real torch in subprocesses with a fake torchrun environment: a GPU script's calls on a CPU-only torch,
and NCCL's failure timing of a collective whose peer died, against gloo's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sim.verdict.diagnoses import collectives

NODE_DIR = Path(__file__).resolve().parents[2] / "images" / "node"
sys.path.insert(0, str(NODE_DIR))

import elastic_sim_devices as devices  # noqa: E402

WITH_NODE_SITE = f"import site; site.addsitedir({str(NODE_DIR)!r}); "
WORKER_ENV = {
    "LOCAL_RANK": "0",
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_WORLD_SIZE": "1",
    "TORCHELASTIC_RUN_ID": "demo-r1",
    "SIM_NODE": "node1",
    "SIM_DEVICES": "emulated",
    "SIM_DEVICES_PER_NODE": "4",
}
CLEAN = ("LOCAL_RANK", "RANK", "WORLD_SIZE", devices.OWNER_ENV, "SIM_INSTRUMENTED_PID", "SIM_DEVICES")


def test_only_emulating_torchrun_workers_emulate():
    assert devices.should_emulate(WORKER_ENV)
    assert not devices.should_emulate({})
    assert not devices.should_emulate({**WORKER_ENV, "SIM_DEVICES": "gpu"})
    assert not devices.should_emulate({k: v for k, v in WORKER_ENV.items() if k != "TORCHELASTIC_RUN_ID"})
    assert devices.devices_per_node(WORKER_ENV) == 4
    assert devices.devices_per_node({"LOCAL_WORLD_SIZE": "2"}) == 2
    assert devices.failure_timing({}) == "nccl" and devices.failure_timing({"SIM_FAILURE_TIMING": "gloo"}) == "gloo"


def test_nccl_backends_become_gloo():
    assert devices.mapped_backend("nccl") == "gloo"
    assert devices.mapped_backend("NCCL") == "gloo"
    assert devices.mapped_backend("cpu:gloo,cuda:nccl") == "gloo"
    assert devices.mapped_backend("cpu:mpi,cuda:nccl") == "cpu:mpi"
    assert devices.mapped_backend("gloo") == "gloo"
    assert devices.mapped_backend(None) is None


def test_watchdog_words_are_ncclS():
    lines = devices.watchdog_lines(3, 78, "BROADCAST", 80, 600000, 600096)
    assert lines[0].endswith(
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=78, OpType=BROADCAST, "
        "NumelIn=80, NumelOut=80, Timeout(ms)=600000) ran for 600096 milliseconds before timing out."
    )
    assert "we are taking the entire process down" in lines[2]


def test_a_guarded_call_inside_another_counts_once_and_other_threads_are_not_inside_it():
    import threading

    emulator = devices.Emulator(write=None, env={})
    seen = []
    inner = emulator.guarded(lambda: seen.append(emulator.seq), "ALLREDUCE")
    outer = emulator.guarded(lambda: (inner(), seen.append(emulator.seq)), "BARRIER")
    outer()
    assert seen == [1, 1] and emulator._inside is None
    other = threading.Thread(target=inner)
    outer = emulator.guarded(lambda: (other.start(), other.join()), "BARRIER")
    outer()
    assert seen[-1] == 3  # the other thread's call was its own, counted: it is not inside this one


def test_the_default_nccl_timeout_is_the_same_everywhere():
    assert devices.NCCL_DEFAULT_TIMEOUT_S == collectives.NCCL_DEFAULT_TIMEOUT_S == 600.0


GPU_SCRIPT = textwrap.dedent("""
    import datetime, os, sys, tempfile
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    assert torch.cuda.is_available() and torch.cuda.device_count() == 4
    torch.cuda.set_device(2); assert torch.cuda.current_device() == 2
    props = torch.cuda.get_device_properties(0)
    assert props.total_memory > 0 and props.major >= 7 and "emulated" in torch.cuda.get_device_name()
    torch.cuda.manual_seed_all(0); torch.cuda.synchronize(); torch.cuda.empty_cache()
    device = torch.device("cuda", 0)
    model = torch.nn.Linear(4, 2).cuda().to(device).to("cuda:1").to(1)
    x = torch.randn(3, 4, device="cuda") + torch.zeros(3, 4, device=device) + torch.ones(3, 4).cuda()
    x = x.to("cuda").to(0).new_zeros((3, 4), device="cuda:0") + x
    assert x.device.type == "cpu" and next(model.parameters()).device.type == "cpu"
    with torch.device("cuda"):
        assert torch.empty(2).device.type == "cpu"
    path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    torch.save(model.state_dict(), path)
    for where in ("cuda:0", device, {"cuda:0": "cuda:1"}, lambda storage, loc: storage.cuda(0), None):
        model.load_state_dict(torch.load(path, map_location=where))
    for _ in DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, pin_memory=True):
        pass
    assert torch.cuda.memory_allocated() >= 0 and torch.cuda.max_memory_allocated() >= 0
    free, total = torch.cuda.mem_get_info(); assert 0 < free <= total
    torch.cuda.reset_peak_memory_stats(); torch.cuda.memory_reserved(); torch.cuda.max_memory_reserved()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.Stream()
    start.record()
    with torch.cuda.stream(stream):
        torch.cuda.nvtx.range_push("fwd"); y = model(x); torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("bwd"):
        pass
    end.record(); end.synchronize(); assert start.elapsed_time(end) >= 0.0
    torch.cuda.current_stream().wait_stream(stream)
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        y = model(x)
    assert y.dtype == torch.float16  # the CPU's autocast, in CUDA's dtype
    with torch.cuda.amp.autocast():
        pass
    torch.cuda.amp.GradScaler()
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=30), device_id=device)
    assert dist.get_backend() == "gloo" and dist.is_nccl_available()
    group = dist.new_group([0], backend="nccl")
    t = torch.ones(2, device="cuda"); dist.all_reduce(t, group=group); dist.barrier(device_ids=[0])
    ddp = DDP(model, device_ids=[0], output_device=0)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    scaler.scale(ddp(x).sum()).backward(); scaler.step(optimizer); scaler.update()
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cuda", (1,))
    assert mesh.device_type == "cpu"
    dist.destroy_process_group()
    print("ran")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_worker(tmp_path: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.py"
    path.write_text(script)
    code = WITH_NODE_SITE + f"import runpy, sys; sys.argv = {[str(path), *args]!r}; runpy.run_path(sys.argv[0])"
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**base, **WORKER_ENV, **env}
    )


def records(events: Path) -> list[dict]:
    return [json.loads(line) for path in events.glob("*.jsonl") for line in path.read_text().splitlines()]


def test_a_gpu_script_runs_unchanged_and_its_emulated_calls_are_counted(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    result = run_worker(tmp_path, GPU_SCRIPT, str(free_port()), SIM_EVENTS_DIR=str(events), SIM_INSTRUMENT="0")
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout == "ran\n"
    assert result.stderr.count("autocast and GradScaler for cuda run on the CPU's autocast") == 1  # said once
    written = records(events)
    [announced] = [r for r in written if r["event"] == "emulated"]
    assert (announced["devices"], announced["per_node"], announced["failure_timing"]) == ("emulated", 4, "nccl")
    calls = [r for r in written if r["event"] == "emulated_calls"][-1]["calls"]
    for name in (
        "torch.cuda.set_device",
        "Module.cuda()",
        "Module.to(cuda)",
        "Tensor.to(cuda)",
        "factory(device=cuda)",
        "torch.load(map_location=cuda)",
        "torch.load(map_location=callable)",
        "DataLoader(pin_memory=True)",
        "torch.cuda.Event",
        "torch.cuda.Stream",
        "torch.cuda.nvtx",
        "autocast(cuda)",
        "GradScaler(cuda)",
        "init_process_group(nccl)",
        "init_process_group(device_id=)",
        "new_group(backend=nccl)",
        "barrier(device_ids=)",
        "DDP(device_ids=)",
        "init_device_mesh(cuda)",
    ):
        assert calls.get(name, 0) >= 1, (name, calls)


GENERIC_SCRIPT = textwrap.dedent("""
    import os, sys, tempfile
    import torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    acc = torch.accelerator
    assert acc.is_available() and acc.device_count() == 4
    assert acc.current_accelerator() == torch.device("cuda") and acc.current_accelerator(True).type == "cuda"
    acc.set_device_index(3); assert acc.current_device_index() == 3 and torch.cuda.current_device() == 3
    with acc.device_index(1):
        assert acc.current_device_index() == 1
    assert acc.current_device_index() == 3
    acc.set_device_index("cuda:2"); acc.set_device_index(torch.device("cuda", 2))
    assert acc.current_device_index() == 2
    acc.synchronize(); acc.synchronize(torch.device("cuda:2")); acc.current_stream().synchronize()
    assert not acc.current_stream().is_capturing()
    assert torch.float16 in acc.get_device_capability()["supported_dtypes"]
    acc.empty_cache(); acc.reset_peak_memory_stats(); acc.reset_accumulated_memory_stats()
    assert acc.memory_allocated() >= 0 and acc.max_memory_allocated() >= acc.memory_allocated()
    assert acc.memory_reserved() >= 0 and acc.max_memory_reserved() >= 0
    assert acc.memory_stats()["allocated_bytes.all.current"] >= 0
    free, total = acc.get_memory_info(); assert 0 < free <= total
    # torch's own modules still get the CPU's answers: they run on it.
    probe = {"__name__": "torch._elastic_sim_probe", "torch": torch}
    exec("answer = (torch.accelerator.is_available(), torch.accelerator.current_accelerator())", probe)
    assert probe["answer"] == (False, None), probe["answer"]
    for refused in (acc.Graph, torch.cuda.CUDAGraph):
        try:
            refused()
        except RuntimeError as error:
            assert str(error).startswith("elastic-sim device emulation: CUDA graphs"), error
        else:
            raise AssertionError("a CUDA graph was not refused")
    device = torch.device(f"{acc.current_accelerator()}:1")
    assert dist.get_default_backend_for_device(device) == "nccl"
    assert dist.get_default_backend_for_device("cpu") == "gloo"
    try:
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:1", rank=0, world_size=1,
                                device_id=torch.device("cuda:4"))
    except ValueError as error:
        assert "device_id cuda:4 is out of range" in str(error) and ": 4." in str(error), error
    else:
        raise AssertionError("an out-of-range device_id was taken")
    dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device,
                            init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0, world_size=1)
    assert dist.get_backend() == "gloo"
    # AMP: the CPU's autocast in float16, a scaler that really scales.
    scaler = torch.amp.GradScaler(device.type)
    assert scaler.is_enabled() and scaler.get_scale() == 65536.0
    linear = torch.nn.Linear(4, 4).to(device)
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    with torch.amp.autocast(device_type=device.type, dtype=torch.float16):
        out = linear(torch.randn(2, 4, device=device))
    assert out.dtype == torch.float16
    scaler.scale(out.float().sum()).backward(); scaler.step(optimizer); scaler.update()
    linear.weight.grad = torch.full_like(linear.weight, float("inf"))  # an overflow: the step is skipped
    before = linear.weight.detach().clone()
    scaler.step(optimizer); scaler.update()
    assert torch.equal(before, linear.weight) and scaler.get_scale() < 65536.0
    # FSDP2: meta-device init, fully_shard per layer over a CUDA mesh, to_empty, DCP save and load.
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    assert mesh.device_type == "cpu"
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    assert isinstance(model[0].weight, DTensor) and model[0].weight.device.type == "cpu"
    for layer in model:
        layer.reset_parameters()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8, device=device)).sum().backward(); optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    folder = tempfile.mkdtemp()
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
    saved = model[0].weight.full_tensor().clone()
    with torch.no_grad():
        model[0].weight.zero_()
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert torch.equal(model[0].weight.full_tensor(), saved)
    dist.destroy_process_group()
    print("ran")
""")


def test_a_device_generic_script_runs_unchanged_and_its_emulated_calls_are_counted(tmp_path):
    """torch.accelerator, get_default_backend_for_device, device_id=, AMP, meta init with to_empty, FSDP2
    on a CUDA mesh and DCP: the calls of the current PyTorch examples, on a CPU-only torch."""
    events = tmp_path / "events"
    events.mkdir()
    result = run_worker(tmp_path, GENERIC_SCRIPT, str(free_port()), SIM_EVENTS_DIR=str(events), SIM_INSTRUMENT="0")
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout == "ran\n"
    calls = [r for r in records(events) if r["event"] == "emulated_calls"][-1]["calls"]
    for name in (
        "torch.accelerator.is_available",
        "torch.accelerator.device_count",
        "torch.accelerator.current_accelerator",
        "torch.accelerator.set_device_index",
        "torch.accelerator.device_index",
        "torch.accelerator.current_device_index",
        "torch.accelerator.synchronize",
        "torch.accelerator.current_stream",
        "torch.accelerator.get_device_capability",
        "torch.accelerator.empty_cache",
        "torch.accelerator.memory_allocated",
        "torch.accelerator.max_memory_allocated",
        "torch.accelerator.memory_reserved",
        "torch.accelerator.max_memory_reserved",
        "torch.accelerator.memory_stats",
        "torch.accelerator.reset_peak_memory_stats",
        "torch.accelerator.reset_accumulated_memory_stats",
        "torch.accelerator.get_memory_info",
        "get_default_backend_for_device(cuda)",
        "init_process_group(nccl)",
        "init_process_group(device_id=)",
        "GradScaler(cuda)",
        "autocast(cuda)",
        "Module.to(cuda)",
        "Module.to_empty(cuda)",
        "init_device_mesh(cuda)",
    ):
        assert calls.get(name, 0) >= 1, (name, calls)
    assert "torch.accelerator.Graph" not in calls  # refused, not emulated


def test_an_accelerator_gate_sees_the_emulated_count(tmp_path):
    """The examples' gate (at least 2 accelerators) passes with 2 workers per node and says so with 1."""
    gate = "import torch\nprint(torch.accelerator.is_available() and torch.accelerator.device_count() >= 2)\n"
    assert run_worker(tmp_path, gate, SIM_DEVICES_PER_NODE="2").stdout == "True\n"
    assert run_worker(tmp_path, gate, SIM_DEVICES_PER_NODE="1").stdout == "False\n"


def test_without_emulation_torch_is_left_alone(tmp_path):
    result = run_worker(tmp_path, "import torch\nprint(torch.cuda.is_available())\n", SIM_DEVICES="gpu")
    assert (result.returncode, result.stdout) == (0, "False\n"), result.stderr


def test_a_cuda_extension_is_refused_with_the_way_out(tmp_path):
    script = "from torch.utils.cpp_extension import load\nload('k', sources=['k.cu'])\n"
    result = run_worker(tmp_path, script)
    assert result.returncode == 1
    assert "elastic-sim device emulation: a custom CUDA extension" in result.stderr and "--gpus" in result.stderr


def test_a_tensor_too_big_for_the_node_is_cudas_out_of_memory_error(tmp_path):
    """A script that shrinks its batch on torch.cuda.OutOfMemoryError (a batch-size finder) takes that
    path here too: the CPU allocator's refusal of a "cuda" tensor is raised as CUDA's error."""
    script = textwrap.dedent("""
        import torch
        try:
            torch.empty(1 << 40, device="cuda")  # 4 TiB
        except torch.cuda.OutOfMemoryError as error:
            print("caught:", error)
        try:
            torch.empty(-1, device="cuda")
        except torch.cuda.OutOfMemoryError:
            print("not an out-of-memory error")
        except RuntimeError:
            print("left as it was")
    """)
    result = run_worker(tmp_path, script)
    assert result.returncode == 0, result.stderr[-4000:]
    caught, other = result.stdout.splitlines()
    assert caught.startswith("caught: CUDA out of memory. Tried to allocate 4096.00 GiB. (Emulated on CPU")
    assert other == "left as it was"


PEER_SCRIPT = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group(sys.argv[3], timeout=datetime.timedelta(seconds=float(sys.argv[2])))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda(), device_ids=[rank])
    for i in range(200):
        if rank == 1 and i == 3:
            os._exit(9)
        if sys.argv[1] == "all_reduce":
            dist.all_reduce(torch.ones(3, device="cuda"))
        else:
            model(torch.randn(2, 4).cuda()).sum().backward()
        time.sleep(0.05)
""")


@pytest.mark.parametrize(
    "timing, where, backend",
    [("nccl", "all_reduce", "nccl"), ("nccl", "ddp", "nccl"), ("gloo", "all_reduce", "nccl"), ("nccl", "ddp", "gloo")],
)
def test_a_dead_peer_holds_the_survivor_until_the_timeout_under_nccl_timing(tmp_path, timing, where, backend):
    """NCCL's timing for an NCCL group; gloo's under --failure-timing gloo, and for a script that asks for gloo."""
    path = tmp_path / "peer.py"
    path.write_text(PEER_SCRIPT)
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env = {**base, **WORKER_ENV, "SIM_FAILURE_TIMING": timing, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), SIM_EVENTS_DIR=str(tmp_path))
    code = (
        WITH_NODE_SITE
        + f"import runpy, sys; sys.argv = {[str(path), where, '4', backend]!r}; runpy.run_path(sys.argv[0])"
    )
    began = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    survivor = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=60)
    elapsed = time.monotonic() - began
    in_force = "gloo" if "gloo" in (timing, backend) else "nccl"
    groups = [r for r in records(tmp_path) if r["event"] == "emulated_group"]
    assert [r["failure_timing"] for r in groups] == [in_force, in_force], groups  # what the report states
    if in_force == "gloo":
        # gloo's own failure, at once: nothing held it (no clock bound here, which a loaded machine's slow
        # `import torch` in two processes once broke).
        assert procs[0].returncode == 1 and "Watchdog" not in survivor[1], survivor[1][-3000:]
        assert "held it until" not in survivor[1]
        assert not [r for r in records(tmp_path) if r["event"] == "nccl_watchdog"]
        return
    assert procs[0].returncode == -6, survivor[1][-3000:]  # SIGABRT, as NCCL's watchdog takes it down
    assert elapsed >= 4.0, elapsed
    assert "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" in survivor[1]
    assert "OpType=ALLREDUCE" in survivor[1] and "Timeout(ms)=4000" in survivor[1]
    [held] = [r for r in records(tmp_path) if r["event"] == "nccl_watchdog" and r["rank"] == 0]
    assert held["timeout_s"] == 4.0 and held["seconds"] >= 4.0 and held["op"] == "ALLREDUCE"


FSDP2_HANG_SCRIPT = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank = int(os.environ["RANK"])
    device = torch.device(f"{torch.accelerator.current_accelerator()}:{rank}")
    torch.accelerator.set_device_index(rank)
    dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device,
                            timeout=datetime.timedelta(seconds=float(sys.argv[1])))
    mesh = init_device_mesh(device.type, (2,), mesh_dim_names=("dp",))
    print("mesh group is the default group:", mesh.get_group() is dist.group.WORLD, flush=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)).to(device)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for step in range(1, 1000):
        if rank == 1 and step == 3:
            time.sleep(600)  # stops calling collectives while its process runs on (a hang in the script)
        model(torch.randn(4, 8, device=device)).sum().backward()
""")


def test_a_hung_peer_holds_an_fsdp2_job_for_the_scripts_timeout_not_glooS_default(tmp_path):
    """FSDP2 over a 1-D mesh of the whole world: on GPUs the mesh reuses the script's NCCL default group, so a
    peer that stops calling collectives holds the others for the script's timeout= and the watchdog then
    takes them down. Emulated, torch sees CUDA with a gloo default group and made a group of its own with
    gloo's 30-minute default (the vet of tests/scripts/fsdp2_dcp.py never recovered from hang-collectives)."""
    path = tmp_path / "fsdp2_hang.py"
    path.write_text(FSDP2_HANG_SCRIPT)
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env = {**base, **WORKER_ENV, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "SIM_DEVICES_PER_NODE": "2"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), SIM_EVENTS_DIR=str(tmp_path))
    code = WITH_NODE_SITE + f"import runpy, sys; sys.argv = {[str(path), '4']!r}; runpy.run_path(sys.argv[0])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        # A bound on a hang, not a timing: the old emulation held the survivor for 30 minutes.
        out, err = procs[0].communicate(timeout=240)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert out.splitlines()[0] == "mesh group is the default group: True", (out, err[-3000:])
    assert procs[0].returncode == -6, err[-3000:]  # SIGABRT, as NCCL's watchdog takes it down
    # Said on the process's stderr, though torch's excepthook had swapped sys.stderr for a buffer.
    assert "waited out the process group's timeout (4 s) for a peer that never answered" in err, err[-3000:]
    assert "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(" in err and "Timeout(ms)=4000" in err
    [held] = [r for r in records(tmp_path) if r["event"] == "nccl_watchdog" and r["rank"] == 0]
    assert held["timeout_s"] == 4.0 and held["seconds"] == 4.0  # gloo's own wait was the timeout: not held twice
    # The history knows the timeout the script gave (the verdict's advice on a hang depends on it).
    assert [r.get("timeout_s") for r in records(tmp_path) if r["event"] == "pg_ready"] == [4.0, 4.0]


# --- the switch: spec, scenario, render, report -----------------------------------------------


def test_devices_default_to_emulated_without_gpus_and_refuse_both():
    from sim.core.errors import UsageError
    from sim.core.spec import ClusterSpec, spec_from_options

    assert ClusterSpec().devices == "emulated" and ClusterSpec().failure_timing == "nccl"
    assert ClusterSpec(gpus="1").devices == "gpu" and not ClusterSpec(gpus="1").emulated
    assert ClusterSpec.from_json(ClusterSpec(failure_timing="gloo").to_json()).failure_timing == "gloo"
    with pytest.raises(UsageError, match="--devices emulated with --gpus 1: .*drop --gpus"):
        spec_from_options({"devices": "emulated", "gpus": "1"}, None)
    with pytest.raises(UsageError, match="--devices 'tpu': unknown"):
        ClusterSpec(devices="tpu")
    with pytest.raises(UsageError, match="--failure-timing 'mpi': unknown"):
        ClusterSpec(failure_timing="mpi")
    assert ClusterSpec(nproc_per_node=3).devices_line.startswith("devices emulated on CPU (3 per node), NCCL → gloo")


def test_render_switches_the_workers_emulation():
    from sim.core.spec import ClusterSpec
    from sim.engines.render import device_env

    script = str(Path(__file__).resolve().parents[1] / "scripts" / "multinode_ddp.py")
    emulated = device_env(ClusterSpec(script=script, nproc_per_node=2, failure_timing="gloo"))
    assert emulated == {"SIM_DEVICES": "emulated", "SIM_DEVICES_PER_NODE": "2", "SIM_FAILURE_TIMING": "gloo"}
    assert device_env(ClusterSpec())["SIM_BACKEND"] == "gloo"  # the shipped trainer keeps its gloo path
    assert device_env(ClusterSpec(gpus="1")) == {} and device_env(ClusterSpec(devices="gpu")) == {}


def test_a_scenario_sets_devices_and_failure_timing():
    from sim.scenarios.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "scripts" / "multinode-ddp-node-loss.yaml"
    cluster = load_scenario(path).cluster
    assert (cluster["devices"], cluster["failure_timing"]) == ("emulated", "nccl")


def test_the_report_says_the_devices_were_emulated_and_counts_the_calls():
    from sim.verdict.report import device_facts
    from sim.verdict.runmodel import RunModel

    folder = Path(__file__).resolve().parents[1] / "data" / "runs" / "nccl_dead_peer"
    run = RunModel([json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()])
    facts = device_facts(run)
    assert facts.line.startswith("devices emulated on CPU (1 per node), NCCL → gloo; failure timing NCCL's")
    assert facts.calls["init_process_group(nccl)"] == 8  # every start of every worker
    assert facts.calls["torch.load(map_location=cuda)"] == 5 and facts.watchdog_aborts == 2
    assert device_facts(RunModel([{"t": 1.0, "type": "run", "event": "start", "spec": {"devices": "gpu"}}])) is None


@pytest.mark.parametrize(
    ("group_timings", "in_force", "words"),
    [
        (["gloo", "gloo"], "gloo", "failure timing gloo's (at once): the script asked for gloo"),
        (["nccl", "nccl"], "nccl", "failure timing NCCL's (a dead peer blocks"),
        ([], "nccl", "failure timing NCCL's (a dead peer blocks"),  # no group made yet: the configured timing
    ],
)
def test_the_report_states_the_timing_in_force_for_a_script_that_asks_for_gloo(group_timings, in_force, words):
    from sim.verdict.report import device_facts
    from sim.verdict.runmodel import RunModel

    start = {"t": 1.0, "type": "run", "event": "start", "spec": {"devices": "emulated", "failure_timing": "nccl"}}
    worker = {"type": "worker", "node": "node0", "world_size": 2, "restart": 0, "run_id": "r"}
    announced = [{**worker, "t": 2.0, "event": "emulated", "rank": r, "pid": 10 + r, "per_node": 1,
                  "devices": "emulated", "failure_timing": "nccl"} for r in (0, 1)]  # fmt: skip
    groups = [
        {**worker, "t": 3.0, "event": "emulated_group", "rank": r, "pid": 10 + r, "failure_timing": timing}
        for r, timing in enumerate(group_timings)
    ]
    facts = device_facts(RunModel([start, *announced, *groups]))
    assert facts.failure_timing == in_force and words in facts.line
