"""The job's own image layers (README "Your own environment"), over the images sim/engines/images.py builds.

  requirements  `--requirements FILE`: the packages installed, offline, from a wheelhouse that
                `pip download` prepares on the host; a layer over the node image (or over the team's
                own image), tagged by the content of the file, so a second `up` builds nothing.
  own           `--image IMAGE`: the team's image with our few pieces on top, tagged by the image's id:
                the worker hooks (.pth + modules, in that image's own site-packages), the node start
                scripts (etcd wait, project copy), libfaketime (clock faults), the etcd-v3 backend.

Both live under `elastic-sim-user/`, apart from the images that `ImageBuilder` replaces as they age.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sim.core.errors import ImageBuildError, UsageError
from sim.core.spec import ClusterSpec, check_torch_pin, image_torch_version
from sim.engines.docker import Docker, stream
from sim.engines.images import FAKETIME_PACKAGE, ImageBuilder, _digest, _link_or_copy, fill_once, platform_args

USER_REPO = "elastic-sim-user"
# The oldest torch the agent-side pieces work with: the etcd-v3 backend is found through the
# "torchrun.handlers" entry-point group, read by torch >= 2.5 (rendezvous-etcd-v3/pyproject.toml).
MIN_TORCH = (2, 5)
TESTED_TORCH = "2.13.0"
HOOK_GLOBS = ("elastic_sim_*.py", "elastic-sim.pth")  # the node image's worker hooks: the same list for --image
NODE_SCRIPTS = ("elastic-sim-await-etcd", "elastic-sim-project")
# Pure-Python wheels of the runtime wheelhouse the etcd backends need; each is unpacked into the image's
# site-packages unless that image already has the distribution.
BACKEND_WHEELS = ("python_etcd", "urllib3", "dnspython", "torch_rendezvous_etcd_v3")
# What each kind of fault or check runs inside a node, so `sim doctor --image` can say what an image lacks.
TOOLS = {
    "python3": "process faults (kill-worker, hang, corrupt-checkpoint...) and `sim status`",
    "bash": "the etcd wait before the agent starts (etcd-v2, etcd-v3 backends)",
    "tar": "the project copy (falls back to cp without excludes)",
}
PROBE = r"""
import json, os, shutil, sys, sysconfig, importlib.metadata as md
out = {"python": sys.executable, "version": "%d.%d" % sys.version_info[:2], "uid": os.getuid()}
out["gids"] = sorted({os.getgid(), *os.getgroups()})
site = sysconfig.get_paths()["purelib"]
if site not in sys.path:
    site = next((p for p in sys.path if p.endswith(("site-packages", "dist-packages"))), site)
out["site"] = site
try:
    import torch
    out["torch"] = torch.__version__.split("+")[0]
except Exception as error:
    out["torch_error"] = f"{type(error).__name__}: {error}"
out["dists"] = sorted({(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()})
out["tools"] = {tool: bool(shutil.which(tool)) for tool in TOOLS}
try:
    import pip
    out["pip"] = True
except ImportError:
    out["pip"] = False
print("ELASTIC_SIM_PROBE " + json.dumps(out))
"""


@dataclasses.dataclass(frozen=True)
class ImageProbe:
    image: str
    image_id: str
    user: str
    uid: int  # the uid `user` is in the image
    gids: tuple[int, ...]  # its groups (primary and supplementary): a file's group bits count for these
    python: str
    version: str
    site: str
    torch: str | None
    torch_error: str | None
    dists: tuple[str, ...]
    tools: dict
    pip: bool

    @property
    def missing_tools(self) -> list[str]:
        return [tool for tool, found in self.tools.items() if not found]


def image_user(info: dict | None) -> str:
    """The user an image's processes run as, from its `docker inspect` (no USER: root)."""
    return ((info or {}).get("Config") or {}).get("User") or "root"


def probe_image(docker: Docker, image: str) -> ImageProbe:
    """What is inside `image`: its Python, site-packages, torch, tools (a throwaway container, no network)."""
    info = docker.image_inspect(image)
    if info is None:
        raise UsageError(f"--image {image!r}: no such image on this engine; build or pull it first (`docker images`)")
    script = PROBE.replace("in TOOLS", f"in {list(TOOLS)!r}")
    last = ""
    for python in ("python3", "python"):
        done = docker.run_image(image, python, ["-c", script])
        line = next((x for x in done.stdout.splitlines() if x.startswith("ELASTIC_SIM_PROBE ")), None)
        if line:
            data = json.loads(line.split(" ", 1)[1])
            return ImageProbe(
                image=image,
                image_id=info["Id"],
                user=image_user(info),
                uid=int(data["uid"]),
                gids=tuple(int(g) for g in data["gids"]),
                python=data["python"],
                version=data["version"],
                site=data["site"],
                torch=data.get("torch"),
                torch_error=data.get("torch_error"),
                dists=tuple(data["dists"]),
                tools=data["tools"],
                pip=data["pip"],
            )
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    raise UsageError(f"--image {image!r}: no Python runs in it (python3, python: {last}); the nodes run torchrun")


def check_torch(probe: ImageProbe) -> None:
    if probe.torch is None:
        raise UsageError(f"--image {probe.image!r}: `import torch` fails in it ({probe.torch_error}); install torch")
    release = tuple(int(part) for part in re.findall(r"\d+", probe.torch)[:2])
    if release < MIN_TORCH:
        raise UsageError(
            f"--image {probe.image!r}: torch {probe.torch} is older than elastic-sim supports "
            f"(torch >= {'.'.join(map(str, MIN_TORCH))}); use an image with a newer torch"
        )


class UserImages:
    """The node image a spec runs on: ours, or the team's own, with its requirements layer."""

    def __init__(self, builder: ImageBuilder, docker: Docker):
        self.builder = builder
        self.docker = docker
        self.progress = builder.progress

    def node_image(self, spec: ClusterSpec, node_image: str) -> str:
        if spec.image is None and spec.requirements is None:
            return node_image
        with open(self.builder.cache_dir / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            python, version, torch, where = "/opt/venv/bin/python", "3.11", image_torch_version(), "the node image"
            if spec.image is not None:
                probe = probe_image(self.docker, spec.image)
                check_torch(probe)
                node_image = self.own_image(probe)
                python, version, torch, where = probe.python, probe.version, probe.torch, f"--image {spec.image}"
                if spec.requirements is not None and not probe.pip:
                    raise UsageError(
                        f"--requirements with --image {spec.image!r}: the image has no pip to install them; "
                        "install the packages in your image instead"
                    )
            if spec.requirements is not None:
                check_torch_pin(spec.requirements, torch, where)
                node_image = self.requirements_layer(node_image, Path(spec.requirements), python, version, torch)
        return node_image

    # --- requirements -------------------------------------------------------------------

    def requirements_layer(self, over: str, requirements: Path, python: str, version: str, torch: str) -> str:
        dockerfile = self.builder.images_dir / "requirements" / "Dockerfile"
        content = requirements.read_bytes()
        key = _digest(over, content, dockerfile.read_bytes(), python, platform.machine())
        tag = f"{USER_REPO}/requirements:{key}"
        if self.docker.image_exists(tag):
            self.progress(f"[requirements] up to date ({requirements.name}: {tag})")
            return tag
        wheelhouse = self.wheelhouse(requirements, version, torch)
        with tempfile.TemporaryDirectory(prefix="elastic-sim-requirements-") as tmp:
            ctx = Path(tmp)
            shutil.copy(dockerfile, ctx / "Dockerfile")
            shutil.copytree(wheelhouse, ctx / "wheelhouse", copy_function=_link_or_copy)
            args = {"FROM_IMAGE": over, "PYTHON": python, "RUN_AS": image_user(self.docker.image_inspect(over))}
            self.builder._docker_build("requirements", tag, ctx, args)
        return tag

    def wheelhouse(self, requirements: Path, version: str, torch: str) -> Path:
        """The requirements' wheels, for a CPython `version` Linux image, fetched once by content. torch itself is
        the image's: pinned to it and never kept (a package that needs torch finds it installed)."""
        key = _digest(requirements.read_bytes(), version, torch, platform.machine())
        return fill_once(
            self.builder.cache_dir / f"user-wheelhouse-{key}",
            lambda partial: self._download(requirements, version, torch, partial),
        )

    def _download(self, requirements: Path, version: str, torch: str, partial: Path) -> None:
        self.progress(f"[requirements] pip download of {requirements} (once per content)")
        constraints = partial / ".constraints.txt"
        constraints.write_text(f"torch=={torch}\n")
        pip = [sys.executable, "-m", "pip"]
        argv = [*pip, "download", "-d", str(partial), "-c", str(constraints), *platform_args(version)]
        runtime = next(self.builder.cache_dir.glob("wheelhouse-*"), None)
        if runtime is not None and (runtime / ".complete").exists():
            argv += ["--find-links", str(runtime)]  # torch and its dependencies: already on disk
        self._pip(argv + ["-r", str(requirements)], requirements)
        for sdist in [*partial.glob("*.tar.gz"), *partial.glob("*.zip")]:
            self._pip([*pip, "wheel", "--no-deps", "-w", str(partial), str(sdist)], requirements)
            sdist.unlink()
        for wheel in partial.glob("*.whl"):  # the image's own: installed already
            if re.match(r"^(torch|nvidia_[a-z0-9_]+|triton)-", wheel.name):
                wheel.unlink()
        constraints.unlink()

    def _pip(self, argv: list[str], requirements: Path) -> None:
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line.rstrip())
            if line.startswith(("Saved", "Collecting", "Successfully")):
                self.progress(f"[requirements] {line.rstrip()}")

        code = stream(argv, on_line)
        if code == 0:
            return
        raise UsageError(f"--requirements '{requirements}': {pip_failure(lines, code)}")

    # --- the team's own image -------------------------------------------------------------

    def own_image(self, probe: ImageProbe) -> str:
        images_dir = self.builder.images_dir
        dockerfile = images_dir / "own" / "Dockerfile"
        hooks = hook_files(images_dir / "node")
        scripts = [images_dir / "node" / name for name in NODE_SCRIPTS]
        runtime = self.builder.wheelhouse()
        wheels = [w for w in sorted(runtime.glob("*.whl")) if w.name.split("-")[0].lower() in BACKEND_WHEELS]
        wheels = [w for w in wheels if _dist_name(w) not in probe.dists]
        key = _digest(
            probe.image_id,
            probe.site,
            probe.user,
            str(probe.uid),
            ",".join(map(str, probe.gids)),
            dockerfile.read_bytes(),
            *(p.read_bytes() for p in hooks + scripts),
            *(w.name for w in wheels),
            FAKETIME_PACKAGE,
        )
        tag = f"{USER_REPO}/own:{key}"
        if self.docker.image_exists(tag):
            self.progress(f"[own] up to date ({probe.image}: {tag})")
            return tag
        faketime = self._faketime_library()
        with tempfile.TemporaryDirectory(prefix="elastic-sim-own-") as tmp:
            ctx = Path(tmp)
            shutil.copy(dockerfile, ctx / "Dockerfile")
            (ctx / "site").mkdir()
            for path in hooks:
                shutil.copy(path, ctx / "site" / path.name)
            for wheel in wheels:  # pure-Python wheels: unpacked is installed (their dist-info included)
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(ctx / "site")
            (ctx / "bin").mkdir()
            for path in scripts:
                shutil.copy(path, ctx / "bin" / path.name)
            shutil.copy(faketime, ctx / "libfaketime.so.1")
            args = {
                "USER_IMAGE": probe.image_id,
                "SITE_PACKAGES": probe.site,
                "RUN_AS": probe.user,
                "RUN_UID": str(probe.uid),
                "RUN_GIDS": ",".join(map(str, probe.gids)),
            }
            self.builder._docker_build("own", tag, ctx, args)
        return tag

    def _faketime_library(self) -> Path:
        target = self.builder.cache_dir / "faketime" / "libfaketime.so.1"
        if target.exists():
            return target
        deb = self.builder.debian_package(FAKETIME_PACKAGE, "own")
        with tempfile.TemporaryDirectory(prefix="elastic-sim-faketime-") as tmp:
            subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True, timeout=60)
            found = next(Path(tmp).rglob("libfaketime.so.1"), None)
            if found is None:
                raise ImageBuildError(f"{deb.name}: no libfaketime.so.1 inside")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(found, target)
        return target


def hook_files(node_dir: Path) -> list[Path]:
    """The worker hooks the node image installs (images/node): the same files go into an own image."""
    return sorted({p for pattern in HOOK_GLOBS for p in node_dir.glob(pattern)})


def pip_failure(lines: list[str], code: int) -> str:
    """One line from pip's output: the package it could not resolve, and pip's own reason."""
    errors = [line.removeprefix("ERROR: ").strip() for line in lines if line.startswith("ERROR:")]
    for error in errors:
        match = re.search(r"No matching distribution found for (\S+)", error)
        if match:
            reason = next((e for e in errors if e.startswith("Could not find a version")), error)
            return f"cannot install '{match.group(1)}': pip says: {reason}; fix its name or version"
    if errors:
        return f"pip failed: {errors[0]}"
    last = next((line for line in reversed(lines) if line.strip()), f"exit {code}")
    return f"pip failed (exit {code}): {last.strip()}"


def _dist_name(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def user_row(probe: ImageProbe) -> tuple[bool, str, str]:
    """The image's user: kept in the nodes, where it holds no capability (every one is dropped). A root user
    differs from production there: Kubernetes and `docker run` keep Docker's defaults for root (CHOWN,
    DAC_OVERRIDE, SETUID, ...), so a script that chowns, writes files others own or changes user fails here only."""
    if probe.uid != 0:
        return True, "user", f"{probe.user} (uid {probe.uid}): kept in the nodes, with no capability, as usual for it"
    return (
        False,
        "user",
        f"{probe.user} (uid 0): kept, but with no capability in the nodes (production root keeps Docker's defaults): "
        "a chown, a write to files another user owns or a setuid fails here only; run as a user (USER in your "
        "Dockerfile) or keep the job from needing them",
    )


def doctor_lines(docker: Docker, image: str) -> list[tuple[bool, str, str]]:
    """(ok, check, detail) for `sim doctor --image`: what the image supports, and what it lacks."""
    probe = probe_image(docker, image)
    rows = [(True, "python", f"{probe.python} (Python {probe.version}), site-packages {probe.site}")]
    try:
        check_torch(probe)
        rows.append(
            (True, "torch", f"{probe.torch} (supported: >= {'.'.join(map(str, MIN_TORCH))}; tested {TESTED_TORCH})")
        )
    except UsageError as error:
        rows.append((False, "torch", str(error)))
    for tool, needed_for in TOOLS.items():
        found = probe.tools.get(tool, False)
        rows.append((found, tool, f"found ({needed_for})" if found else f"missing: {needed_for} need it in the image"))
    rows.append((probe.pip, "pip", "found: --requirements works" if probe.pip else "missing: --requirements needs pip"))
    rows.append((True, "network faults", "applied from elastic-sim's helper container: no ip, iptables, tc needed"))
    rows.append(user_row(probe))
    rows.append((True, "clock faults", "libfaketime is added by elastic-sim's layer (glibc images)"))
    rows.append((True, "etcd-v3 backend", "added by elastic-sim's layer"))
    return rows
