"""CUDA and NCCL emulated on CPU, in torchrun workers only: a GPU training script runs unchanged.

Imported by elastic-sim.pth at start-up of every Python process in a node. Outside a torchrun
worker, or without SIM_DEVICES=emulated (sim/engines/render.py sets it from the cluster spec), it reads the
environment and returns: no torch import, nothing installed. In an emulating worker it waits,
through elastic_sim_instrument's import hook, for the script's `import torch`, then:
  - torch.cuda answers as a node of SIM_DEVICES_PER_NODE GPUs (is_available, device_count,
    set_device/current_device, get_device_name/properties, synchronize, the memory statistics:
    FAKE numbers, the process's resident memory growth since torch was imported, over a fake 80 GiB
    device; Stream, Event with elapsed_time, stream(), nvtx ranges);
  - torch.accelerator (the device-generic API) answers the same to the script: is_available,
    device_count, current_accelerator ("cuda"), set_device_index/device_index/current_device_index,
    synchronize, current_stream, the memory calls; torch's own modules get the CPU's answers (they run
    on it); get_default_backend_for_device("cuda") is "nccl", which process groups then make gloo;
  - "cuda", "cuda:i", torch.device("cuda", i) and a bare index i, wherever a tensor or a module is
    placed (Tensor.to/.cuda/new_*, Module.to/.cuda/.to_empty, the factory functions' device=,
    torch.set_default_device and `with torch.device("cuda")`, torch.load's map_location as a
    string, a device, a dict or a callable, storage.cuda()) mean the CPU;
  - DataLoader(pin_memory=True) and Tensor.pin_memory() do not pin (CPU-only torch cannot);
  - process groups: the nccl backend ("nccl", "cpu:gloo,cuda:nccl", new_group(backend="nccl")) is
    gloo; device_id= is checked against the emulated count as torch does, then dropped, as is
    barrier(device_ids=); init_device_mesh("cuda") and
    DeviceMesh("cuda") are CPU meshes, and a 1-D mesh over the whole world reuses the default group (its
    timeout=) as it does over NCCL; DDP(device_ids=, output_device=) wraps the CPU module;
  - precision: torch.autocast("cuda"), torch.amp.GradScaler("cuda") and torch.cuda.amp.* run as the
    CPU's autocast and GradScaler("cpu"), float16 by default as on CUDA (said once, on rank 0's stderr);
  - NCCL's failure timing (SIM_FAILURE_TIMING=nccl, the default): gloo fails a collective at once
    when a peer process is gone; NCCL does not see it, the collective blocks until the process
    group's timeout, and ProcessGroupNCCL's watchdog then takes the process down (SIGABRT). So a
    collective (or a backward: DDP's all-reduce) that gloo fails because its peer is gone waits out
    the rest of the timeout (the script's `timeout=` to init_process_group, else NCCL's default,
    NCCL_DEFAULT_TIMEOUT_S), prints the watchdog's lines and aborts. SIM_FAILURE_TIMING=gloo keeps
    gloo's timing.
What cannot be emulated (a CUDA extension, CUDA graphs, CUDA kernels in triton/flash-attn, a collective
gloo lacks) fails with a line that starts with PREFIX, names it and the way out (`--gpus`).

It writes to the side channel (elastic_sim_progress.write_record): an "emulated" record (what is
emulated) at torch's import, an "emulated_group" record (the failure timing in force) when the
default process group is made, and "emulated_calls" records (the emulated calls so far, with counts)
when a new kind of call is first made (at most every CALLS_RECORD_GAP_S), at exit and before an
abort. Any failure inside this module leaves the script to run as it would without it.

Technique, measured on torch 2.13 CPU (see README "Device emulation"): wrapping the few Python entry
points that take a device (above) costs nothing on ops that do not, where a TorchFunctionMode that
rewrote device arguments would run Python on every torch call of every step (and modes are per
thread); PrivateUse1 would need a C++ device backend. torch.device itself is not replaced (pickle
and isinstance rely on the C type): a script's device objects still read "cuda:i", and its tensors
report device "cpu".
"""

import os
import re
import threading

ENV = "SIM_DEVICES"  # "emulated": on; anything else: off
PER_NODE_ENV = "SIM_DEVICES_PER_NODE"  # device_count(); else LOCAL_WORLD_SIZE
TIMING_ENV = "SIM_FAILURE_TIMING"  # "nccl" (default) | "gloo"
OWNER_ENV = "SIM_EMULATED_PID"  # the worker itself writes the records; its children emulate quietly
PREFIX = "elastic-sim device emulation: "
# torch's default NCCL process-group timeout: kProcessGroupNCCLDefaultTimeout = 10 * 60 * 1000 ms in
# torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp (torch 2.13), which torch.distributed.constants'
# default_pg_nccl_timeout reads; the CPU build lacks NCCL, so its default_pg_nccl_timeout is None.
NCCL_DEFAULT_TIMEOUT_S = 600.0
CALLS_RECORD_GAP_S = 1.0
FAKE_DEVICE_NAME = "NVIDIA A100-SXM4-80GB (elastic-sim: emulated on CPU)"
FAKE_TOTAL_MEMORY = 80 * 2**30
# gloo's words when the other end of a pair is gone (a peer process died or its node went away).
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed")
# gloo's words when the peer's node is gone without a word (no reset): its own timeout ran out, the
# process group's too. NCCL's watchdog would have said so in its words and taken the process down.
GLOO_TIMED_OUT = ("timed out waiting",)
# How NCCL names the collectives in its watchdog's WorkNCCL(... OpType=...).
OP_TYPES = {
    "all_reduce": "ALLREDUCE",
    "barrier": "ALLREDUCE",  # NCCL's barrier is an all-reduce of one element
    "broadcast": "BROADCAST",
    "all_gather": "ALLGATHER",
    "all_gather_into_tensor": "_ALLGATHER_BASE",
    "_all_gather_base": "_ALLGATHER_BASE",
    "reduce_scatter": "REDUCE_SCATTER",
    "reduce_scatter_tensor": "_REDUCE_SCATTER_BASE",
    "_reduce_scatter_base": "_REDUCE_SCATTER_BASE",
    "all_to_all": "ALLTOALL",
    "all_to_all_single": "ALLTOALL_BASE",
    "reduce": "REDUCE",
    "gather": "GATHER",
    "scatter": "SCATTER",
    "send": "SEND",
    "recv": "RECV",
}
FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "tensor",
    "as_tensor",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "empty_strided",
    "normal",
    "scalar_tensor",
    "tril_indices",
    "triu_indices",
)
TENSOR_FACTORIES = ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "new_empty_strided")
# Packages of CUDA kernels: named when a script dies for want of them.
CUDA_ONLY_PACKAGES = ("flash_attn", "triton", "xformers", "apex", "bitsandbytes", "deepspeed", "mamba_ssm")


def should_emulate(env=os.environ) -> bool:
    if "LOCAL_RANK" not in env or "TORCHELASTIC_RUN_ID" not in env:
        return False  # not a torchrun worker: the common case, and the cheapest test
    return env.get(ENV) == "emulated"


def devices_per_node(env=os.environ) -> int:
    for key in (PER_NODE_ENV, "LOCAL_WORLD_SIZE"):
        try:
            value = int(env.get(key, ""))
            if value > 0:
                return value
        except ValueError:
            pass
    return 1


def failure_timing(env=os.environ) -> str:
    return "gloo" if env.get(TIMING_ENV) == "gloo" else "nccl"


def mapped_backend(backend):
    """The process-group backend gloo stands in for: nccl -> gloo, "cpu:gloo,cuda:nccl" -> "gloo"."""
    if backend is None:
        return None
    text = str(backend).lower()
    if "nccl" not in text:
        return backend
    if ":" not in text:
        return "gloo"
    kept = [part for part in text.split(",") if "nccl" not in part]
    if all(part.partition(":")[2] == "gloo" for part in kept):
        return "gloo"  # every device type on gloo: the plain name, as get_backend() then says
    return ",".join(kept)


def unsupported(what: str, way_out: str = "run it on GPUs with --gpus") -> RuntimeError:
    return RuntimeError(f"{PREFIX}{what} cannot run on the CPU emulation; {way_out}")


def watchdog_lines(rank: int, seq: int, op_type: str, numel, timeout_ms: int, ran_ms: int) -> list[str]:
    """ProcessGroupNCCL's words when its watchdog times a collective out and takes the process down
    (WorkNCCL::checkTimeout, then the watchdog thread's exception; torch 2.13)."""
    sizes = f"NumelIn={numel}, NumelOut={numel}, " if numel is not None else ""
    work = f"WorkNCCL(SeqNum={seq}, OpType={op_type}, {sizes}Timeout(ms)={timeout_ms})"
    caught = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work} "
        f"ran for {ran_ms} milliseconds before timing out."
    )
    head = f"[rank{rank}]:[E ProcessGroupNCCL.cpp]"
    return [
        f"{head} {caught}",
        f"{head} [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
        "kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        f"{head} [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
        f"{head} [PG 0 Rank {rank}] Process group watchdog thread terminated with exception: {caught}",
    ]


def timed_out(error: BaseException) -> bool:
    """gloo's error for a collective that waited out its group's timeout."""
    return isinstance(error, RuntimeError) and any(words in str(error).lower() for words in GLOO_TIMED_OUT)


def peer_gone(error: BaseException) -> bool:
    """gloo's error for a collective whose peer is gone (it closed the connection, or never answered
    until the timeout)."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(words in text for words in (*PEER_GONE, *GLOO_TIMED_OUT))


class Emulator:
    """The state of one emulating worker: what it was asked to emulate, counted."""

    def __init__(self, write=None, env=os.environ):
        import time

        self._write = write  # (event, **fields) -> bool; None: a child process, which records nothing
        self.per_node = devices_per_node(env)
        self.timing = failure_timing(env)
        self.rank = _int(env.get("RANK"), 0)
        self._cells: dict[str, list[int]] = {}  # name -> [count]; `calls` reads them
        self._written: dict[str, int] = {}
        self._new_kind = False
        self._written_at = 0.0
        self._clock = time.monotonic
        self._sleep = time.sleep
        self._said: set[str] = set()
        self.device = _int(env.get("LOCAL_RANK"), 0) % self.per_node
        self.timeout_s: float | None = None  # the script's timeout= to init_process_group
        self.pg_ready = False  # an NCCL process group (emulated) is up: its collectives take NCCL's timing
        self.seq = 0  # collectives so far (SeqNum in the watchdog's words)
        self._inside: int | None = None  # the thread in a guarded call (its ident), None when none is
        self._peak = 0
        self._base_rss = _rss()
        self.aborting = False

    # --- records --------------------------------------------------------------------------

    def write(self, event: str, **fields) -> None:
        if self._write is not None and not self._write(event, **fields):
            self._write = None

    def announce(self) -> None:
        self.write("emulated", devices="emulated", per_node=self.per_node, failure_timing=self.timing)

    def count(self, name: str) -> None:
        self.counter(name)()

    def counter(self, name: str):
        """A bump for `name`, made once per wrapper: the hot path is one list item's increment; the
        clock is read only while a new kind of call waits to be written."""
        cell = self.cell(name)
        emulator = self

        def bump() -> None:
            cell[0] += 1
            if cell[0] == 1 or emulator._new_kind:
                emulator.noted(cell)

        return bump

    def cell(self, name: str) -> list[int]:
        """The count of `name`: a hot path bumps it inline, then calls `noted` when it was the first or a
        new kind waits to be written."""
        cell = self._cells.get(name)
        if cell is None:
            cell = self._cells[name] = [0]
        return cell

    def noted(self, cell: list[int]) -> None:
        if cell[0] == 1:
            self._new_kind = True
        if self._clock() - self._written_at >= CALLS_RECORD_GAP_S:
            self.flush()

    @property
    def calls(self) -> dict[str, int]:
        return {name: cell[0] for name, cell in self._cells.items() if cell[0]}

    def flush(self) -> None:
        calls = self.calls
        if calls != self._written:
            self._written, self._new_kind, self._written_at = calls, False, self._clock()
            self.write("emulated_calls", calls=dict(calls))

    def say_once(self, what: str, text: str) -> None:
        if what in self._said:
            return
        self._said.add(what)
        if self.rank == 0:
            import sys

            print(f"{PREFIX}{text}", file=sys.stderr, flush=True)

    # --- fake memory statistics -------------------------------------------------------------

    def allocated(self) -> int:
        value = max(0, _rss() - self._base_rss)
        self._peak = max(self._peak, value)
        return value

    def peak(self) -> int:
        return max(self._peak, self.allocated())

    def reset_peak(self) -> None:
        self._peak = 0

    # --- NCCL's failure timing ----------------------------------------------------------------

    def timeout(self) -> float:
        return self.timeout_s if self.timeout_s is not None else NCCL_DEFAULT_TIMEOUT_S

    def on_peer_gone(self, op_type: str, began: float, numel=None) -> None:
        """gloo failed a collective at once because its peer is gone: block as NCCL would until the
        process group's timeout, then take the process down as its watchdog does."""
        if self.timing != "nccl" or self.aborting:
            return
        self.aborting = True
        import sys

        # The process's own stderr: torch's excepthook (init_process_group's) swaps sys.stderr for a buffer
        # while ours runs, and the abort below would drop what went there.
        err = sys.__stderr__ or sys.stderr

        gone_after = self._clock() - began
        rest = self.timeout() - gone_after
        try:
            from elastic_sim_clock import wall_clock
        except ImportError:
            from time import time as wall_clock
        blocked_since = wall_clock() - gone_after
        if rest > 0:
            self._sleep(rest)
        ran_ms = int((self._clock() - began) * 1000)
        try:
            self.flush()
            self.write(
                "nccl_watchdog",
                op=op_type,
                seconds=round(self._clock() - began, 3),
                began=round(blocked_since, 3),
                timeout_s=self.timeout(),
            )
            print(
                f"{PREFIX}NCCL failure timing: gloo failed the {op_type} after {gone_after:.1f} s (its peer gone); "
                f"held it until the process group's timeout ({self.timeout():g} s), as NCCL would"
                if rest > 0
                else f"{PREFIX}NCCL failure timing: the {op_type} waited out the process group's timeout "
                f"({self.timeout():g} s) for a peer that never answered; aborted as NCCL's watchdog does",
                file=err,
            )
            for line in watchdog_lines(self.rank, self.seq, op_type, numel, int(self.timeout() * 1000), ran_ms):
                print(line, file=err)
            err.flush()
        finally:
            os.abort()

    def guarded(self, function, op_type: str, numel_of=None, collective=False):
        """`function`, whose gloo failure for a gone peer takes NCCL's timing. The hot path (every
        collective, every backward) is one thread-ident call and compare, a clock read and a counter: a
        threading.local's attribute cost ~3 us inside a training step, more than the rest together."""
        emulator, clock, ident = self, self._clock, threading.get_ident

        def call(*args, **kwargs):
            me = ident()
            if emulator._inside == me:  # nested in a guarded call of this thread: the outer one times it
                return function(*args, **kwargs)
            emulator._inside = me
            began = clock()
            emulator.seq += 1
            try:
                return function(*args, **kwargs)
            except Exception as error:
                if emulator.pg_ready and peer_gone(error):
                    numel = None
                    if numel_of is not None:
                        try:
                            numel = numel_of(args, kwargs)
                        except Exception:
                            pass
                    emulator.on_peer_gone(op_type, began, numel)
                elif collective and isinstance(error, RuntimeError) and "not supported" in str(error).lower():
                    raise unsupported(f"{op_type.lower()} on gloo ({error})") from error
                raise
            finally:
                emulator._inside = None

        return call


def _int(text, default):
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return 0


# --- the hooks, once torch is imported ------------------------------------------------------


def install(torch, emulator: Emulator) -> None:
    """Every patch, each on its own: one that fails (a torch without that API) leaves the others."""
    for patch in (
        _patch_cuda,
        _patch_accelerator,
        _patch_placement,
        _patch_load,
        _patch_pinning,
        _patch_precision,
        _patch_distributed,
        _patch_ddp,
        _patch_backward,
    ):
        try:
            patch(torch, emulator)
        except Exception:
            pass


def _wraps(original, wrapper):
    import functools

    wrapper = functools.wraps(original)(wrapper)
    wrapper.__elastic_sim_emulated__ = True
    return wrapper


def _device_mapper(torch):
    """cuda-ish -> "cpu" (a string, a torch.device, an index); anything else unchanged; and whether it changed."""
    device_type = torch.device
    cpu = torch.device("cpu")

    def mapped(value):
        kind = type(value)
        if kind is str:
            return ("cpu", True) if value.startswith("cuda") else (value, False)
        if kind is device_type:
            return (cpu, True) if value.type == "cuda" else (value, False)
        if kind is int:
            return cpu, True
        return value, False

    return mapped


def _patch_cuda(torch, emu: Emulator) -> None:
    import contextlib
    import time

    cuda = torch.cuda

    def counted(name, function):
        def call(*args, **kwargs):
            emu.count(f"torch.cuda.{name}")
            return function(*args, **kwargs)

        call.__name__ = name
        return call

    def set_device(device):
        index = device.index if isinstance(device, torch.device) else device
        if isinstance(index, str):
            index = torch.device(index).index
        emu.device = int(index or 0)

    class Properties:
        def __init__(self, index):
            self.name = FAKE_DEVICE_NAME
            self.total_memory = FAKE_TOTAL_MEMORY
            self.major, self.minor = 8, 0
            self.multi_processor_count = 108
            self.is_integrated, self.is_multi_gpu_board = False, False
            self.index = index

        def __repr__(self):
            return (
                f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})"
            )

    class Event:
        def __init__(self, enable_timing=False, blocking=False, interprocess=False, **_):
            self.enable_timing = enable_timing
            self._at = None

        def record(self, stream=None):
            emu.count("torch.cuda.Event")
            self._at = time.perf_counter()

        def synchronize(self):
            pass

        def wait(self, stream=None):
            pass

        def query(self):
            return True

        def elapsed_time(self, end):
            if self._at is None or end._at is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            return (end._at - self._at) * 1000.0

    class Stream:
        def __init__(self, device=None, priority=0, **_):
            emu.count("torch.cuda.Stream")
            self.device = torch.device("cuda", emu.device)
            self.priority = priority

        def synchronize(self):
            pass

        def wait_stream(self, stream):
            pass

        def wait_event(self, event):
            pass

        def query(self):
            return True

        def is_capturing(self):
            return False  # no CUDA graphs here: torch.accelerator.Graph is refused

        def record_event(self, event=None):
            event = event or Event()
            event.record(self)
            return event

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    default_stream = Stream.__new__(Stream)
    default_stream.device, default_stream.priority = torch.device("cuda", 0), 0

    class device_guard:  # torch.cuda.device(i) / device_of(tensor): a context that changes nothing here
        def __init__(self, device=None):
            self.idx = device if isinstance(device, int) else 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def memory_stats(device=None):
        allocated = emu.allocated()
        return {
            "allocated_bytes.all.current": allocated,
            "allocated_bytes.all.peak": emu.peak(),
            "reserved_bytes.all.current": _reserved(allocated),
        }

    def _reserved(allocated):
        return -(-int(allocated * 1.25) // 2**21) * 2**21  # rounded up to the caching allocator's 2 MiB blocks

    values = {
        "is_available": lambda: True,
        "device_count": lambda: emu.per_node,
        "current_device": lambda: emu.device,
        "set_device": set_device,
        "get_device_name": lambda device=None: FAKE_DEVICE_NAME,
        "get_device_properties": lambda device=None: Properties(device),
        "get_device_capability": lambda device=None: (8, 0),
        "is_bf16_supported": lambda *a, **k: True,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "ipc_collect": lambda: None,
        "manual_seed": lambda seed: None,  # the CPU generator is the one that draws: torch.manual_seed seeds it
        "manual_seed_all": lambda seed: None,
        "seed": lambda: None,
        "seed_all": lambda: None,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda state, device="cuda": None,
        "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(emu.per_node)],
        "set_rng_state_all": lambda states: None,
        "memory_allocated": lambda device=None: emu.allocated(),
        "max_memory_allocated": lambda device=None: emu.peak(),
        "memory_reserved": lambda device=None: _reserved(emu.allocated()),
        "max_memory_reserved": lambda device=None: _reserved(emu.peak()),
        "reset_peak_memory_stats": lambda device=None: emu.reset_peak(),
        "reset_max_memory_allocated": lambda device=None: emu.reset_peak(),
        "mem_get_info": lambda device=None: (FAKE_TOTAL_MEMORY - _reserved(emu.allocated()), FAKE_TOTAL_MEMORY),
        "memory_stats": memory_stats,
        "memory_summary": lambda device=None, abbreviated=False: f"(elastic-sim: fake) {memory_stats()}",
        "Stream": Stream,
        "Event": Event,
        "stream": lambda stream=None: contextlib.nullcontext(stream),
        "current_stream": lambda device=None: default_stream,
        "default_stream": lambda device=None: default_stream,
        "set_stream": lambda stream: None,
        "device": device_guard,
        "device_of": device_guard,
    }
    silent = ("is_available", "device_count", "current_device", "initial_seed", "is_initialized", "init")
    values["CUDAGraph"] = values["graph"] = refused("CUDA graphs (torch.cuda.CUDAGraph, torch.cuda.graph)")
    for name, value in values.items():
        if name in ("Stream", "Event", "device", "device_of", "CUDAGraph", "graph") or name in silent:
            setattr(cuda, name, value)
        else:
            setattr(cuda, name, counted(name, value))
    nvtx = getattr(cuda, "nvtx", None)
    if nvtx is not None:
        nvtx.range_push = counted("nvtx", lambda msg: 0)
        nvtx.range_pop = counted("nvtx", lambda: 0)
        nvtx.mark = counted("nvtx", lambda msg: None)
        nvtx.range = lambda msg, *a, **k: (emu.count("torch.cuda.nvtx"), contextlib.nullcontext())[1]
    # The storages a map_location callable puts on "the GPU" (storage.cuda(rank)) stay where they are.
    for storage in (getattr(torch, "UntypedStorage", None), getattr(torch.storage, "TypedStorage", None)):
        if storage is not None:
            storage.cuda = _wraps(storage.cuda, lambda self, *a, **k: (emu.count("storage.cuda"), self)[1])


def refused(what: str):
    """A call the emulation cannot run: it fails at once, by name, with the way out."""

    def refuse(*args, **kwargs):
        raise unsupported(what)

    return refuse


def _patch_accelerator(torch, emu: Emulator) -> None:
    """torch.accelerator (the device-generic API of torch >= 2.6) answers as torch.cuda does: one of
    per_node "cuda" devices, the same current index, the same fake memory figures. torch's own modules
    still get the CPU's answers: they run on the CPU here, and some ask on every optimizer step (Adam's
    graph-capture check) or would then take a CUDA path (object collectives, mesh splits, DataLoader
    pinning)."""
    import collections
    import sys

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return
    getframe = sys._getframe
    cuda = torch.cuda

    def from_torch() -> bool:
        name = getframe(2).f_globals.get("__name__", "")
        return name == "torch" or name.startswith("torch.")

    def index_of(device) -> int:
        if isinstance(device, str):
            device = torch.device(device if ":" in device or not device.isdigit() else int(device))
        if isinstance(device, torch.device):
            return emu.device if device.index is None else device.index
        return emu.device if device is None else int(device)

    def set_index(device) -> None:
        emu.device = index_of(device)

    class device_index:  # with torch.accelerator.device_index(i): the current index for the block
        def __init__(self, device, /):
            self.idx, self.prev_idx = device, -1

        def __enter__(self):
            if self.idx is not None:
                self.prev_idx, emu.device = emu.device, index_of(self.idx)

        def __exit__(self, *exc):
            if self.idx is not None:
                emu.device = self.prev_idx
            return False

    def memory_stats(device=None, /):
        stats = cuda.memory_stats()
        return collections.OrderedDict(sorted(stats.items()))

    values = {
        "is_available": lambda: True,
        "device_count": lambda: emu.per_node,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: emu.device,
        "current_device_idx": lambda: emu.device,
        "set_device_index": set_index,
        "set_device_idx": set_index,
        "device_index": device_index,
        "synchronize": lambda device=None, /: None,
        "current_stream": lambda device=None, /: cuda.current_stream(),
        "set_stream": lambda stream: None,
        "get_device_capability": lambda device=None, /: {
            "supported_dtypes": {
                torch.float32,
                torch.float16,
                torch.bfloat16,
                torch.float64,
                torch.int64,
                torch.int32,
                torch.int8,
                torch.uint8,
                torch.bool,
            }  # fmt: skip
        },
        "empty_cache": lambda: None,
        "empty_host_cache": lambda: None,
        "memory_stats": memory_stats,
        "memory_allocated": lambda device=None, /: emu.allocated(),
        "max_memory_allocated": lambda device=None, /: emu.peak(),
        "memory_reserved": lambda device=None, /: cuda.memory_reserved(),
        "max_memory_reserved": lambda device=None, /: cuda.max_memory_reserved(),
        "reset_accumulated_memory_stats": lambda device=None, /: None,
        "reset_peak_memory_stats": lambda device=None, /: emu.reset_peak(),
        "get_memory_info": lambda device=None, /: cuda.mem_get_info(),
    }
    # torch's own modules get a CPU-only machine's answers, said outright: on the CPU build they are torch's
    # own, but a CUDA build of torch (a requirement's compiled parts bring one in) would answer from the
    # emulated torch.cuda and then reach for a driver that is not there (Adam's graph-capture check).
    for_torch = {
        "is_available": lambda: False,
        "device_count": lambda: 0,
        "current_accelerator": lambda check_available=False: None,
    }
    memory = getattr(accelerator, "memory", None)
    for name, value in values.items():
        original = getattr(accelerator, name, None)
        if original is None:
            continue  # an older torch without it: the script's call fails as it would there
        replaced = _for_scripts(
            original, value, from_torch, emu.counter(f"torch.accelerator.{name}"), internal=for_torch.get(name)
        )
        setattr(accelerator, name, replaced)
        if memory is not None and getattr(memory, name, None) is original:
            setattr(memory, name, replaced)
    if hasattr(accelerator, "Graph"):
        accelerator.Graph = refused("CUDA graphs (torch.accelerator.Graph)")

    import torch.distributed as dist

    if dist.is_available() and hasattr(dist, "get_default_backend_for_device"):
        default_backend = dist.get_default_backend_for_device
        bump = emu.counter("get_default_backend_for_device(cuda)")

        def backend_for(device):
            if str(getattr(device, "type", device)).startswith("cuda"):
                bump()
                return "nccl"  # as on GPUs; init_process_group then makes it gloo
            return default_backend(device)

        dist.get_default_backend_for_device = _wraps(default_backend, backend_for)
        dist.distributed_c10d.get_default_backend_for_device = dist.get_default_backend_for_device


def _for_scripts(original, emulated, from_torch, bump, internal=None):
    """`emulated` for the script's calls (counted), `internal` (default: `original`) for torch's own."""
    for_torch = original if internal is None else internal

    def call(*args, **kwargs):
        if from_torch():
            return for_torch(*args, **kwargs)
        bump()
        return emulated(*args, **kwargs)

    if isinstance(original, type):  # device_index: a function now, which functools.wraps cannot dress as a class
        call.__name__, call.__qualname__, call.__doc__ = original.__name__, original.__qualname__, original.__doc__
        call.__elastic_sim_emulated__ = True
        return call
    return _wraps(original, call)


def _patch_placement(torch, emu: Emulator) -> None:
    # The hot path: a batch's .to(device) every step. Its common arguments (a str, a torch.device, an
    # index, a dtype) are told apart by their exact type inline, with no call, tuple or dict built
    # unless a cuda device is really replaced.
    device_type = torch.device
    cpu = torch.device("cpu")

    mapped = _device_mapper(torch)

    def placing(original, name, bound):
        bump = emu.counter(name)
        if bound == 1:
            return _wraps(original, placing_method(original, emu.cell(name), bump))

        def call(*args, **kwargs):
            if len(args) > bound:
                device, changed = mapped(args[bound])
                if changed:
                    bump()
                    args = (*args[:bound], device, *args[bound + 1 :])
            if kwargs and "device" in kwargs:  # rare: the membership test is all a call without it pays
                kwargs["device"], changed = mapped(kwargs["device"])
                if changed:
                    bump()
            return original(*args, **kwargs)

        return _wraps(original, call)

    def placing_method(original, cell, bump):
        """`placing` for a method (x.to(device)): the device the first argument after self, the count
        bumped inline; one frame, as few steps as the common case allows."""

        def call(self, *args, **kwargs):
            if args:
                first = args[0]
                kind = type(first)
                if (
                    (kind is str and first.startswith("cuda"))
                    or (kind is device_type and first.type == "cuda")
                    or kind is int
                ):
                    cell[0] += 1
                    if cell[0] == 1 or emu._new_kind:
                        emu.noted(cell)
                    args = ("cpu" if kind is str else cpu, *args[1:])
            if kwargs and "device" in kwargs:  # rare: the membership test is all a call without it pays
                kwargs["device"], changed = mapped(kwargs["device"])
                if changed:
                    bump()
            return original(self, *args, **kwargs)

        return call

    tensor, module = torch.Tensor, torch.nn.Module
    tensor.to = placing(tensor.to, "Tensor.to(cuda)", 1)
    module.to = placing(module.to, "Module.to(cuda)", 1)
    module.to_empty = placing(module.to_empty, "Module.to_empty(cuda)", 1)
    tensor_cuda, module_cuda = emu.counter("Tensor.cuda()"), emu.counter("Module.cuda()")
    tensor.cuda = _wraps(tensor.cuda, lambda self, *a, **k: (tensor_cuda(), self)[1])
    module.cuda = _wraps(module.cuda, lambda self, *a, **k: (module_cuda(), self)[1])
    for name in TENSOR_FACTORIES:
        original = getattr(tensor, name, None)
        if original is not None:
            setattr(tensor, name, _kwarg_device(original, torch, emu.counter(f"Tensor.{name}(device=cuda)")))
    factory = emu.counter("factory(device=cuda)")
    for name in FACTORIES:
        original = getattr(torch, name, None)
        if original is not None:
            setattr(torch, name, _kwarg_device(original, torch, factory))
    torch.set_default_device = placing(torch.set_default_device, "set_default_device(cuda)", 0)
    from torch.utils import _device

    context = _device.DeviceContext
    context.__init__ = placing(context.__init__, "with torch.device(cuda)", 1)


def _kwarg_device(original, torch, bump):
    """A factory whose device= may name cuda: a dict membership test when it does not."""
    mapped = _device_mapper(torch)

    def call(*args, **kwargs):
        if kwargs and "device" in kwargs:
            kwargs["device"], changed = mapped(kwargs["device"])
            if changed:
                bump()
                try:
                    return original(*args, **kwargs)
                except RuntimeError as error:
                    oom = out_of_memory(torch, error)
                    if oom is None:
                        raise
                    raise oom from error
        return original(*args, **kwargs)

    return _wraps(original, call)


CPU_ALLOCATOR_FULL = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")


def out_of_memory(torch, error: RuntimeError):
    """The CPU allocator's refusal of a tensor asked for on "the GPU", as the CUDA caching allocator says
    it (torch.OutOfMemoryError, which scripts catch to shrink a batch); None for any other error."""
    found = CPU_ALLOCATOR_FULL.search(str(error))
    if found is None:
        return None
    wanted = int(found[1]) / 2**30
    return torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {wanted:.2f} GiB. (Emulated on CPU: the node's memory refused it; "
        "the emulated GPU's memory is the node's.)"
    )


def _patch_load(torch, emu: Emulator) -> None:
    mapped = _device_mapper(torch)
    original = torch.load

    def load(*args, **kwargs):
        where = kwargs.get("map_location")
        if where is None:
            kwargs["map_location"] = "cpu"  # a checkpoint saved on real GPUs names cuda:i
        elif isinstance(where, dict):
            kwargs["map_location"] = {k: mapped(v)[0] for k, v in where.items()}
            emu.count("torch.load(map_location=cuda)")
        elif not callable(where):
            kwargs["map_location"], changed = mapped(where)
            if changed:
                emu.count("torch.load(map_location=cuda)")
        else:
            emu.count("torch.load(map_location=callable)")
        return original(*args, **kwargs)

    torch.load = _wraps(original, load)


def _patch_pinning(torch, emu: Emulator) -> None:
    torch.Tensor.pin_memory = _wraps(
        torch.Tensor.pin_memory, lambda self, *a, **k: (emu.count("Tensor.pin_memory()"), self)[1]
    )
    from torch.utils.data import DataLoader

    init = DataLoader.__init__

    def dataloader_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if getattr(self, "pin_memory", False):
            emu.count("DataLoader(pin_memory=True)")
            self.pin_memory = False

    DataLoader.__init__ = _wraps(init, dataloader_init)


def _patch_precision(torch, emu: Emulator) -> None:
    # CPU autocast runs float16 (and bfloat16) in torch 2.13, and GradScaler("cpu") scales, unscales and
    # skips the steps whose gradients overflowed: the script's mixed precision really runs, on CPU kernels.
    said = "autocast and GradScaler for cuda run on the CPU's autocast, in the dtype asked (CUDA's float16 by default)"
    base_autocast = torch.amp.autocast_mode.autocast

    class autocast(base_autocast):
        def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
            if str(device_type).startswith("cuda"):
                emu.count("autocast(cuda)")
                emu.say_once("amp", said)
                device_type, dtype = "cpu", dtype or torch.float16  # CUDA's default; the CPU's is bfloat16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class cuda_autocast(autocast):
        def __init__(self, enabled=True, dtype=None, cache_enabled=True):
            super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    base_scaler = torch.amp.GradScaler

    class GradScaler(base_scaler):
        def __init__(self, device="cuda", *args, **kwargs):
            if str(device).startswith("cuda"):
                emu.count("GradScaler(cuda)")
                emu.say_once("amp", said)
                device = "cpu"
            super().__init__(device, *args, **kwargs)

    class CudaGradScaler(GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__("cuda", *args, **kwargs)

    torch.autocast = torch.amp.autocast = autocast
    if hasattr(torch, "GradScaler"):
        torch.GradScaler = GradScaler
    torch.amp.GradScaler = GradScaler
    from torch.cuda import amp

    amp.autocast, amp.GradScaler = cuda_autocast, CudaGradScaler


def _patch_distributed(torch, emu: Emulator) -> None:
    import sys

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_available():
        return
    init = c10d.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        # NCCL's timing for a group the script meant for NCCL: named, or torch's default (nccl for CUDA
        # tensors on a GPU machine). A script that asks for gloo keeps gloo's timing, as it would on GPUs.
        nccl = backend is None or mapped_backend(backend) != backend
        if mapped_backend(backend) != backend:
            emu.count("init_process_group(nccl)")
            backend = mapped_backend(backend)
        if kwargs.get("device_id") is not None:
            emu.count("init_process_group(device_id=)")
            _check_device_id(torch, kwargs["device_id"], emu.per_node)
            kwargs["device_id"] = None  # a group bound to no device: gloo's
        timeout = kwargs.get("timeout", args[1] if len(args) > 1 else None)
        result = init(backend, *args, **kwargs)
        emu.timeout_s = timeout.total_seconds() if timeout is not None else None
        emu.pg_ready = nccl
        # The timing in force, which the report states: a script that asked for gloo has gloo's.
        emu.write("emulated_group", failure_timing=emu.timing if nccl else "gloo")
        return result

    new = c10d.new_group

    def new_group(*args, **kwargs):
        if kwargs.get("group_desc") == "mesh_default" and emu.pg_ready and c10d.is_initialized():
            # A 1-D mesh over the whole world asks for a group of its own only when torch sees CUDA with a
            # gloo default group (device_mesh's _init_one_process_group); on GPUs, with the NCCL default
            # group the script made, it reuses that group and its timeout. A new gloo group here would hold
            # every FSDP2/DTensor collective to gloo's 30-minute default instead of the script's timeout=.
            emu.count("init_device_mesh(default group)")
            return c10d._get_default_group()
        if len(args) > 2:
            backend = mapped_backend(args[2])
            if backend != args[2]:
                emu.count("new_group(backend=nccl)")
            args = (*args[:2], backend, *args[3:])
        if mapped_backend(kwargs.get("backend")) != kwargs.get("backend"):
            emu.count("new_group(backend=nccl)")
            kwargs["backend"] = mapped_backend(kwargs["backend"])
        if kwargs.get("device_id") is not None:
            kwargs["device_id"] = None
        return new(*args, **kwargs)

    barrier = c10d.barrier

    def barrier_without_devices(*args, **kwargs):
        if kwargs.get("device_ids") is not None or len(args) > 2:
            emu.count("barrier(device_ids=)")
            kwargs.pop("device_ids", None)
            args = args[:2]
        return barrier(*args, **kwargs)

    replaced = {
        "init_process_group": _wraps(init, init_process_group),
        "new_group": _wraps(new, new_group),
        "barrier": _wraps(barrier, barrier_without_devices),
        "is_nccl_available": lambda: True,
    }
    from elastic_sim_instrument import COLLECTIVES

    for op in COLLECTIVES:
        original = replaced.get(op, getattr(c10d, op, None))
        if callable(original):
            replaced[op] = _wraps(original, emu.guarded(original, OP_TYPES.get(op, op.upper()), _numel, True))
    for name, value in replaced.items():
        original = getattr(c10d, name, None)
        setattr(c10d, name, value)
        for holder in ("torch.distributed", "torch.distributed.device_mesh"):
            module = sys.modules.get(holder)
            if module is not None and (getattr(module, name, None) is original or holder == "torch.distributed"):
                if hasattr(module, name):
                    setattr(module, name, value)

    def mesh_hooks(device_mesh):
        make = device_mesh.init_device_mesh

        def init_device_mesh(device_type, *args, **kwargs):
            if str(device_type).startswith("cuda"):
                emu.count("init_device_mesh(cuda)")
                device_type = "cpu"
            return make(device_type, *args, **kwargs)

        device_mesh.init_device_mesh = _wraps(make, init_device_mesh)
        if getattr(device_mesh, "init_process_group", None) is init:
            device_mesh.init_process_group = replaced["init_process_group"]
        mesh = device_mesh.DeviceMesh
        mesh_init = mesh.__init__

        def device_mesh_init(self, device_type, *args, **kwargs):
            if str(device_type).startswith("cuda"):
                emu.count("DeviceMesh(cuda)")
                device_type = "cpu"
            return mesh_init(self, device_type, *args, **kwargs)

        mesh.__init__ = _wraps(mesh_init, device_mesh_init)

    from elastic_sim_instrument import AfterImport

    AfterImport({"torch.distributed.device_mesh": mesh_hooks}, on_error=lambda: None).install()


def _check_device_id(torch, device_id, count: int) -> None:
    """torch's own checks of init_process_group's device_id, against the emulated device count (torch 2.13's
    words): a script whose device_id is wrong on GPUs fails here too."""
    if isinstance(device_id, int):
        device_id = torch.device("cuda", device_id)
    if not isinstance(device_id, torch.device) or device_id.type != "cuda":
        return
    if device_id.index is None:
        raise ValueError("Please use a device_id with index.")
    if device_id.index >= count:
        raise ValueError(
            f"device_id {device_id} is out of range. Please use a device index less than "
            f"the number of accelerators available: {count}."
        )


def _numel(args, kwargs):
    tensor = kwargs.get("tensor", args[0] if args else None)
    return tensor.numel() if hasattr(tensor, "numel") else None


def _patch_ddp(torch, emu: Emulator) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__

    def ddp_init(self, module, *args, **kwargs):
        if len(args) >= 1 and args[0] is not None or kwargs.get("device_ids") is not None:
            emu.count("DDP(device_ids=)")
        args = tuple(None if i < 2 else a for i, a in enumerate(args))  # device_ids, output_device
        kwargs.pop("device_ids", None)
        kwargs.pop("output_device", None)
        return init(self, module, *args, **kwargs)

    DDP.__init__ = _wraps(init, ddp_init)
    # DDP's forward runs no collective but its buffers' broadcast (its all_reduces go through
    # torch.distributed, guarded there): guarding that one method, not the forward, keeps every step
    # of a model without buffers free of a wrapper.
    broadcast = DDP._distributed_broadcast_coalesced
    DDP._distributed_broadcast_coalesced = _wraps(broadcast, emu.guarded(broadcast, "BROADCAST"))


def _patch_backward(torch, emu: Emulator) -> None:
    """DDP's gradient all-reduce runs in C++ during backward: gloo's failure surfaces there.
    Tensor.backward calls torch.autograd.backward by name, so the one guard covers both."""
    torch.autograd.backward = _wraps(torch.autograd.backward, emu.guarded(torch.autograd.backward, "ALLREDUCE"))


def _patch_extensions(extension, emu: Emulator) -> None:
    """torch.utils.cpp_extension: a CUDA extension cannot build or run here."""

    def refusing(name):
        def refuse(*args, **kwargs):
            raise unsupported(f"a custom CUDA extension (torch.utils.cpp_extension.{name})")

        return refuse

    extension.CUDAExtension = refusing("CUDAExtension")
    for name in ("load", "load_inline"):
        original = getattr(extension, name)

        def guarded(*args, _original=original, _name=name, **kwargs):
            sources = [str(s) for s in (kwargs.get("sources") or (args[1] if len(args) > 1 else []) or [])]
            if kwargs.get("with_cuda") or kwargs.get("cuda_sources") or any(s.endswith(".cu") for s in sources):
                raise unsupported(f"a custom CUDA extension (torch.utils.cpp_extension.{_name} with CUDA sources)")
            return _original(*args, **kwargs)

        setattr(extension, name, _wraps(original, guarded))


def _excepthook(emu: Emulator, sys) -> None:
    """The last word on an uncaught error: a gone peer takes NCCL's timing; a CUDA-only package is named."""
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        try:
            if emu.pg_ready and peer_gone(value):
                # An async collective's error (FSDP2's, a work.wait()) comes here, its start unknown: gloo's own
                # timeout already waited the group's timeout, as NCCL's watchdog would; a closed peer, the whole.
                waited = emu.timeout() if timed_out(value) else 0.0
                emu.on_peer_gone("ALLREDUCE", emu._clock() - waited)
            name = getattr(value, "name", None) if isinstance(value, ImportError) else None
            if name and name.split(".")[0] in CUDA_ONLY_PACKAGES:
                print(
                    f"{PREFIX}{name.split('.')[0]} (CUDA kernels) cannot run on the CPU emulation; "
                    "run it on GPUs with --gpus, or take the script's CPU path without it",
                    file=sys.stderr,
                )
            emu.flush()
        except Exception:
            pass
        previous(kind, value, traceback)

    sys.excepthook = excepthook


def activate():
    """Emulate CUDA in this worker; returns the emulator (None when off)."""
    import atexit
    import sys

    from elastic_sim_instrument import AfterImport

    owner = os.environ.get(OWNER_ENV)
    write = None
    if owner is None or owner == str(os.getpid()):
        os.environ[OWNER_ENV] = str(os.getpid())
        if os.environ.get("SIM_EVENTS_DIR"):
            import elastic_sim_progress

            write = elastic_sim_progress.write_record
    emu = Emulator(write)
    os.register_at_fork(after_in_child=lambda: setattr(emu, "_write", None))

    def after_torch(torch):
        emu._base_rss = _rss()  # the fake "allocated" memory: what the process grew by after torch's import
        emu.announce()
        install(torch, emu)

    AfterImport(
        {
            "torch": after_torch,
            "torch.utils.cpp_extension": lambda extension: _patch_extensions(extension, emu),
        },
        on_error=lambda: None,
    ).install()
    _excepthook(emu, sys)
    atexit.register(emu.flush)
    return emu


if should_emulate():
    try:
        activate()
    except Exception:
        pass  # never break the user's script
