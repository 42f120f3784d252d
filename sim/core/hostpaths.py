"""Host files a cluster brings into its nodes: the job's project tree, `--mount`s, `--requirements`.

Every node sees what is given here, so a folder that would expose the host is refused before
anything starts, with the reason: `/`, a home folder (or one that holds home folders), a shared temp
folder (other users' files and agent sockets), a folder holding `.ssh`, a Docker socket or any other
socket, and by kind (REFUSED_HOST_FOLDERS): a system folder, the engine's data root, a credential
folder. Pure: reads the host's file system, never Docker (the engine's own data root is handed in).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from sim.core.errors import UsageError

# Where the project tree lands in a node (images/node/elastic-sim-project): the host tree read-only at
# PROJECT_STAGE_DIR, copied at the node's start into PROJECT_DIR_IN_NODE, the job's writable working folder.
PROJECT_STAGE_DIR = "/opt/sim/user"
PROJECT_DIR_IN_NODE = "/opt/sim/project"
# Not copied into the nodes (the node start script excludes the same names): version control, virtual
# environments, caches. Data belongs in a --mount, not in the tree.
PROJECT_EXCLUDES = (".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox")
SHARED_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
# A mount may not cover what the harness puts in a node (ours), nor replace a system folder whole.
OUR_NODE_PATHS = ("/opt/sim", "/opt/venv", "/ckpt", "/sim", "/var/lib/elastic-sim", "/usr/local/lib/faketime")
SYSTEM_NODE_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/sys", "/dev", "/var", "/run")
# Host folders refused by kind, at, below or above them (one holding one), read-only too: a node, even one
# without capabilities, reads and (root in a team image) writes what its uid may. `~/` is each home folder.
SYSTEM_FOLDER = "a system folder"
ENGINE_ROOT = "the container engine's data root (every container's files and the engine's state)"
CREDENTIAL_FOLDER = "a credential folder (keys and tokens of clouds, clusters, registries)"
REFUSED_HOST_FOLDERS: tuple[tuple[str, str], ...] = (
    *((p, SYSTEM_FOLDER) for p in ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32")),
    *((p, SYSTEM_FOLDER) for p in ("/proc", "/run", "/sbin", "/sys", "/usr", "/var/log", "/var/spool")),
    *((p, ENGINE_ROOT) for p in ("/var/lib/docker", "/var/lib/containerd", "/var/snap/docker")),
    *((p, ENGINE_ROOT) for p in ("~/.local/share/docker", "~/.local/share/containers")),
    *(
        (f"~/{p}", CREDENTIAL_FOLDER)
        for p in (
            ".ssh",
            ".gnupg",
            ".docker",
            ".kube",
            ".minikube",
            ".aws",
            ".azure",
            ".oci",
            ".config/gcloud",
            ".config/gh",
            ".config/hub",
            ".config/containers",
            ".config/doctl",
            ".password-store",
            ".terraform.d",
            ".netrc",
            ".git-credentials",
            ".pypirc",
            ".npmrc",
            ".vault-token",
        )
    ),
)
_MOUNT_RE = re.compile(r"^(?P<host>[^:]+):(?P<target>[^:]+)(:(?P<mode>[a-z]+))?$")


@dataclasses.dataclass(frozen=True)
class TreeSummary:
    files: int
    size: int  # bytes

    def __str__(self) -> str:
        return f"{self.files} files, {_human(self.size)}"


def home_folders() -> set[Path]:
    """This user's home, root's, and every folder under /home."""
    homes = {Path("/root")}
    for variable in ("HOME",):
        if os.environ.get(variable):
            homes.add(Path(os.environ[variable]))
    try:
        homes.add(Path.home())
    except RuntimeError:
        pass
    if Path("/home").is_dir():
        homes.update(p for p in Path("/home").iterdir() if p.is_dir())
    return {_resolved(p) for p in homes} - {Path("/")}


def docker_sockets() -> set[Path]:
    found = {Path(p) for p in DOCKER_SOCKETS}
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        found.add(Path(host.removeprefix("unix://")))
    if os.environ.get("XDG_RUNTIME_DIR"):
        found.add(Path(os.environ["XDG_RUNTIME_DIR"]) / "docker.sock")
    return {_resolved(p) for p in found}


def refused_folders(engine_root: str | Path | None = None) -> list[tuple[Path, str]]:
    """REFUSED_HOST_FOLDERS as this host's paths (each home's, resolved), and the engine's own data root."""
    found = []
    for pattern, kind in REFUSED_HOST_FOLDERS:
        if pattern.startswith("~/"):
            found += [(home / pattern[2:], kind) for home in home_folders()]
        else:
            found.append((Path(pattern), kind))
    if engine_root:
        found.append((Path(engine_root), ENGINE_ROOT))
    return [(_resolved(path), kind) for path, kind in found]


def refused_kind(path: Path, engine_root: str | Path | None = None) -> str | None:
    """The kind of refused folder `path` (resolved) is, is in, or holds; None when none."""
    for folder, kind in refused_folders(engine_root):
        if path == folder or _inside(folder, path):
            return f"{kind}: {folder}"
        if _inside(path, folder):
            return f"it holds {kind}: {folder}"
    return None


def exposure(path: Path, engine_root: str | Path | None = None) -> str | None:
    """Why bringing `path` (resolved) into every node would expose the host; None when it would not.
    `engine_root`: the engine's data root, as the engine says (docker info's DockerRootDir)."""
    if path == Path("/"):
        return "the host's whole file system"
    homes = home_folders()
    if path in homes:
        return "a home folder (its .ssh, shell history and agent sockets would be in every node)"
    if any(_inside(path, home) for home in homes):
        return "a folder that holds home folders"
    if str(path) in SHARED_TEMP_DIRS:
        return "the shared temp folder (other users' files and agent sockets)"
    if ".ssh" in path.parts:
        return f"{CREDENTIAL_FOLDER}: an SSH key folder"
    for sock in docker_sockets():
        if sock == path or _inside(path, sock):
            return f"it holds the Docker socket {sock} (root on the host)"
    kind = refused_kind(path, engine_root)
    if kind:
        return kind
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        try:
            entries = list(os.scandir(path))
        except OSError:
            return None
        for entry in entries:
            if entry.name == ".ssh":
                return "it holds a .ssh folder"
            try:
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    return f"it holds a socket ({entry.name})"
            except OSError:
                continue
    return None


def check_exposure(flag: str, given: str | Path, path: Path, fix: str, engine_root: str | Path | None = None) -> None:
    why = exposure(path, engine_root)
    if why:
        shown = f"'{given}'" if str(given) == str(path) else f"'{given}' ({path})"
        raise UsageError(f"{flag} {shown}: refused, {why}; {fix}")


def git_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` holding `.git` (a folder, or a worktree's file)."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


def default_project_dir(script: Path) -> tuple[Path, str]:
    """(the project folder of a script, how it was found): its git root if it has one, else its folder."""
    root = git_root(script.parent)
    return (root, "the script's git root") if root is not None else (script.parent, "the script's folder")


def check_project_dir(flag: str, given: str | Path) -> str:
    path = Path(given).expanduser()
    if not path.exists():
        raise UsageError(f"{flag} '{given}': no such folder; give the folder of your job's code")
    if not path.is_dir():
        raise UsageError(f"{flag} '{given}': not a folder; give the folder of your job's code (its root)")
    resolved = _resolved(path)
    check_exposure(flag, given, resolved, "give your job's own folder (keep data out of it; bring that with --mount)")
    return str(resolved)


def tree_summary(root: Path) -> TreeSummary:
    """What the nodes copy of a project tree (PROJECT_EXCLUDES left out; symlinks counted, not followed)."""
    files = size = 0
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in PROJECT_EXCLUDES]
        for name in names:
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            files += 1
            size += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return TreeSummary(files, size)


def unreadable_by(
    root: Path, uid: int, gids: Sequence[int] | None = None, *, walk: bool
) -> tuple[Path, os.stat_result] | None:
    """The first path at or (walk=True) below `root` that the nodes' user cannot read: a file it may not
    read, a folder it may not list and enter. The nodes hold no capability, so even their root reads by
    the mode bits alone: the owner's if it is `uid`, else the group's if it is one of `gids` (the user's
    groups in its image; None: the one its uid names, as ours is sim:sim, 1000:1000), else the others'.
    Symlinks are copied as links, so they are not judged; PROJECT_EXCLUDES are not copied, so not walked."""
    groups = frozenset((uid,) if gids is None else gids)

    def denied(path: Path) -> os.stat_result | None:
        try:
            info = os.lstat(path)
        except OSError:
            return None  # gone meanwhile: nothing to read
        if stat.S_ISLNK(info.st_mode):
            return None
        need = 0o5 if stat.S_ISDIR(info.st_mode) else 0o4
        shift = 6 if info.st_uid == uid else 3 if info.st_gid in groups else 0
        return None if (info.st_mode >> shift) & need == need else info

    info = denied(root)
    if info is not None or not walk or not root.is_dir():
        return (root, info) if info is not None else None
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in PROJECT_EXCLUDES]
        for name in (*dirs, *names):
            path = Path(folder, name)
            info = denied(path)
            if info is not None:
                return path, info
        dirs[:] = [d for d in dirs if denied(Path(folder, d)) is None]
    return None


def check_readable_by_nodes(what: str, root: Path, uid: int, gids: Sequence[int] | None = None, *, walk: bool) -> None:
    """Refuse, before anything starts, a tree the nodes' user could not read: the copy or the job would
    fail in every node with a bare 'Permission denied' (a 0700 folder, the usual mode of a home folder or
    of a temp folder made by mkdtemp or pytest)."""
    found = unreadable_by(root, uid, gids, walk=walk)
    if found is None:
        return
    path, info = found
    mode = stat.S_IMODE(info.st_mode)
    where = "" if path == root else f": {path} inside it"
    raise UsageError(
        f"{what} {root}: the nodes' user (uid {uid}, no capabilities) cannot read it{where} "
        f"(mode {mode:04o}, owner uid {info.st_uid}, group {info.st_gid}); make it readable, "
        f"e.g. `chmod -R a+rX {root}`"
    )


def parse_mount(text: str) -> tuple[str, str, bool]:
    """`HOST:CONTAINER[:ro|rw]` -> (host, container, writable); read-only unless `:rw`."""
    match = _MOUNT_RE.fullmatch(str(text).strip())
    if not match:
        raise UsageError(f"--mount '{text}': not HOST:CONTAINER[:rw]; use e.g. --mount ./data:/data")
    mode = match["mode"] or "ro"
    if mode not in ("ro", "rw"):
        raise UsageError(f"--mount '{text}': mode '{mode}' is neither ro nor rw; use e.g. --mount ./data:/data:rw")
    return match["host"], match["target"], mode == "rw"


def check_mount(host: str, target: str, writable: bool) -> tuple[str, str, bool]:
    """The mount with its host path resolved, after checking both ends."""
    shown = f"--mount '{host}:{target}{':rw' if writable else ''}'"
    path = Path(host).expanduser()
    if not path.exists():
        raise UsageError(f"{shown}: no such file or folder {host!r} on this machine; give an existing path")
    resolved = _resolved(path)
    check_exposure(f"{shown}: host path", host, resolved, "mount only the folder the job needs (e.g. its data folder)")
    if not target.startswith("/"):
        raise UsageError(f"{shown}: the node path {target!r} is not absolute; use e.g. /data")
    node_path = os.path.normpath(target)
    for ours in OUR_NODE_PATHS:
        if node_path == ours or _inside(Path(node_path), Path(ours)) or _inside(Path(ours), Path(node_path)):
            raise UsageError(f"{shown}: {node_path} would cover elastic-sim's {ours} in the node; use e.g. /data")
    if node_path in ("/", *SYSTEM_NODE_PATHS) or any(_inside(Path(node_path), Path(p)) for p in SYSTEM_NODE_PATHS):
        raise UsageError(f"{shown}: {node_path} would replace a system folder of the node; use e.g. /data")
    return str(resolved), node_path, writable


def _inside(outer: Path, inner: Path) -> bool:
    """`inner` is strictly below `outer`."""
    return inner != outer and outer in inner.parents


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()


def _human(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


def check_shared_ckpt_dir(given: str, node_uid: int) -> str:
    """`--ckpt-dir`: an existing folder, not one that exposes the host, that the nodes' user may write;
    the resolved path (every host must mount the same file system there)."""
    path = Path(given).expanduser()
    if not path.is_dir():
        raise UsageError(f"--ckpt-dir {given!r}: no such folder on this machine; make it on the shared file system")
    resolved = _resolved(path)
    check_exposure("--ckpt-dir", given, resolved, "give a folder of its own for the job's checkpoints")
    info = resolved.stat()
    if not (info.st_uid == node_uid and info.st_mode & stat.S_IWUSR or info.st_mode & stat.S_IWOTH):
        raise UsageError(
            f"--ckpt-dir {given!r}: the nodes' user (uid {node_uid}) cannot write it (mode "
            f"{stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}); `chown {node_uid} {resolved}` on the "
            "shared file system"
        )
    return str(resolved)
