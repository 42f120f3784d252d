"""Locks of one engine, shared by every process, user and state home that drives it.

A lock is an fcntl.flock on LOCK_ROOT/<engine id>.<name>.lock: keyed by the engine's own ID (docker
info), never by TMPDIR, so two `up`s with different temp folders, homes or users still meet. The
folder is root's (or the caller's) and sticky, so only a lock file's maker can remove it; a folder
another user made first is refused, not trusted. A lock held by another process is waited for at most
SIM_LOCK_TIMEOUT seconds, and that process is named (pid, user, command line, from /proc/locks).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import re
import stat
import time
from pathlib import Path

from sim.core.errors import SimError, UsageError
from sim.core.progress import Progress

LOCK_DIR_ENV = "SIM_LOCK_DIR"  # another root for the locks (tests; a host without /run)
LOCK_TIMEOUT_ENV = "SIM_LOCK_TIMEOUT"
# An `up` holds its name's lock while its images build (a cold build takes minutes): long, but not for ever.
DEFAULT_LOCK_TIMEOUT_S = 1800.0
# root's runtime folder; a user who is not root, where root has not made it yet, uses the fixed
# FALLBACK_LOCK_ROOT (never TMPDIR, which differs per user and per CI runner).
LOCK_ROOT = Path("/run/elastic-sim/locks")
FALLBACK_LOCK_ROOT = Path("/tmp/elastic-sim-locks")
POLL_S = 0.2


class LockTimeout(SimError):
    """Another process held the lock for longer than the timeout."""


def lock_root() -> Path:
    override = os.environ.get(LOCK_DIR_ENV)
    if override:
        return Path(override)
    return LOCK_ROOT if os.geteuid() == 0 or LOCK_ROOT.is_dir() else FALLBACK_LOCK_ROOT


def lock_timeout() -> float:
    text = os.environ.get(LOCK_TIMEOUT_ENV)
    if not text:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{LOCK_TIMEOUT_ENV} {text!r}: not a number of seconds above zero; e.g. 600, or unset it")
    return seconds


def engine_lock_path(engine_id: str, file_name: str) -> Path:
    """LOCK_ROOT/<engine id>.<file_name>, its folder made (sticky, shared) or checked: root's or ours."""
    key = re.sub(r"[^A-Za-z0-9._-]", "-", engine_id).strip(".-") or "engine"
    root = lock_root()
    for folder in (*reversed(root.parents[: len(root.parents) - 1]), root):
        if folder in (Path("/tmp"), Path("/run"), Path("/var/tmp")):
            continue  # the system's own shared folders: not ours to change
        _shared_folder(folder, sticky=folder == root)
    return root / f"{key}.{file_name}"


def _shared_folder(folder: Path, *, sticky: bool) -> None:
    """Make `folder` (0755; 01777 where every user makes locks in it), or accept it only if root or this
    user owns it and no one else can swap what is in it (group/other write only with the sticky bit)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o755)
        if sticky:
            os.chmod(folder, 0o1777)
    try:
        info = os.lstat(folder)
    except OSError as error:
        raise UsageError(f"lock folder {folder}: {error.strerror}; set {LOCK_DIR_ENV} to a folder of yours") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"lock folder {folder}: not a folder (a link or a file); remove it, or set {LOCK_DIR_ENV}")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, os.geteuid()):
        raise UsageError(
            f"lock folder {folder}: owned by {_user(info.st_uid)}, not by root or you, so its locks cannot be "
            f"trusted; have root make the shared one once (`sudo install -d -m 1777 {LOCK_ROOT}`), or set "
            f"{LOCK_DIR_ENV} to a folder of yours"
        )
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise UsageError(
            f"lock folder {folder}: mode {mode:04o}, writable by others without the sticky bit, so another user "
            f"could swap its locks; `chmod +t {folder}` (or remove it)"
        )


@contextlib.contextmanager
def engine_lock(engine_id: str, file_name: str, progress: Progress | None, waiting_for: str):
    """flock on LOCK_ROOT/<engine id>.file_name, for the block. Per open file: two threads of one
    process exclude each other too. Held by another: its holder is said at once, and waited for at most
    lock_timeout() seconds (LockTimeout, one line naming it)."""
    timeout = lock_timeout()
    path = engine_lock_path(engine_id, file_name)
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            if progress:
                progress(f"[up] waiting: {waiting_for} ({holder}); at most {timeout:g}s ({LOCK_TIMEOUT_ENV})")
            deadline = time.monotonic() + timeout
            while True:
                time.sleep(POLL_S)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(
                            f"{waiting_for}: {lock_holder(fd) or holder} holds the lock {path} after {timeout:g}s; "
                            f"wait for it or stop it, or raise {LOCK_TIMEOUT_ENV}"
                        ) from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _open_lock(path: Path) -> int:
    """The lock file, read-only (flock needs no more), never through a link. Opened first without O_CREAT:
    in a sticky folder, the kernel's protected_regular refuses O_CREAT on another user's file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue  # made meanwhile by another process: open that one
            except OSError as error:
                raise UsageError(f"lock {path}: cannot make it ({error.strerror}); set {LOCK_DIR_ENV}") from None
        except OSError as error:
            why = "a link" if error.errno == errno.ELOOP else error.strerror
            raise UsageError(f"lock {path}: cannot open it ({why}); remove it, or set {LOCK_DIR_ENV}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UsageError(f"lock {path}: not a plain file; remove it, or set {LOCK_DIR_ENV}")
        return fd
    raise UsageError(f"lock {path}: made and removed again while opening it; retry")


def lock_holder(fd: int) -> str:
    """Who holds the flock on the open file `fd`: 'pid N (user U: COMMAND)', from /proc/locks; '' if unknown."""
    info = os.fstat(fd)
    dev = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == dev and fields[4].isdigit():
            return describe_process(int(fields[4]))
    return ""


def describe_process(pid: int) -> str:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    command = " ".join(" ".join(a.decode(errors="replace").split()) for a in argv if a)  # one line
    return f"pid {pid} (user {_user(uid)}: {command[:200]})"


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
