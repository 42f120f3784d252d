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

import ast
import dataclasses
import fcntl
import functools
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from email.parser import HeaderParser
from pathlib import Path

from sim.core import labels as sim_labels
from sim.core.errors import ImageBuildError, UsageError
from sim.core.hostpaths import PROJECT_EXCLUDES
from sim.core.spec import ClusterSpec, check_torch_pin, image_torch_version
from sim.engines.docker import Docker, ScratchContainer
from sim.engines.images import FAKETIME_PACKAGE, ImageBuilder, _digest, _link_or_copy, fill_once

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
# The requirements' resolve: a throwaway container's folder for our files (requirements, constraints, pip.conf,
# the CA bundle, the job's local packages) and the wheels it makes, copied out as archives.
WORK = "/tmp/elastic-sim-requirements"
CERT_IN_CONTAINER = f"{WORK}/ca-bundle.crt"
ROLE_LABEL, RESOLVER_ROLE = sim_labels.ROLE, "requirements-resolver"
NODE_UID_LABEL, IMAGE_LABEL = sim_labels.NODE_UID, sim_labels.IMAGE
WHEEL_FILE = re.compile(r"^[A-Za-z0-9_.+!-]+\.whl$")
CHECK_SCRIPT = "check_torch_parts.py"  # images/requirements: loads the compiled torch parts at build time
# torch's own shared libraries, as a compiled extension names them in its DT_NEEDED entries.
TORCH_LIBRARY = re.compile(r"^(libtorch|libc10|libcaffe2|libshm)[A-Za-z0-9_]*\.so(\.[0-9.]+)?$")
SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")
# Run in the throwaway container: the torch wheel pip downloaded there, and the shared libraries it holds.
LIST_TORCH_WHEEL = """
import json, os, sys, zipfile
wheel = next(n for n in os.listdir(sys.argv[1]) if n.startswith("torch-") and n.endswith(".whl"))
names = zipfile.ZipFile(os.path.join(sys.argv[1], wheel)).namelist()
libs = sorted({n.rsplit("/", 1)[1] for n in names if n.startswith("torch/lib/") and ".so" in n.rsplit("/", 1)[1]})
print("ELASTIC_SIM_TORCH " + json.dumps({"wheel": wheel, "libs": libs}))
"""
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
    out["torch_build"] = torch.__version__
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    out["torch_libs"] = sorted(n for n in os.listdir(lib) if ".so" in n) if os.path.isdir(lib) else []
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
    torch_build: str | None = None  # torch's full version, its local part included (2.13.0+cpu)
    torch_libs: tuple[str, ...] = ()  # the shared libraries in torch/lib (libtorch_cpu.so, libc10.so, ...)


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
                torch_build=data.get("torch_build"),
                torch_libs=tuple(data.get("torch_libs") or ()),
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
            python, torch, where = "/opt/venv/bin/python", image_torch_version(), "the node image"
            if spec.image is not None:
                probe = probe_image(self.docker, spec.image)
                check_torch(probe)
                node_image = self.own_image(probe)
                python, torch, where = probe.python, probe.torch, f"--image {spec.image}"
                if spec.requirements is not None and not probe.pip:
                    raise UsageError(
                        f"--requirements with --image {spec.image!r}: the image has no pip to install them; "
                        "install the packages in your image instead"
                    )
            if spec.requirements is not None:
                check_torch_pin(spec.requirements, torch, where)
                if spec.requirements_found_in is not None:
                    self.progress(
                        f"[requirements] {spec.requirements}: named by [tool.elastic-sim] requirements in "
                        f"{spec.requirements_found_in} (not given with --requirements); installing its packages"
                    )
                node_image = self.requirements_layer(
                    node_image,
                    Path(spec.requirements),
                    python,
                    torch,
                    labels=sim_labels.cluster_labels(spec.name),
                    own_image=spec.image,
                )
        return node_image

    # --- requirements -------------------------------------------------------------------

    def requirements_layer(
        self,
        over: str,
        requirements: Path,
        python: str,
        torch: str,
        *,
        labels: Mapping[str, str],
        own_image: str | None = None,
    ) -> str:
        """The requirements installed in a layer over `over` (our node image, or the own layer of `own_image`).
        Resolved and downloaded in a throwaway container (no package's build code runs here); a package with
        compiled torch parts built for another torch build than the image's gets the registry's own torch
        build under it (our node image) or is refused (an own image); its parts are loaded at build time."""
        dockerfile = self.builder.images_dir / "requirements" / "Dockerfile"
        check = self.builder.images_dir / "requirements" / CHECK_SCRIPT
        content = requirements.read_bytes()
        sources = pip_sources(host_pip_config())
        local = local_requirements(requirements)
        key = _digest(
            over,
            content,
            dockerfile.read_bytes(),
            check.read_bytes(),
            python,
            platform.machine(),
            sources.key,
            *(_package_digest(path) for _, path in local),
        )
        tag = f"{USER_REPO}/requirements:{key}"
        if self.docker.image_exists(tag):
            self.progress(f"[requirements] up to date ({requirements.name}: {tag})")
            return tag
        wheelhouse = self.wheelhouse(requirements, over, python, torch, labels=labels, sources=sources)
        parts = [found for wheel in sorted(wheelhouse.glob("*.whl")) if (found := torch_parts(wheel)) is not None]
        base = over
        if parts:
            probe = probe_image(self.docker, over)
            unmet = unmet_torch_parts(requirements, parts, probe, own_image)
            if unmet:
                base = self.registry_torch_image(over, probe, unmet, requirements, labels, sources)
        with tempfile.TemporaryDirectory(prefix="elastic-sim-requirements-") as tmp:
            ctx = Path(tmp)
            shutil.copy(dockerfile, ctx / "Dockerfile")
            shutil.copy(check, ctx / CHECK_SCRIPT)
            shutil.copytree(wheelhouse, ctx / "wheelhouse", copy_function=_link_or_copy)
            args = {
                "FROM_IMAGE": base,
                "PYTHON": python,
                "RUN_AS": image_user(self.docker.image_inspect(over)),
                "TORCH_PARTS": json.dumps({part.name: list(part.libraries) for part in parts}) if parts else "",
            }
            self.builder._docker_build("requirements", tag, ctx, args)
        return tag

    def wheelhouse(
        self,
        requirements: Path,
        over: str,
        python: str,
        torch: str,
        *,
        labels: Mapping[str, str],
        sources: PipSources | None = None,
    ) -> Path:
        """The requirements' wheels for image `over`, resolved against what it holds (its torch stays: a package
        that needs torch finds it installed), fetched once by content, in a throwaway container of `over`."""
        sources = sources or pip_sources(host_pip_config())
        local = local_requirements(requirements)
        key = _digest(
            requirements.read_bytes(),
            over,
            python,
            torch,
            platform.machine(),
            sources.key,
            *(_package_digest(path) for _, path in local),
        )
        return fill_once(
            self.builder.cache_dir / f"user-wheelhouse-{key}",
            lambda partial: self._resolve(requirements, over, python, torch, labels, sources, partial),
        )

    def _resolve(
        self,
        requirements: Path,
        over: str,
        python: str,
        torch: str,
        labels: Mapping[str, str],
        sources: PipSources,
        partial: Path,
    ) -> None:
        info = self.docker.image_inspect(over) or {}
        uid = int(((info.get("Config") or {}).get("Labels") or {}).get(NODE_UID_LABEL) or 0)
        self.progress(
            f"[requirements] resolving {requirements} in a throwaway container of {over} "
            "(pip there: no package's build code runs on this machine)"
        )
        if sources.left_out:
            self.progress(f"[requirements] left out (folders of this machine): {', '.join(sources.left_out)}")
        files = {
            f"{WORK}/requirements.txt": in_container_requirements(requirements).encode(),
            f"{WORK}/constraints.txt": sources.constraints_text(torch).encode(),
            f"{WORK}/pip.conf": sources.pip_conf().encode(),
        }
        if sources.cert is not None:
            files[CERT_IN_CONTAINER] = Path(sources.cert).read_bytes()
        trees = {f"{WORK}/local/{number}": path for number, path in local_requirements(requirements)}
        with self.docker.scratch(over, labels={**labels, ROLE_LABEL: RESOLVER_ROLE}, user=str(uid)) as box:
            box.put(files, uid=uid, trees=trees, exclude=PROJECT_EXCLUDES)
            env = sources.env()
            report = f"{WORK}/report.json"
            pip = [python, "-m", "pip"]
            self._pip_in(
                box,
                [*pip, "install", "--dry-run", "--report", report]
                + ["-r", f"{WORK}/requirements.txt", "-c", f"{WORK}/constraints.txt"],
                requirements,
                env,
            )
            box.get_files(WORK, partial, accept=lambda name: name == "report.json")
            urls = report_urls(json.loads((partial / "report.json").read_text()))
            (partial / "report.json").unlink()
            if urls:
                self._pip_in(box, [*pip, "wheel", "--no-deps", "-w", f"{WORK}/wheelhouse", *urls], requirements, env)
                box.get_files(f"{WORK}/wheelhouse", partial, accept=lambda name: bool(WHEEL_FILE.match(name)))

    def _pip_in(self, box: ScratchContainer, argv: list[str], requirements: Path, env: Mapping[str, str]) -> None:
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line.rstrip())
            if line.startswith(("Saved", "Collecting", "Successfully", "Building wheel", "Would install")):
                self.progress(f"[requirements] {line.rstrip()}")

        code = box.run(argv, on_line, env=env)
        if code != 0:
            raise UsageError(f"--requirements '{requirements}': {pip_failure(lines, code)}")

    def registry_torch_image(
        self,
        node_image: str,
        probe: ImageProbe,
        unmet: Sequence[TorchParts],
        requirements: Path,
        labels: Mapping[str, str],
        sources: PipSources,
    ) -> str:
        """Our node image with the registry's own torch build of the image's version in place of ours (the
        build packages with compiled torch parts are made against): downloaded and installed in a throwaway
        container and committed (a multi-GB wheelhouse through a build context would stay in the image as a
        dead layer: the legacy builder has no RUN --mount). Refused, before anything is built, where the
        registry has no such build or its libraries do not cover what the packages need."""
        info = self.docker.image_inspect(node_image) or {}
        version = probe.torch or ""
        # By the node image's tag (a digest of its inputs), not its id: a rebuild of the same inputs (another
        # checkout's build removed it) finds this multi-GB image still current.
        key = _digest(node_image, version, sources.key, platform.machine())
        tag = f"{USER_REPO}/torch:{key}"
        if self.docker.image_exists(tag):
            self.progress(f"[torch] up to date (the registry's torch {version}: {tag})")
            return tag
        needers = ", ".join(f"{part.name} {part.version}" for part in unmet)
        self.progress(
            f"[torch] {needers}: its compiled parts need {', '.join(_missing(unmet, probe.torch_libs))}, which the "
            f"node image's torch {probe.torch_build} lacks: building {tag}, the node image with the registry's own "
            f"torch {version} build (once; about 2.6 GB to download with its CUDA libraries, minutes)"
        )
        python = probe.python
        files = {
            f"{WORK}/pip.conf": sources.pip_conf().encode(),
            f"{WORK}/constraints.txt": sources.constraints_text(None).encode(),
        }
        if sources.cert is not None:
            files[CERT_IN_CONTAINER] = Path(sources.cert).read_bytes()
        lines: list[str] = []

        def on_line(line: str) -> None:
            lines.append(line.rstrip())
            if line.startswith(("Saved", "Collecting", "Successfully", "Installing", "ELASTIC_SIM")):
                self.progress(f"[torch] {line.rstrip()}")

        def run(argv: list[str]) -> int:
            lines.clear()
            return box.run(argv, on_line, env=sources.env())

        refuse = functools.partial(torch_build_refusal, requirements, unmet, probe, "the node image")
        # As root: pip replaces torch in the image's own site-packages (the commit keeps the image's user).
        with self.docker.scratch(node_image, labels={**labels, ROLE_LABEL: RESOLVER_ROLE}, user="0") as box:
            box.put(files)
            pip = [python, "-m", "pip"]
            wheels = f"{WORK}/torch"
            if run([*pip, "download", "--no-deps", "-d", wheels, f"torch==={version}"]) != 0:
                raise UsageError(
                    refuse(f"the registry has no torch {version} build of its own ({pip_failure(lines, 1)})")
                )
            if run([python, "-c", LIST_TORCH_WHEEL, wheels]) != 0:
                raise ImageBuildError(f"[torch] reading the registry's torch wheel failed: {lines[-1:]}")
            listed = json.loads(next(x for x in lines if x.startswith("ELASTIC_SIM_TORCH ")).split(" ", 1)[1])
            still = sorted({lib for part in unmet for lib in part.missing(listed["libs"])})
            if still:
                raise UsageError(refuse(f"the registry's torch {version} lacks them too ({', '.join(still)})"))
            wheel = f"{wheels}/{listed['wheel']}"
            for argv in (
                [*pip, "install", "--no-cache-dir", "--force-reinstall", "--no-deps", wheel],
                [*pip, "install", "--no-cache-dir", "-c", f"{WORK}/constraints.txt", wheel],  # its CUDA libraries
                ["rm", "-rf", WORK],
                [python, "-c", "import torch; print('ELASTIC_SIM torch', torch.__version__, 'loads')"],
            ):
                if run(argv) != 0:
                    raise ImageBuildError(f"[torch] `{' '.join(argv[:4])} ...` failed: {pip_failure(lines, 1)}")
            config = dict(info.get("Config") or {})
            config["Labels"] = {**(config.get("Labels") or {}), IMAGE_LABEL: "torch"}
            box.commit(
                tag, config=config, message=f"elastic-sim: the registry's torch {version} build over {node_image}"
            )
        return tag

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


# --- what the throwaway container's pip sees ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipSources:
    """The host's pip configuration as the requirements' throwaway container gets it: the package indexes it
    can reach (http, https) and this machine's CA bundle and constraint files, copied in; folders of this
    machine (find-links folders, file:// indexes) are left out, and said so: the container reaches the
    index, no host folder."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    cert: str | None = None  # a host file: the CA bundle pip verifies the index with (copied in)
    constraints: tuple[str, ...] = ()  # the constraint files' requirement lines (copied in)
    timeout: str | None = None
    left_out: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """What changes a resolve: the sources, not the CA bundle's path."""
        return json.dumps([self.index_url, self.extra_index_urls, self.find_links, self.constraints])

    def pip_conf(self) -> str:
        lines = ["[global]"]
        if self.index_url:
            lines.append(f"index-url = {self.index_url}")
        for key, values in (
            ("extra-index-url", self.extra_index_urls),
            ("find-links", self.find_links),
            ("trusted-host", self.trusted_hosts),
        ):
            if values:
                lines.append(f"{key} = {' '.join(values)}")
        if self.cert is not None:
            lines.append(f"cert = {CERT_IN_CONTAINER}")
        if self.timeout:
            lines.append(f"timeout = {self.timeout}")
        return "\n".join(lines) + "\n"

    def constraints_text(self, torch: str | None) -> str:
        """The host's constraints, and torch pinned to the image's (None: left as the host's say)."""
        lines = list(self.constraints)
        if torch is not None:
            lines = [line for line in lines if requirement_name(line) != "torch"] + [f"torch=={torch}"]
        return "\n".join(lines) + "\n"

    def env(self) -> dict[str, str]:
        env = {
            "PIP_CONFIG_FILE": f"{WORK}/pip.conf",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            "PIP_ROOT_USER_ACTION": "ignore",
            "HOME": f"{WORK}/home",  # the image's user may have none; sdist builds write there
        }
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        return env


PIP_OPTION_ORDER = (":env:", "download", "install", "wheel", "global")  # pip's own precedence, first wins


def host_pip_config() -> dict[str, str]:
    """`pip config list` of the Python that runs elastic-sim: KEY (section.option) -> value."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
    )
    return parse_pip_config(done.stdout)


def parse_pip_config(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            found[key.strip()] = str(ast.literal_eval(value.strip()))
        except (ValueError, SyntaxError):
            found[key.strip()] = value.strip().strip("'\"")
    return found


def _remote(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def pip_sources(config: Mapping[str, str], read: Callable[[str], str] | None = None) -> PipSources:
    """What the throwaway container's pip sees, from the host's `pip config list` (parse_pip_config)."""
    read = read or (lambda path: Path(path).read_text())

    def option(name: str) -> str | None:
        for section in PIP_OPTION_ORDER:
            value = config.get(f"{section}.{name}")
            if value is not None:
                return value
        return None

    def many(name: str) -> list[str]:
        return (option(name) or "").split()

    left_out: list[str] = []
    index_url = option("index-url")
    if index_url is not None and not _remote(index_url):
        left_out.append(index_url)
        index_url = None
    remote: dict[str, list[str]] = {}
    for name in ("extra-index-url", "find-links"):
        remote[name] = [value for value in many(name) if _remote(value)]
        left_out += [value for value in many(name) if not _remote(value)]
    constraints: list[str] = []
    for path in many("constraint"):
        try:
            text = read(path)
        except OSError:
            continue
        constraints += [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]
    constraints = [line for line in constraints if not line.startswith("-")]  # options, nested files: not here
    cert = option("cert")
    return PipSources(
        index_url=index_url,
        extra_index_urls=tuple(remote["extra-index-url"]),
        find_links=tuple(remote["find-links"]),
        trusted_hosts=tuple(many("trusted-host")),
        cert=cert if cert and Path(cert).is_file() else None,
        constraints=tuple(constraints),
        timeout=option("timeout") or option("default-timeout"),
        left_out=tuple(left_out),
    )


def requirement_name(line: str) -> str:
    match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


# --- the requirements file's own folders --------------------------------------------------------------------

_LOCAL_PREFIXES = ("./", "../", "/", "~", "file:")


def _local_target(line: str, folder: Path) -> tuple[Path, str] | None:
    """(the folder, its extras) of a requirement line that names a package folder of this machine."""
    text = line.split(" #")[0].strip()
    if text.startswith(("-e ", "--editable ", "--editable=")):
        text = re.sub(r"^(-e|--editable)[ =]\s*", "", text)
    if not text.startswith(_LOCAL_PREFIXES) and text not in (".", ".."):
        return None
    match = re.match(r"^(.*?)(\[[^\]]*\])?$", text)
    location, extras = (match.group(1), match.group(2) or "") if match else (text, "")
    if location.startswith("file:"):
        location = re.sub(r"^file:(//)?", "", location)
    path = Path(location).expanduser()
    return (path if path.is_absolute() else folder / path).resolve(), extras


def local_requirements(requirements: Path) -> list[tuple[int, Path]]:
    """(line number, folder) of each line naming a package folder of this machine (`./mypkg`, `-e ../lib`,
    `file:///src/pkg`): copied into the throwaway container, where its build code runs. Relative to the
    requirements file's folder. A nested `-r`/`-c` file or a missing folder is refused in one line."""
    found = []
    for number, raw in enumerate(requirements.read_text().splitlines(), 1):
        line = raw.split(" #")[0].strip()
        if re.match(r"^(-r|-c|--requirement|--constraint)\b", line):
            raise UsageError(
                f"--requirements '{requirements}' line {number}: {line!r} names another file, which the "
                "resolve (in a container of ours) does not see; list its packages in this file"
            )
        target = _local_target(line, requirements.parent)
        if target is None:
            continue
        if not target[0].is_dir():
            raise UsageError(
                f"--requirements '{requirements}' line {number}: {target[0]} is no package folder; "
                "give a folder with a pyproject.toml or setup.py"
            )
        found.append((number, target[0]))
    return found


def _package_digest(folder: Path) -> str:
    """A local package folder's content, as the throwaway container gets it (PROJECT_EXCLUDES left out)."""
    parts: list[bytes | str] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in PROJECT_EXCLUDES)
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                parts += [str(path.relative_to(folder)), path.read_bytes()]
    return _digest(*parts)


def in_container_requirements(requirements: Path) -> str:
    """The requirements file as the throwaway container reads it: each local package folder at its copy
    (WORK/local/LINE), installed as a package (not editable: the node has no source folder to point at)."""
    local = dict(local_requirements(requirements))
    out = []
    for number, raw in enumerate(requirements.read_text().splitlines(), 1):
        if number in local:
            target = _local_target(raw, requirements.parent)
            extras = target[1] if target else ""
            out.append(f"{WORK}/local/{number}{extras}")
        else:
            out.append(raw)
    return "\n".join(out) + "\n"


def report_urls(report: Mapping) -> list[str]:
    """What pip's installation report (`pip install --dry-run --report`) would install, as URLs for `pip
    wheel --no-deps`: each index file with its hash (pip checks it), each local folder as it is."""
    urls = []
    for item in report.get("install") or []:
        info = item.get("download_info") or {}
        url = info.get("url")
        if not url:
            continue
        hashes = (info.get("archive_info") or {}).get("hashes") or {}
        if "sha256" in hashes and "#" not in url:
            url = f"{url}#sha256={hashes['sha256']}"
        urls.append(url)
    return urls


# --- compiled torch parts -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TorchParts:
    """A wheel's compiled parts that link torch's own libraries (a torch C++ extension: torchvision's _C.so):
    they load only on a torch build that has those libraries, of the version the wheel pins."""

    name: str
    version: str
    torch_pin: str | None  # its Requires-Dist on torch (`==2.13.0`), if any
    libraries: Mapping[str, tuple[str, ...]]  # member path -> the torch libraries it needs (DT_NEEDED)

    @property
    def needed(self) -> tuple[str, ...]:
        return tuple(sorted({lib for libs in self.libraries.values() for lib in libs}))

    def missing(self, available: Iterable[str]) -> tuple[str, ...]:
        have = set(available)
        return tuple(lib for lib in self.needed if lib not in have)


def torch_parts(wheel: Path) -> TorchParts | None:
    """The wheel's compiled torch parts, from its metadata: a package that requires torch and ships shared
    objects whose dynamic section names torch's libraries (libtorch*, libc10*). None: it has none."""
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        if metadata_name is None:
            return None
        metadata = HeaderParser().parsestr(archive.read(metadata_name).decode(errors="replace"))
        pins = [
            req
            for req in metadata.get_all("Requires-Dist") or []
            if requirement_name(req) == "torch" and "extra" not in req
        ]
        if not pins:
            return None
        libraries = {}
        for member in archive.namelist():
            if SHARED_OBJECT.search(member.rsplit("/", 1)[-1]):
                needed = tuple(lib for lib in elf_needed(archive.read(member)) if TORCH_LIBRARY.match(lib))
                if needed:
                    libraries[member] = needed
    if not libraries:
        return None
    pin = re.sub(r"^\s*torch\s*", "", pins[0].split(";")[0]).strip().strip("()").strip() or None
    return TorchParts(metadata["Name"] or wheel.name.split("-")[0], metadata["Version"] or "", pin, libraries)


def elf_needed(data: bytes) -> list[str]:
    """The DT_NEEDED entries (shared libraries it links) of a 64-bit little-endian ELF file; [] for anything
    else. Read from the dynamic segment, its string table found through the loadable segments."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for index in range(phnum):
        at = phoff + index * phentsize
        if at + 56 > len(data):
            return []
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, at)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    needed, strtab = [], None
    for at in range(dynamic[0], min(dynamic[0] + dynamic[1], len(data) - 15), 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        if tag == 1:
            needed.append(value)
        elif tag == 5:
            strtab = value
    if strtab is None:
        return []
    base = next((offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        return []
    names = []
    for value in needed:
        end = data.find(b"\0", base + value)
        names.append(data[base + value : end].decode(errors="replace"))
    return names


def unmet_torch_parts(
    requirements: Path, parts: Sequence[TorchParts], probe: ImageProbe, own_image: str | None
) -> list[TorchParts]:
    """The packages whose compiled torch parts the image's torch build cannot load: [] (all load), those that
    need the registry's own torch build under our node image, or, over the team's own image (whose torch is
    theirs to choose), a refusal naming the mismatch and the way out."""
    unmet = [part for part in parts if part.missing(probe.torch_libs)]
    if unmet and own_image is not None:
        raise UsageError(torch_build_refusal(requirements, unmet, probe, f"--image {own_image}"))
    return unmet


def _missing(parts: Iterable[TorchParts], available: Iterable[str]) -> list[str]:
    have = tuple(available)
    return sorted({lib for part in parts for lib in part.missing(have)})


def torch_build_refusal(
    requirements: Path, unmet: Sequence[TorchParts], probe: ImageProbe, where: str, why: str | None = None
) -> str:
    """One line: which packages' compiled parts the image's torch build cannot load, why, and the way out."""
    packages = ", ".join(
        f"{part.name} {part.version}" + (f" (requires torch{part.torch_pin})" if part.torch_pin else "")
        for part in unmet
    )
    lacking = ", ".join(_missing(unmet, probe.torch_libs))
    line = (
        f"--requirements '{requirements}': {packages}: its compiled parts were built for another torch build "
        f"than {where}'s torch {probe.torch_build or probe.torch} (they need {lacking}, which it lacks)"
    )
    if why:
        line += f", and {why}"
    return (
        f"{line}; use --image with an image whose torch is the build they were made for (e.g. the registry's "
        f"torch=={probe.torch}), or a build of them made for {probe.torch_build or probe.torch}"
    )
