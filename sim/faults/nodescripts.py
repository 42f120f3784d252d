"""Small programs the nemesis runs inside a node (`python3 -c SCRIPT ARGS...`, stdlib only).

Each prints one JSON line saying what it did, or exits non-zero with the reason on stderr
(exit 3: the request was wrong for this node; 4: what it waited for never came). They run as
the training user, who owns the workers and the checkpoint files: no capability is needed.
"""

from __future__ import annotations

import json

from sim.core.errors import FaultError

# While this file exists, the worker with that pid waits before its next collective: read by the node
# image's instrumentation (images/node/elastic_sim_instrument.py HANG_FILE; a unit test keeps them equal).
# hang-collectives' own module declares it.
from sim.core.faultkinds.process import COLLECTIVE_HANG_FILE as COLLECTIVE_HANG_FILE

WRONG_REQUEST = 3
NEVER_CAME = 4

# argv: DIR MODE SEED. The newest regular file under DIR (by mtime, temp files of a write in
# progress aside) is damaged as Jepsen's nemeses do: bitflip flips one bit in each of 8 random
# bytes; truncate cuts it to half its length.
CORRUPT = r"""
import json, os, random, sys
root, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = []
for folder, _, names in os.walk(root):
    for name in names:
        path = os.path.join(folder, name)
        if '.tmp' in name or name.startswith('.sim-') or not os.path.isfile(path):
            continue
        files.append((os.stat(path).st_mtime, path))
if not files:
    sys.exit(print(f'no file under {root} to corrupt yet (no checkpoint written?)', file=sys.stderr) or 3)
_, path = max(files)
size = os.path.getsize(path)
rng = random.Random(seed)
with open(path, 'r+b') as f:
    if mode == 'truncate':
        f.truncate(size // 2)
        done = {'new_size': size // 2}
    else:
        offsets = sorted(rng.sample(range(size), min(8, size)))
        for offset in offsets:
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        done = {'offsets': offsets}
    f.flush()
    os.fsync(f.fileno())
print(json.dumps({'file': path, 'size': size, 'mode': mode, **done}))
"""

# argv: DIR LEAVE MAX. Fills the filesystem holding DIR with DIR/.sim-filler until LEAVE bytes are
# free; refuses (exit 3) when more than MAX bytes are free: a disk that large is the host's own.
FILL = r"""
import json, os, sys
root, leave, most = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Only the cluster's own size-limited checkpoint storage: /ckpt, a tmpfs (--ckpt-size), and a folder on
# that same filesystem (a symlink or another mount under it, e.g. the events folder, is refused).
mounts = {}
with open('/proc/self/mounts') as f:
    for line in f:
        fields = line.split()
        mounts[fields[1]] = fields[2]
real = os.path.realpath(root)
if (real != '/ckpt' and not real.startswith('/ckpt/')) or mounts.get('/ckpt') != 'tmpfs':
    why = "not on the cluster's size-limited checkpoint storage (/ckpt, a tmpfs)"
    sys.exit(print(f'{root}: {why}', file=sys.stderr) or 3)
if os.stat(real).st_dev != os.stat('/ckpt').st_dev:
    sys.exit(print(f'{root}: another filesystem than /ckpt', file=sys.stderr) or 3)
root = real
stat = os.statvfs(root)
free = stat.f_bavail * stat.f_frsize
if free > most:
    sys.exit(print(f'{root} has {free >> 20} MiB free: not a size-limited disk', file=sys.stderr) or 3)
path, chunk, written = os.path.join(root, '.sim-filler'), b'\0' * (1 << 20), 0
# A new file, never a link: the job runs as this uid and could point .sim-filler at a host folder (the
# events mount, a :rw mount) to have the filler write gigabytes there. Opened in the folder already checked.
folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
try:
    fd = os.open('.sim-filler', os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
except FileExistsError:
    why = 'exists already (a filler left in place, or a link put there): remove it first'
    sys.exit(print(f'{path} {why}', file=sys.stderr) or 3)
finally:
    os.close(folder)
with os.fdopen(fd, 'wb', buffering=0) as f:
    if os.fstat(f.fileno()).st_dev != os.stat('/ckpt').st_dev:
        os.unlink(path)
        sys.exit(print(f'{path}: another filesystem than /ckpt', file=sys.stderr) or 3)
    try:
        while written < free - leave:
            written += f.write(chunk[:max(1, min(len(chunk), free - leave - written))])
    except OSError:
        pass  # ENOSPC: full
stat = os.statvfs(root)
print(json.dumps({'file': path, 'written': written, 'free': stat.f_bavail * stat.f_frsize}))
"""

# argv: PID MOST WITHIN. Allocates (and touches) memory until the worker PID is gone, the node's
# cgroup has OOM-killed anything, MOST bytes are held, or WITHIN seconds pass; then frees it all by
# exiting. Its own oom_score_adj of 999 (the worker has 1000) makes it the next victim should the
# kernel need a second kill while the worker is still exiting: never the agent.
HOG = r"""
import json, os, sys, time
pid, most, within = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
with open('/proc/self/oom_score_adj', 'w') as f:
    f.write('999')
def alive():
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in 'ZXx'
    except OSError:
        return False
def oom_kills():
    for path, key in (('/sys/fs/cgroup/memory.events', 'oom_kill'),
                      ('/sys/fs/cgroup/memory/memory.oom_control', 'oom_kill')):
        try:
            with open(path) as f:
                return next((int(v) for k, v in (line.split() for line in f) if k == key), 0)
        except (OSError, ValueError):
            continue
    return 0
held, deadline, kills = [], time.monotonic() + within, oom_kills()
while alive() and oom_kills() == kills and len(held) < most >> 23 and time.monotonic() < deadline:
    held.append(b'\1' * (1 << 23))
    time.sleep(0.005)
allocated = len(held) << 23
held.clear()
for _ in range(200):  # the kernel reaps the victim in a moment
    if not alive():
        break
    time.sleep(0.01)
print(json.dumps({'allocated': allocated, 'worker_died': not alive(), 'oom_kills': oom_kills() - kills}))
"""

# argv: DIR WITHIN SIGNAL. Watches every torchrun worker of the node for a file under DIR open for
# writing, and signals that worker at once: a kill that lands inside a checkpoint write (kill-during-checkpoint),
# or a SIGSTOP that holds the write open while the node freezes (freeze-during-checkpoint).
KILL_IN_WRITE = r"""
import json, os, sys, time
root, within, sig = sys.argv[1].rstrip('/') + '/', float(sys.argv[2]), int(sys.argv[3])
def workers():
    found = []
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            with open(f'/proc/{p}/environ', 'rb') as f:
                env = b'\0' + f.read()
        except OSError:
            continue
        if b'\0LOCAL_RANK=' in env and b'\0TORCHELASTIC_RUN_ID=' in env:
            found.append(int(p))
    return found
def writing(pid):
    try:
        for fd in os.listdir(f'/proc/{pid}/fd'):
            target = os.readlink(f'/proc/{pid}/fd/{fd}')
            if target.startswith(root):
                with open(f'/proc/{pid}/fdinfo/{fd}') as f:
                    flags = int(f.read().split('flags:')[1].split()[0], 8)
                if flags & 3:  # O_WRONLY or O_RDWR
                    return target
    except (OSError, IndexError, ValueError):
        pass
    return None
deadline, pids, rescan = time.monotonic() + within, [], 0.0
while time.monotonic() < deadline:
    if time.monotonic() >= rescan:
        pids, rescan = workers(), time.monotonic() + 0.5
    for pid in pids:
        target = writing(pid)
        if target:
            os.kill(pid, sig)
            try:
                size = os.path.getsize(target)
            except OSError:
                size = None
            sys.exit(print(json.dumps({'pid': pid, 'file': target, 'size_at_kill': size})))
    time.sleep(0.001)
sys.exit(print(f'no worker opened a file under {root} for writing within {within:g}s', file=sys.stderr) or 4)
"""


# argv: MARKER. Ends (SIGKILL) every process of the node with MARKER among its arguments: the node script of
# a fault interrupted mid-act, which our exec call's end did not end (a filler still writing, a watcher
# that would stop a worker later). Prints the pids it ended.
END_ACT = r"""
import json, os, signal, sys
marker, ended = sys.argv[1].encode(), []
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        with open(f'/proc/{p}/cmdline', 'rb') as f:
            words = f.read().split(b'\0')
        if marker in words[1:]:
            os.kill(int(p), signal.SIGKILL)
            ended.append(int(p))
    except (OSError, ProcessLookupError):
        continue
print(json.dumps({'ended': ended}))
"""

# The last argument of a fault's node script: END_ACT finds it by it (the kinds name it: RunNodeScript.act).
from sim.core.faultkinds import ACT_MARKER as ACT_MARKER  # noqa: E402


def argv(script: str, *args: object, act: str | None = None) -> list[str]:
    """`python3 -c SCRIPT ARGS...`; `act`: a marker (ACT_MARKER) as the last argument, which the script ignores."""
    return ["python3", "-c", script, *map(str, args), *([act] if act else [])]


def parse_result(node: str, what: str, stdout: str) -> dict:
    """The JSON line a script printed last."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise FaultError(f"{node}: {what}: no result from the node ({stdout.strip()[:200] or 'no output'})") from None


# The scripts a kind's RunNodeScript names (sim/core/faultkinds), by name.
NODE_SCRIPTS = {"fill": FILL, "corrupt": CORRUPT}
