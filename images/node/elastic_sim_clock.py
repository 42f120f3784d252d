"""The node's clock under elastic-sim's skew-clock fault.

Containers share the host's kernel clock, so a node's clock is skewed with libfaketime (Debian's
0.9.10) preloaded into every process of the node (sim/engines/render.py: LD_PRELOAD, and
FAKETIME_TIMESTAMP_FILE, the per-node offset the fault writes, re-read every second or two).
Only the wall clock moves (FAKETIME_DONT_FAKE_MONOTONIC=1), as when a real machine's clock is off.

Imported by elastic-sim.pth at start-up of every Python process in a node. Where libfaketime is
preloaded it:
  - offers `wall_clock()`, the kernel's real time: the history's records (the side channel, the
    shipped trainer's lines) stay on the host's clock while the node's programs see a skewed one;
  - mends `time.sleep`: libfaketime 0.9.10 breaks absolute sleeps on CLOCK_MONOTONIC when the
    monotonic clock is not faked (upstream #426, fixed in 0.9.11), and Python 3.11 sleeps that way,
    so every `time.sleep` would raise EINVAL. A sleep on select(2)'s relative timeout is the same
    sleep (it resumes after a signal with the time left, as time.sleep does).
Elsewhere `wall_clock` is `time.time` and nothing is changed.
"""

import os
import time

OFFSET_FILE_ENV = "FAKETIME_TIMESTAMP_FILE"


def preloaded(env=os.environ) -> bool:
    """libfaketime is preloaded into this process."""
    return "faketime" in env.get("LD_PRELOAD", "")


def _kernel_clock():
    """CLOCK_REALTIME from libc's own clock_gettime: a symbol looked up in libc's handle is libc's,
    not the preloaded library's."""
    import ctypes

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    clock_gettime = ctypes.CDLL("libc.so.6").clock_gettime
    clock_gettime.argtypes = (ctypes.c_int, ctypes.POINTER(Timespec))
    realtime = 0  # CLOCK_REALTIME

    def now() -> float:
        spec = Timespec()
        if clock_gettime(realtime, ctypes.byref(spec)) != 0:
            return time.time()
        return spec.tv_sec + spec.tv_nsec * 1e-9

    return now


def _select_sleep(sleep):
    import select

    def sleep_on_select(seconds):
        if seconds < 0:
            sleep(seconds)  # time.sleep's own ValueError
        select.select([], [], [], seconds)

    sleep_on_select.__doc__ = sleep.__doc__
    return sleep_on_select


wall_clock = time.time
if preloaded():
    try:
        wall_clock = _kernel_clock()
        time.sleep = _select_sleep(time.sleep)
    except Exception:
        pass  # no libc to ask: the skewed clock it is
