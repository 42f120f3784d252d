"""Progress of any torchrun script with no change to it: optimizer steps and collective calls.

Imported by elastic-sim.pth at start-up of every Python process in a node, so outside a torchrun
worker it only reads the environment and returns (no torch import, nothing installed). In a
worker (LOCAL_RANK and TORCHELASTIC_RUN_ID set, SIM_INSTRUMENT not "0", a side channel in
SIM_EVENTS_DIR) it writes a "start" record at once and waits, through an import hook, for the
script to import torch:
  - torch: an "imported" record when `import torch` has finished (spawn and import, timed),
    torch.load is wrapped to write "load" records (checkpoint loads before the first step, with the
    last file loaded), and torch.save a "save" record per save to a named file (its path, when it
    began and how long it took, the step then): a checkpoint written by a worker of any round; a
    saved file that the worker then renames (os.replace, os.rename: an atomic write) gets a "save"
    record under its final name too;
  - torch.optim.optimizer: a global optimizer step post hook writes "step" records;
  - torch.distributed: its Python collectives are wrapped to write "activity" records, and
    init_process_group a "pg_ready" record when it returns;
  - torch.distributed.checkpoint: its load and load_state_dict write "load" records too, and its
    save and save_state_dict "save" records;
and, for the job's pitfalls (sim/verdict/pitfalls.py), cheaply:
  - a "uses" record the first time an LR scheduler or an AMP GradScaler is constructed;
  - a "sampler" record (its epoch) at a DistributedSampler's 1st, 2nd, 4th, 8th... iteration and
    whenever its epoch changed: set_epoch never called shows as one epoch over many iterations;
  - a "params" record after the process's first optimizer step: a fingerprint of the stepped
    parameters (one float64 sum per tensor, one device sync), equal on every replica in step;
and at exit it writes "exit". Records go to the side channel (elastic_sim_progress.write_record),
never to the script's stdout or stderr. Any failure in here turns the instrumentation off
silently: the user's script must behave exactly as without it.
"""

import os

# Set in an instrumented worker, inherited by anything it starts (DataLoader workers, compile
# pools, subprocesses): those are not the worker, and must not count as one.
OWNER_ENV = "SIM_INSTRUMENTED_PID"
# A step record at most this often per process (the first at once, the last at exit): a fast loop
# must not flood the history, and a record's write (a syscall, ~0.1-0.5 ms all told on a busy
# machine) is most of the instrumentation's cost. Slower steps are each recorded.
STEP_RECORD_GAP_S = 0.5
ACTIVITY_RECORD_GAP_S = 1.0
# elastic-sim's hang-collectives fault: while this file exists, the worker waits before its next
# collective call, or at the end of its optimizer step, and its process runs on (a hang inside the
# script, which a SIGSTOP is not).
# Looked for at most every HANG_CHECK_GAP_S, so a fast loop pays for one stat a fifth of a second.
HANG_FILE = "/tmp/elastic-sim-hang-{pid}"
HANG_CHECK_GAP_S = 0.2
# Checkpoint loads (torch.load, torch.distributed.checkpoint's load) are timed until the process's
# first optimizer step: each "load" record carries the seconds spent in them so far, at most one
# record per gap (a script reading many shards; also before a collective), the rest written before
# "pg_ready", the first step and exit, so the total at each of those is exact.
LOAD_RECORD_GAP_S = 0.5
CHECKPOINT_LOADS = ("load", "load_state_dict")  # torch.distributed.checkpoint's
CHECKPOINT_SAVES = ("save", "save_state_dict")  # torch.distributed.checkpoint's (async_save returns early)
SHARDED_PARAMS = ("DTensor", "FlatParameter")  # a rank's shard: not a replica to fingerprint
# Modules that hold init_process_group under its own name (device_mesh imported it by name).
PG_INIT_HOLDERS = ("torch.distributed", "torch.distributed.distributed_c10d", "torch.distributed.device_mesh")
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "_all_gather_base",
    "_reduce_scatter_base",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
)


def should_instrument(env=os.environ, pid=None) -> bool:
    if "LOCAL_RANK" not in env or "TORCHELASTIC_RUN_ID" not in env:
        return False  # the common case, and the cheapest test: not a torchrun worker
    if env.get("SIM_INSTRUMENT", "1") == "0" or not env.get("SIM_EVENTS_DIR"):
        return False
    owner = env.get(OWNER_ENV)
    return owner is None or owner == str(os.getpid() if pid is None else pid)


class WorkerProbe:
    """The state and hooks of one instrumented worker process."""

    def __init__(self, write):
        import threading
        import time
        import weakref

        self._write = write  # (event, **fields) -> bool
        self._clock = time.monotonic
        self._weakref = weakref.ref
        self._in_collective = threading.local()
        self.pid = os.getpid()
        self.off = False
        self._step_handle = None
        self._optimizer = None  # weakref to the one optimizer counted
        self._steps = 0
        self._steps_written = 0
        self._step_written_at = 0.0
        self._step_offset = None  # absolute step - n, for a step counter the CPU cannot read cheaply
        self._last_step = None  # (n, absolute step) of the last step record that had one
        self._collectives = 0
        self._collectives_written = 0
        self._activity_written_at = 0.0
        self._last_op = None
        self._hang_file = HANG_FILE.format(pid=self.pid)
        # A hang file at start is an older process's that had this pid: the fault holds a worker it saw
        # running, and a restarted container's fresh pid namespace reuses the pids (its /tmp outlives it).
        try:
            os.unlink(self._hang_file)
        except OSError:
            pass
        self._hang_checked_at = 0.0
        self._sleep = time.sleep
        self._in_load = threading.local()
        self._load_s = 0.0  # seconds spent in checkpoint loads so far (before the first step)
        self._loads = 0
        self._loads_written = 0
        self._load_written_at = 0.0
        self._load_op = None
        self._load_path = None  # the last file a checkpoint load read
        self._in_save = threading.local()
        self._saved = None  # (path, began, step, n) of the last file saved: an atomic write renames it
        self._described = False  # the first torch.save's object was described (saved_content)
        try:  # in a node: the kernel's clock, not a clock the skew-clock fault has moved
            from elastic_sim_clock import wall_clock
        except ImportError:
            wall_clock = time.time
        self._wall = wall_clock
        self.exit_code = None
        self._in_state_init = False  # inside DCP's optimizer state init (not a training step)
        self._uses = set()  # "lr_scheduler", "grad_scaler": recorded once each
        self._samplers = {}  # id(sampler) -> [number, iterations, epoch last recorded]

    def write(self, event, **fields) -> None:
        if not self.off and not self._write(event, **fields):
            self.disable()

    def disable(self) -> None:
        self.off = True
        handle, self._step_handle = self._step_handle, None
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass

    # --- optimizer steps -------------------------------------------------------------------

    def install_step_hook(self, optimizer_module) -> None:
        self._step_handle = optimizer_module.register_optimizer_step_post_hook(self.on_step)

    def wrap_state_init(self, state_dict_module) -> None:
        """torch.distributed.checkpoint's get_state_dict creates a fresh optimizer's state with one
        step of zero gradients at learning rate 0 (_init_optim_state, before a DCP resume): not a
        training step, so not counted."""
        init = getattr(state_dict_module, "_init_optim_state", None)
        if init is None:
            return
        probe = self

        def init_uncounted(*args, **kwargs):
            probe._in_state_init = True
            try:
                return init(*args, **kwargs)
            finally:
                probe._in_state_init = False

        state_dict_module._init_optim_state = init_uncounted

    def on_step(self, optimizer, args, kwargs) -> None:
        if self.off or self._in_state_init:
            return
        try:
            counted = self._optimizer() if self._optimizer is not None else None
            if counted is not optimizer:
                if counted is not None:
                    return  # a second optimizer of the same loop: each step counts once
                self._optimizer, self._step_offset = self._weakref(optimizer), None
            self._steps += 1
            now = self._clock()
            if self._steps == 1:
                self.flush_loads()
            if self._steps == 1 or now - self._step_written_at >= STEP_RECORD_GAP_S:
                self._write_step(optimizer, now)
            if self._steps == 1:
                self.write_params(optimizer)
        except Exception:
            self.disable()
            return
        # DDP's gradient all-reduce runs in C++, past the Python wrappers: a hung worker of a DDP
        # script is held at its step's end instead, before the next backward's collectives.
        self.hold_while_hung()

    # torch.compile must not trace the hook into a compiled optimizer step (the tracer does not
    # know its clock and would warn on the script's stderr): the mark torch._dynamo.disable puts
    # on what it wraps, without the wrapper's cost on every eager step.
    on_step._torchdynamo_disable = True

    def _write_step(self, optimizer, now: float) -> None:
        self._step_written_at, self._steps_written = now, self._steps
        step = self._absolute_step(optimizer)
        if step is not None:
            self._last_step = (self._steps, step)
        self.write("step", n=self._steps, step=step)

    def _step_at_exit(self, optimizer):
        """The absolute step at exit: the optimizer's, or (a script's optimizer is gone by atexit) counted on
        from the last one read, so that an exit's step record does not turn the steps into per-process counts."""
        step = self._absolute_step(optimizer)
        if step is None and self._last_step is not None:
            n, last = self._last_step
            step = last + self._steps - n
        return step

    def _absolute_step(self, optimizer):
        """The step the optimizer's state holds (Adam's state[p]["step"]: it survives a restore from
        a checkpoint), or None when it keeps none (SGD)."""
        if self._step_offset is not None:
            return self._steps + self._step_offset
        if optimizer is None:
            return None
        for group in optimizer.param_groups:
            for param in group["params"]:
                state = optimizer.state.get(param)
                if not state:
                    continue
                value = state.get("step")
                if value is None:
                    return None
                if isinstance(value, (int, float)):
                    return int(value)
                step = int(value.item())
                if value.device.type != "cpu":
                    # .item() on an accelerator waits for it: read once, then count on from there.
                    self._step_offset = step - self._steps
                return step
        return None

    # --- the job's pitfalls: schedulers and scalers used, sampler epochs, replica fingerprints ---

    def write_params(self, optimizer) -> None:
        """A fingerprint of the parameters the optimizer steps, after the first step: ranks of one group
        whose replicas are in step hold the same (DDP's gradients are all-reduced). Sharded parameters
        (DTensor, FSDP's flat ones) differ by design: not fingerprinted."""
        try:
            import torch

            params = [p for group in optimizer.param_groups for p in group["params"]]
            if not params or not all(isinstance(p, torch.Tensor) for p in params):
                return
            if any(type(p).__name__ in SHARDED_PARAMS or type(p.data).__name__ in SHARDED_PARAMS for p in params):
                return
            with torch.no_grad():  # one sum per tensor, one sync: a few ms even for a large model
                total = torch.stack([p.detach().sum(dtype=torch.float64) for p in params]).sum().item()
            numel = sum(p.numel() for p in params)
        except Exception:
            return  # parameters it cannot read (across devices, meta): no fingerprint, the rest stays on
        self.write("params", fingerprint=f"{total:.17g}", tensors=len(params), numel=numel)

    def wrap_uses(self, cls, what) -> None:
        """cls.__init__ (a subclass's too, through super().__init__) writes a "uses" record, once."""
        original = getattr(cls, "__init__", None)
        if cls is None or original is None or hasattr(original, "__elastic_sim_op__"):
            return
        import functools

        probe = self

        def init(obj, *args, **kwargs):
            original(obj, *args, **kwargs)
            if what not in probe._uses and not probe.off:
                probe._uses.add(what)
                probe.write("uses", what=what, cls=type(obj).__name__)

        wrapper = functools.wraps(original)(init)
        wrapper.__elastic_sim_op__ = what
        cls.__init__ = wrapper

    def wrap_sampler(self, module) -> None:
        cls = getattr(module, "DistributedSampler", None)
        original = getattr(cls, "__iter__", None)
        if original is None or hasattr(original, "__elastic_sim_op__"):
            return
        import functools

        probe = self

        def iterate(sampler):
            if not probe.off:
                probe.on_sampler_iter(sampler)
            return original(sampler)

        wrapper = functools.wraps(original)(iterate)
        wrapper.__elastic_sim_op__ = "sampler"
        cls.__iter__ = wrapper

    def on_sampler_iter(self, sampler) -> None:
        try:
            seen = self._samplers.get(id(sampler))
            if seen is None:
                seen = self._samplers[id(sampler)] = [len(self._samplers), 0, None]
            seen[1] += 1
            epoch, iterations = getattr(sampler, "epoch", None), seen[1]
            if epoch != seen[2] or iterations & (iterations - 1) == 0:  # changed, or a power of two
                seen[2] = epoch
                self.write(
                    "sampler",
                    sampler=seen[0],
                    epoch=epoch,
                    iterations=iterations,
                    shuffle=bool(getattr(sampler, "shuffle", False)),
                )
        except Exception:
            self.disable()

    # --- collectives -----------------------------------------------------------------------

    def wrap_collectives(self, dist, c10d) -> None:
        import functools

        for op in COLLECTIVES:
            original = getattr(c10d, op, None)
            if not callable(original) or hasattr(original, "__elastic_sim_op__"):
                continue
            wrapper = functools.wraps(original)(self._counting(original, op))
            wrapper.__elastic_sim_op__ = op
            setattr(c10d, op, wrapper)
            if getattr(dist, op, None) is original:
                setattr(dist, op, wrapper)

    def _counting(self, collective, op):
        probe, nested = self, self._in_collective

        def counted(*args, **kwargs):
            if probe.off or getattr(nested, "inside", False):
                return collective(*args, **kwargs)  # e.g. all_gather_object's own all_gather
            probe.hold_while_hung()
            probe.on_collective(op)
            nested.inside = True
            try:
                return collective(*args, **kwargs)
            finally:
                nested.inside = False

        return counted

    def hold_while_hung(self) -> None:
        now = self._clock()
        if now - self._hang_checked_at < HANG_CHECK_GAP_S:
            return
        self._hang_checked_at = now
        while os.path.exists(self._hang_file):
            self._sleep(HANG_CHECK_GAP_S)

    def on_collective(self, op: str) -> None:
        try:
            now = self._clock()
            if self._loads > self._loads_written and now - self._load_written_at >= LOAD_RECORD_GAP_S:
                self.flush_loads()  # a script that never steps: its loads so far, before its collectives
            self._collectives += 1
            self._last_op = op
            if self._collectives == 1 or now - self._activity_written_at >= ACTIVITY_RECORD_GAP_S:
                self._activity_written_at, self._collectives_written = now, self._collectives
                self.write("activity", collectives=self._collectives, op=op)
        except Exception:
            self.disable()

    # --- the way to the first step: torch imported, process group ready, checkpoint loads ---

    def wrap_pg_init(self, modules) -> None:
        """init_process_group writes "pg_ready" when it returns, with the seconds the call took."""
        import functools

        original = getattr(modules[0], "init_process_group", None) if modules else None
        if not callable(original) or hasattr(original, "__elastic_sim_op__"):
            return
        probe, clock = self, self._clock

        def init_process_group(*args, **kwargs):
            began = clock()
            result = original(*args, **kwargs)
            # init_process_group(backend, init_method, timeout, ...): the timeout the script gave (None: torch's
            # default), which the verdict's advice on a hang must know.
            timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
            probe.on_pg_ready(clock() - began, getattr(timeout, "total_seconds", lambda: None)())
            return result

        wrapper = functools.wraps(original)(init_process_group)
        wrapper.__elastic_sim_op__ = "init_process_group"
        for module in modules:
            if getattr(module, "init_process_group", None) is original:
                module.init_process_group = wrapper

    def on_pg_ready(self, seconds: float, timeout_s: float | None = None) -> None:
        try:
            self.flush_loads()
            given = {} if timeout_s is None else {"timeout_s": timeout_s}
            self.write("pg_ready", seconds=round(seconds, 6), **given)
        except Exception:
            self.disable()

    def wrap_loads(self, module, names, op_prefix) -> None:
        """Time each call of module.<name> (a checkpoint load) until the first step."""
        self._wrap(module, names, op_prefix, self._timing)

    def _wrap(self, module, names, op_prefix, make_wrapper) -> None:
        """Replace module.<name> for each name with make_wrapper(original, op), once."""
        import functools

        for name in names:
            original = getattr(module, name, None)
            if not callable(original) or hasattr(original, "__elastic_sim_op__"):
                continue
            wrapper = functools.wraps(original)(make_wrapper(original, f"{op_prefix}{name}"))
            wrapper.__elastic_sim_op__ = f"{op_prefix}{name}"
            setattr(module, name, wrapper)

    def _timing(self, load, op):
        probe, nested, clock = self, self._in_load, self._clock

        def timed(*args, **kwargs):
            if probe.off or probe._steps or getattr(nested, "inside", False):
                return load(*args, **kwargs)  # after the first step, or dcp.load's own torch.load
            nested.inside = True
            began = clock()
            try:
                return load(*args, **kwargs)
            finally:
                nested.inside = False
                probe.on_load(op, clock() - began, checkpoint_path(op, args, kwargs))

        return timed

    def on_load(self, op: str, seconds: float, path=None) -> None:
        try:
            self._loads += 1
            self._load_s += seconds
            self._load_op = op
            self._load_path = path
            if self._loads == 1 or self._clock() - self._load_written_at >= LOAD_RECORD_GAP_S:
                self.flush_loads()
        except Exception:
            self.disable()

    def flush_loads(self) -> None:
        """A "load" record with the totals so far, unless the last one already had them."""
        if self._loads > self._loads_written:
            self._load_written_at, self._loads_written = self._clock(), self._loads
            path = {"path": self._load_path} if self._load_path else {}  # the last file read, where it had a name
            self.write("load", n=self._loads, seconds=round(self._load_s, 6), op=self._load_op, **path)

    # --- checkpoint saves ------------------------------------------------------------------

    def wrap_saves(self, module, names, op_prefix) -> None:
        """Each call of module.<name> that writes a named file (or directory) writes a "save" record."""
        self._wrap(module, names, op_prefix, self._recording)

    def _recording(self, save, op):
        probe, nested, wall = self, self._in_save, self._wall

        def recorded(*args, **kwargs):
            if probe.off or getattr(nested, "inside", False):
                return save(*args, **kwargs)  # dcp.save's own torch.save
            nested.inside = True
            content = None
            if not probe._described and op == "torch.save":
                probe._described = True  # the first save's object only: what a checkpoint of this script holds
                content = saved_content(kwargs["obj"] if "obj" in kwargs else args[0] if args else None)
            began = wall()
            try:
                result = save(*args, **kwargs)
            finally:
                nested.inside = False
            probe.on_save(op, checkpoint_path(op, args, kwargs), began, wall(), content)
            return result  # a save that raised is no checkpoint: not recorded

        return recorded

    def on_save(self, op: str, path, began: float, ended: float, content=None) -> None:
        """A "save" record: the file, when the save began and its seconds (the record's time is its end),
        and the step this worker was at (the optimizer's, where it holds one; n: steps this process took)."""
        if path is None:
            return  # into memory (a BytesIO): not a checkpoint file by itself
        try:
            optimizer = self._optimizer() if self._optimizer is not None else None
            step = self._absolute_step(optimizer)
            self._saved = (path, began, step, self._steps)
            self.write(
                "save",
                op=op,
                path=path,
                began=round(began, 6),
                seconds=round(ended - began, 6),
                step=step,
                n=self._steps,
                **({"content": content} if content else {}),
            )
        except Exception:
            self.disable()

    def wrap_renames(self, os_module) -> None:
        """os.replace and os.rename of the file last saved write a "save" record under the new name."""
        import functools

        for name in ("replace", "rename"):
            original = getattr(os_module, name)
            if hasattr(original, "__elastic_sim_op__"):
                continue
            wrapper = functools.wraps(original)(self._renaming(original, f"os.{name}"))
            wrapper.__elastic_sim_op__ = f"os.{name}"
            setattr(os_module, name, wrapper)

    def _renaming(self, rename, op):
        probe, wall = self, self._wall

        def renamed(src, dst, *args, **kwargs):
            result = rename(src, dst, *args, **kwargs)
            if probe._saved is not None and not probe.off:
                probe.on_rename(op, src, dst, wall())
            return result

        return renamed

    def on_rename(self, op: str, src, dst, ended: float) -> None:
        try:
            path, began, step, n = self._saved
            if isinstance(src, (str, os.PathLike)) and os.path.abspath(os.fsdecode(src)) == path:
                self._saved = None
                target = os.path.abspath(os.fsdecode(dst))
                self.write(
                    "save", op=op, path=target, began=round(began, 6), seconds=round(ended - began, 6), step=step, n=n
                )
        except Exception:
            self.disable()

    # --- exit ------------------------------------------------------------------------------

    def at_exit(self) -> None:
        if self.off or os.getpid() != self.pid:
            return
        try:
            # What the rate limits held back: the counts at the end are exact.
            self.flush_loads()
            if self._steps > self._steps_written:
                optimizer = self._optimizer() if self._optimizer is not None else None
                self._steps_written = self._steps
                self.write("step", n=self._steps, step=self._step_at_exit(optimizer))
            if self._collectives > self._collectives_written:
                self.write("activity", collectives=self._collectives, op=self._last_op)
            self.write("exit", code=self.exit_code)
        except Exception:
            self.disable()


def saved_content(obj):
    """What a saved object holds, at its top level: its keys and their value types (at most 30), and
    whether a model's state (a mapping of tensors) and an optimizer's (state and param_groups) are in it.
    None when it cannot tell (never raises: a probe must not break the save)."""
    try:
        import torch

        def is_tensors(value):
            return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())

        def is_optimizer(value):
            return isinstance(value, dict) and "param_groups" in value and "state" in value

        def is_scheduler(value):  # an LRScheduler's state_dict()
            return isinstance(value, dict) and "last_epoch" in value and ("base_lrs" in value or "_last_lr" in value)

        def is_scaler(value):  # a GradScaler's state_dict()
            return isinstance(value, dict) and "scale" in value and "growth_factor" in value

        if not isinstance(obj, dict):
            return {"type": type(obj).__name__}
        values = list(obj.values())
        return {
            "type": type(obj).__name__,
            "keys": {str(k): type(v).__name__ for k, v in list(obj.items())[:30]},
            "model_state": is_tensors(obj) or any(is_tensors(v) for v in values),
            "optimizer_state": is_optimizer(obj) or any(is_optimizer(v) for v in values),
            "scheduler_state": any(is_scheduler(v) for v in values),
            "scaler_state": any(is_scaler(v) for v in values),
        }
    except Exception:
        return None


def checkpoint_path(op, args, kwargs):
    """The file (or, for torch.distributed.checkpoint, the directory) a load or save call names, as an
    absolute path; None for a buffer or a storage without a path."""
    if op.startswith("torch."):  # torch.save(obj, f), torch.load(f)
        at = 1 if op == "torch.save" else 0
        target = kwargs["f"] if "f" in kwargs else args[at] if len(args) > at else None
    else:  # dcp: checkpoint_id=, else its storage writer's or reader's path (save_state_dict(state, writer))
        target = kwargs.get("checkpoint_id")
        storage = kwargs.get("storage_writer", kwargs.get("storage_reader", args[1] if len(args) > 1 else None))
        if target is None and storage is not None:
            target = getattr(storage, "path", None)
    if isinstance(target, (str, bytes, os.PathLike)):
        path = os.fsdecode(target)
    else:
        path = getattr(target, "name", None)  # an open file
    return os.path.abspath(path) if isinstance(path, str) and path else None


class AfterImport:
    """A meta path finder that runs a callback right after a watched module has executed, by
    wrapping the real loader's exec_module; it leaves sys.meta_path once nothing is watched."""

    def __init__(self, callbacks, on_error):
        self.callbacks = dict(callbacks)
        self.on_error = on_error
        self._searching = set()

    def install(self) -> None:
        import sys

        for name in list(self.callbacks):
            if name in sys.modules:  # imported before us: nothing to wait for
                self._fire(name, sys.modules[name])
        if self.callbacks:
            sys.meta_path.insert(0, self)

    def find_spec(self, name, path=None, target=None):
        # Another AfterImport (elastic_sim_devices has its own) asks every finder in turn, this one too:
        # a search already under way for the name answers None, so neither recurses into the other.
        if name not in self.callbacks or name in self._searching:
            return None
        import sys

        self._searching.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching.discard(name)
        try:
            exec_module = spec.loader.exec_module

            def exec_then_callback(module):
                exec_module(module)
                self._fire(name, module)

            spec.loader.exec_module = exec_then_callback
        except Exception:
            pass  # a loader we cannot wrap: the module loads untouched
        return spec

    def _fire(self, name, module) -> None:
        callback = self.callbacks.pop(name, None)
        if not self.callbacks:
            import sys

            if self in sys.meta_path:
                sys.meta_path.remove(self)
        if callback is not None:
            try:
                callback(module)
            except Exception:
                self.on_error()


def activate():
    """Instrument this worker process; returns its probe (None when turned off by a failure)."""
    import atexit
    import sys

    import elastic_sim_progress

    probe = WorkerProbe(elastic_sim_progress.write_record)
    os.environ[OWNER_ENV] = str(probe.pid)
    probe.write("start")
    if probe.off:
        return None
    os.register_at_fork(after_in_child=probe.disable)  # a forked child is not the worker

    def after_torch(torch):
        probe.write("imported")
        probe.wrap_loads(torch, ("load",), "torch.")
        probe.wrap_saves(torch, ("save",), "torch.")
        probe.wrap_renames(os)
        scheduler = getattr(getattr(getattr(torch, "optim", None), "lr_scheduler", None), "LRScheduler", None)
        probe.wrap_uses(scheduler, "lr_scheduler")
        probe.wrap_uses(
            getattr(getattr(getattr(torch, "amp", None), "grad_scaler", None), "GradScaler", None), "grad_scaler"
        )

    def after_distributed(dist):
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if c10d is not None:
            probe.wrap_collectives(dist, c10d)
        probe.wrap_pg_init([sys.modules[name] for name in PG_INIT_HOLDERS if name in sys.modules])

    AfterImport(
        {
            "torch": after_torch,
            "torch.optim.optimizer": probe.install_step_hook,
            "torch.distributed": after_distributed,
            "torch.distributed.checkpoint.state_dict": probe.wrap_state_init,
            "torch.utils.data.distributed": probe.wrap_sampler,
            "torch.distributed.checkpoint": lambda dcp: (
                probe.wrap_loads(dcp, CHECKPOINT_LOADS, "dcp."),
                probe.wrap_saves(dcp, CHECKPOINT_SAVES, "dcp."),
            ),
        },
        on_error=probe.disable,
    ).install()
    _record_exit_code(probe, sys)
    atexit.register(probe.at_exit)
    return probe


def _record_exit_code(probe, sys) -> None:
    """atexit handlers are not told the exit code: learn it from the two ways a script ends
    early. An uncaught exception exits 1; sys.exit(x) exits x. A script that runs to its end
    exits 0 (a bare `raise SystemExit(n)` is missed and reads 0)."""
    probe.exit_code = 0
    previous_hook, previous_exit = sys.excepthook, sys.exit

    def excepthook(kind, value, traceback):
        probe.exit_code = 1
        previous_hook(kind, value, traceback)

    def exit_with(status=None):
        probe.exit_code = 0 if status is None else status if isinstance(status, int) else 1
        previous_exit(status)

    sys.excepthook, sys.exit = excepthook, exit_with


if should_instrument():
    try:
        activate()
    except Exception:
        pass  # never break the user's script
