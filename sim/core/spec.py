"""ClusterSpec: everything `sim up` needs to know, validated once, frozen.

Like torch.distributed.elastic's RendezvousParameters, a spec refuses a bad value
at construction with an error that names the value and the fix, so nothing
downstream (rendering, Docker) ever sees an impossible cluster.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sim.core.capabilities import CAPABILITIES, Capabilities
from sim.core.errors import UsageError
from sim.core.hostpaths import (
    PROJECT_DIR_IN_NODE,
    check_exposure,
    check_mount,
    check_project_dir,
    default_project_dir,
    parse_mount,
)
from sim.core.paths import IMAGES_DIR, ClusterName
from sim.core.sidechannel import compile_progress_regex

RDZV_BACKENDS = ("etcd-v2", "etcd", "etcd-v3", "c10d", "static")
ETCD_BACKENDS = ("etcd-v2", "etcd", "etcd-v3")
# torch's own etcd backends speak etcd's v2 API (python-etcd); etcd-v3 (rendezvous-etcd-v3/) the v3 API.
V2_BACKENDS = ("etcd-v2", "etcd")
# The etcd servers an image can hold: 3.4 serves the v2 API (--enable-v2), 3.5 runs here without it.
ETCD_VERSIONS = ("3.4", "3.5")
ENGINES = tuple(CAPABILITIES)  # what each can do: sim/core/capabilities.py
_CONF_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# torchrun passes --rdzv-conf values on as they are: plain words only, so no shell or Compose character
# (`$`, `;`, quotes, spaces) can reach a node. The timing keys torch reads as whole numbers (FACTS.md).
_CONF_VALUE_RE = re.compile(r"^[A-Za-z0-9._:/@+-]*$")
RDZV_WHOLE_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "read_timeout",
    "timeout",
)
# Memory one node takes (FACTS.md, torch 2.13 CPU): 366 MiB with one worker, 600 MiB with two, so
# about 130 for the agent and 235 per worker. The host keeps a reserve for itself, the engine and etcd.
NODE_AGENT_MIB = 132
NODE_WORKER_MIB = 234
HOST_RESERVE_MIB = 1024
# Each node's pids limit unless --pids says otherwise (compose/cluster.yaml's x-node holds the same figure):
# threads count too, and torchrun with 8 workers and their gloo/NCCL threads uses a few hundred.
DEFAULT_PIDS = 4096
NO_LIMIT = "none"  # --memory none: a node without a memory limit
MAX_GPUS_PER_NODE = 64
# --devices: "emulated" runs CUDA code on CPU and NCCL as gloo in every worker (images/node/elastic_sim_devices.py);
# "gpu" leaves torch as it is (real GPUs with --gpus). --failure-timing: how a collective fails when a peer
# is gone under emulation: "nccl" blocks until the process group's timeout, then aborts; "gloo" fails at once.
DEVICE_MODES = ("emulated", "gpu")
FAILURE_TIMINGS = ("nccl", "gloo")

DEFAULT_NAME = ClusterName("sim")  # a value already made: checked here, once
# Inside the node image; the shipped trainer is baked in (see images/node).
SHIPPED_TRAINER = "/opt/sim/trainer/train.py"
# Mount point of a user script's folder inside every node.
USER_SCRIPT_DIR = "/opt/sim/user"
C10D_PORT = 29400
STATIC_MASTER_PORT = 29500
ETCD_CLIENT_PORT = 2379
# A person at a terminal needs time to inject faults; tests pass their own args.
DEFAULT_TRAINER_ARGS = ("--steps", "600", "--step-time", "0.2", "--ckpt-interval", "10")
# trainer/train.py's own defaults (it cannot import us: it runs in the node image), for runs of
# the shipped trainer whose args lack these flags; tests/unit/test_trainer.py keeps them equal.
SHIPPED_TRAINER_DEFAULTS = {"--steps": 200, "--ckpt-interval": 10}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)i?b?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


@dataclasses.dataclass(frozen=True)
class GpuRequest:
    """`--gpus none|all|N`: per node. N GPUs give node i the ids i*N .. i*N+N-1."""

    mode: str = "none"  # "none" | "all" | "count"
    count: int = 0

    @classmethod
    def parse(cls, text: str | int | None) -> GpuRequest:
        if text is None:
            return cls()
        value = str(text).strip().lower()
        if value in ("", "none", "0"):
            return cls()
        if value == "all":
            return cls("all")
        if value.isdigit() and int(value) > MAX_GPUS_PER_NODE:
            raise UsageError(
                f"--gpus '{text}': more GPUs than any machine has per node; "
                f"use none, all, or a number up to {MAX_GPUS_PER_NODE}"
            )
        if value.isdigit():
            return cls("count", int(value))
        raise UsageError(f"--gpus '{text}': not a GPU request; use none, all, or a number per node such as 1")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def device_ids(self, node_index: int) -> tuple[str, ...] | None:
        """GPU ids for one node, or None when the node gets all of them."""
        if self.mode == "count":
            first = node_index * self.count
            return tuple(str(i) for i in range(first, first + self.count))
        return None

    def __str__(self) -> str:
        return str(self.count) if self.mode == "count" else self.mode


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    name: ClusterName = DEFAULT_NAME  # a plain str is checked and made a ClusterName
    nodes: int = 4
    min_nodes: int = 1
    max_nodes: int | None = None  # None: equal to `nodes`
    nproc_per_node: int = 2
    max_restarts: int = 3
    monitor_interval: float | None = None  # None: torchrun's own default
    rdzv_backend: str = "etcd-v2"
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    script: str | None = None  # host path of a user script; None: the shipped trainer
    script_args: tuple[str, ...] | None = None  # None: DEFAULT_TRAINER_ARGS for the shipped trainer
    gpus: GpuRequest = GpuRequest()
    env: tuple[tuple[str, str], ...] = ()
    env_show: bool = False  # --env-show: the --env values as they are in histories and saved logs, not ***
    instrument: bool = True  # optimizer-step and collective hooks in every worker (images/node)
    progress_regex: str | None = None  # step (and loss) read from the script's own log lines
    # Each node's memory limit (no swap) as given: a size such as "2g", "none" for no limit, or None for the
    # default (default_node_memory_mib). memory_limit: the bytes the nodes get (None: no limit), resolved
    # here once, so spec.json records the figure and a spec read back (a scale-up) keeps it.
    memory: str | None = None
    memory_limit: int | None = None
    pids: int = DEFAULT_PIDS  # each node's pids limit (--pids)
    etcd_version: str | None = None  # None: 3.5 for etcd-v3 (no v2 API at all), else 3.4
    ckpt_size: str | None = (
        None  # /ckpt as a tmpfs of this size, e.g. "64m" (a disk that can fill); None: a plain volume
    )
    engine: str = "compose"
    devices: str | None = None  # DEVICE_MODES; None: emulated without --gpus, gpu with them
    failure_timing: str = "nccl"  # FAILURE_TIMINGS, under emulation
    # The job's own environment (README "Your own environment"): its project tree, copied into every node
    # (None with a script: its git root, else its folder); host folders mounted as they are (host, node
    # path, writable); a requirements file installed in a layer over the node image; the team's own image.
    project_dir: str | None = None
    mounts: tuple[tuple[str, str, bool], ...] = ()
    requirements: str | None = None
    # The pyproject.toml whose `[tool.elastic-sim] requirements` named `requirements` (not given by the user's
    # command): said when it is used, so a script's folder cannot bring its packages in unseen.
    requirements_found_in: str | None = None
    image: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", ClusterName(self.name))  # checked once, here or where it came in
        _positive_int("--nodes", self.nodes)
        _positive_int("--min-nodes", self.min_nodes)
        _positive_int("--nproc-per-node", self.nproc_per_node)
        check_fits_in_memory("--nodes", self.nodes, self.nproc_per_node)
        if self.max_nodes is None:
            object.__setattr__(self, "max_nodes", max(self.nodes, self.min_nodes))
        _positive_int("--max-nodes", self.max_nodes)
        if self.min_nodes > self.max_nodes:
            raise UsageError(
                f"--min-nodes {self.min_nodes} > --max-nodes {self.max_nodes}: the job could never form; "
                "lower --min-nodes or raise --max-nodes"
            )
        if self.min_nodes > self.nodes:
            raise UsageError(
                f"--min-nodes {self.min_nodes} > --nodes {self.nodes}: the job would never start; "
                f"use --nodes {self.min_nodes} or more, or lower --min-nodes"
            )
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts!r}: must be a whole number >= 0")
        if self.monitor_interval is not None and not 0 < self.monitor_interval < math.inf:
            raise UsageError(f"--monitor-interval {self.monitor_interval!r}: must be a number of seconds > 0, e.g. 0.5")
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise UsageError(
                f"--rdzv-backend '{self.rdzv_backend}': unknown backend; use one of {', '.join(RDZV_BACKENDS)}"
            )
        self._check_etcd_version()
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: unknown engine; use one of {', '.join(ENGINES)}")
        if self.rdzv_backend == "static" and not (self.min_nodes == self.max_nodes == self.nodes):
            raise UsageError(
                f"--rdzv-backend static: needs a fixed size, but nodes={self.nodes} min={self.min_nodes} "
                f"max={self.max_nodes}; "
                f"use --min-nodes {self.nodes} --max-nodes {self.nodes}, or an elastic backend (etcd-v2, c10d)"
            )
        for key, value in self.rdzv_conf:
            _check_rdzv_conf(key, value)
        for key, value in self.env:
            if not _CONF_KEY_RE.fullmatch(key):
                raise UsageError(f"--env '{key}': not a valid variable name; use KEY=VALUE, e.g. NCCL_DEBUG=INFO")
            _check_text(f"--env {key}", value)
        for arg in self.script_args or ():
            _check_text("script argument", arg)
        self._check_project()
        if not isinstance(self.gpus, GpuRequest):
            object.__setattr__(self, "gpus", GpuRequest.parse(self.gpus))
        if not isinstance(self.instrument, bool):
            raise UsageError(f"instrument {self.instrument!r}: must be true or false (--no-instrument turns it off)")
        if self.progress_regex is not None:
            compile_progress_regex(self.progress_regex)
        if self.ckpt_size is not None:
            parse_size("--ckpt-size", self.ckpt_size)
        self._check_memory()
        _positive_int("--pids", self.pids)
        self._check_devices()
        self._check_mounts()
        self._check_requirements()
        if self.image is not None and not _IMAGE_RE.fullmatch(str(self.image)):
            raise UsageError(f"--image {self.image!r}: not an image reference; use e.g. --image myteam/train:1.4")
        if self.image is not None or self.requirements is not None:
            self.capabilities.image_builds.require()

    def _check_memory(self) -> None:
        if self.memory is not None and str(self.memory).strip().lower() == NO_LIMIT:
            object.__setattr__(self, "memory", NO_LIMIT)
            object.__setattr__(self, "memory_limit", None)
        elif self.memory is not None:
            if not _SIZE_RE.match(str(self.memory)):
                raise UsageError(
                    f"--memory {self.memory!r}: not a size; use a number and k, m or g, e.g. 2g, or none for no limit"
                )
            object.__setattr__(self, "memory_limit", parse_size("--memory", self.memory))
        elif self.memory_limit is None:
            mib = default_node_memory_mib(max(self.nodes, self.max_nodes), self.nproc_per_node)
            object.__setattr__(self, "memory_limit", mib * 2**20)
        elif not isinstance(self.memory_limit, int) or isinstance(self.memory_limit, bool) or self.memory_limit < 2**20:
            raise UsageError(f"memory_limit {self.memory_limit!r}: must be a number of bytes >= 1048576 (1 MiB)")

    def _check_project(self) -> None:
        """The script, and the project tree it runs in: checked, resolved, never a folder that exposes the host."""
        if self.project_dir is not None:
            object.__setattr__(self, "project_dir", check_project_dir("--project-dir", self.project_dir))
            if self.script is None:
                raise UsageError(
                    f"--project-dir '{self.project_dir}': needs --script, the job's script in it (e.g. train.py)"
                )
            in_project = Path(self.project_dir) / self.script
            if not Path(self.script).is_absolute() and in_project.is_file():
                object.__setattr__(self, "script", str(in_project))
        if self.script is None:
            return
        object.__setattr__(self, "script", check_script_path("--script", self.script))
        script = Path(self.script)
        if self.project_dir is None:
            folder, found = default_project_dir(script)
            check_exposure(
                f"--script '{self.script}': its project folder ({found})",
                folder,
                folder,
                "pass --project-dir with the job's own folder",
            )
            object.__setattr__(self, "project_dir", str(folder))
        elif Path(self.project_dir) not in script.parents:
            raise UsageError(
                f"--script '{self.script}': not inside --project-dir '{self.project_dir}'; "
                "give a script in the project (a path relative to it works)"
            )

    def _check_mounts(self) -> None:
        mounts = []
        for item in self.mounts:
            host, target, writable = parse_mount(item) if isinstance(item, str) else item
            mounts.append(check_mount(str(host), str(target), bool(writable)))
        targets = [target for _, target, _ in mounts]
        for target in targets:
            if targets.count(target) > 1:
                raise UsageError(f"--mount: two mounts at {target} in the node; give each a node path of its own")
        object.__setattr__(self, "mounts", tuple(mounts))

    def _check_requirements(self) -> None:
        if self.requirements is None and self.script is not None:
            found = pyproject_requirements(Path(self.script).parent, self.project_dir)
            if found is not None:
                object.__setattr__(self, "requirements", found[0])
                object.__setattr__(self, "requirements_found_in", found[1])
        if self.requirements is None:
            return
        path = Path(self.requirements).expanduser()
        if not path.is_file():
            raise UsageError(f"--requirements '{self.requirements}': no such file; give a pip requirements file")
        object.__setattr__(self, "requirements", str(path.resolve()))
        if (
            self.image is None
        ):  # the team's own image: its torch is checked once it is probed (sim/engines/userimages.py)
            check_torch_pin(self.requirements, image_torch_version(), "the node image")

    def _check_devices(self) -> None:
        if self.devices is not None and self.devices not in DEVICE_MODES:
            raise UsageError(f"--devices {self.devices!r}: unknown; use emulated (CUDA on CPU) or gpu")
        if self.failure_timing not in FAILURE_TIMINGS:
            raise UsageError(
                f"--failure-timing {self.failure_timing!r}: unknown; "
                "use nccl (block until the timeout) or gloo (fail at once)"
            )
        if self.devices == "emulated" and self.gpus.enabled:
            raise UsageError(
                f"--devices emulated with --gpus {self.gpus}: emulation is for nodes without GPUs; "
                "drop --devices emulated to use the GPUs, or drop --gpus"
            )
        if self.devices is None:
            object.__setattr__(self, "devices", "gpu" if self.gpus.enabled else "emulated")

    @property
    def emulated(self) -> bool:
        """CUDA and NCCL emulated on CPU in the workers."""
        return self.devices == "emulated"

    @property
    def capabilities(self) -> Capabilities:
        """What its engine can do, known from the spec alone (the engine chosen for it may refuse more)."""
        return CAPABILITIES[self.engine]

    @property
    def devices_line(self) -> str:
        """What the banner, status and report say about the devices."""
        if not self.emulated:
            return f"devices: GPUs ({self.gpus} per node)" if self.gpus.enabled else "devices: CPU, not emulated"
        return emulated_devices_line(self.nproc_per_node, self.failure_timing)

    def _check_etcd_version(self) -> None:
        if self.etcd_version is None:
            return
        if self.etcd_version not in ETCD_VERSIONS:
            raise UsageError(
                f"--etcd-version {self.etcd_version!r}: not one this tool builds; use one of {', '.join(ETCD_VERSIONS)}"
            )
        if not self.uses_etcd:
            raise UsageError(
                f"--etcd-version {self.etcd_version}: --rdzv-backend {self.rdzv_backend} runs no etcd; "
                "drop --etcd-version or use an etcd backend (etcd-v2, etcd-v3)"
            )
        if self.rdzv_backend in V2_BACKENDS and self.etcd_version != "3.4":
            raise UsageError(
                f"--etcd-version {self.etcd_version}: --rdzv-backend {self.rdzv_backend} needs etcd's v2 "
                "API, which this etcd runs without; use --etcd-version 3.4 or --rdzv-backend etcd-v3"
            )

    # --- derived values -------------------------------------------------

    @property
    def etcd_server_version(self) -> str:
        """The etcd the cluster runs: 3.5 without the v2 API for etcd-v3, else 3.4 with it."""
        return self.etcd_version or ("3.5" if self.rdzv_backend == "etcd-v3" else "3.4")

    @property
    def etcd_v2_api(self) -> bool:
        return self.etcd_server_version == "3.4"

    @property
    def counted_memory_mib(self) -> int:
        """The MiB one node counts for in a machine's memory (check_room_beside): its --memory limit when
        given (the size the user says a node is), else what a node needs. A default limit is a bound on a
        runaway node, not its use: counted at its limit, one cluster would fill the machine for any other."""
        if self.memory is not None and self.memory_limit is not None:
            return math.ceil(self.memory_limit / 2**20)
        return node_need_mib(self.nproc_per_node)

    @property
    def limits_line(self) -> str:
        """What the banner says about each node's bounds."""
        if self.memory_limit is None:
            memory = "no memory limit"
        else:
            memory = f"memory {math.ceil(self.memory_limit / 2**20)} MiB"
            if self.memory is None:
                memory += " (default: this machine's share; --memory SIZE or none)"
        return f"limits per node: {memory}, {self.pids} pids"

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(node_name(i) for i in range(self.nodes))

    @property
    def uses_etcd(self) -> bool:
        return self.rdzv_backend in ETCD_BACKENDS

    @property
    def script_in_node(self) -> str:
        if self.script is None:
            return SHIPPED_TRAINER
        if self.project_dir is not None:
            return f"{PROJECT_DIR_IN_NODE}/{Path(self.script).relative_to(self.project_dir).as_posix()}"
        return f"{USER_SCRIPT_DIR}/{Path(self.script).name}"

    @property
    def effective_script_args(self) -> tuple[str, ...]:
        if self.script_args is not None:
            return tuple(self.script_args)
        return DEFAULT_TRAINER_ARGS if self.script is None else ()

    def with_nodes(self, nodes: int) -> ClusterSpec:
        return dataclasses.replace(self, nodes=nodes)

    # --- what others may read: the --env values masked -----------------

    def masked_env(self) -> tuple[tuple[str, str], ...]:
        """The --env pairs as histories, reports and saved logs show them: every value `***` but
        those of ENV_SHOWN_KEYS (torch switches the verdict reads), or all of them with --env-show."""
        if self.env_show:
            return self.env
        return mask_pairs(self.env, lambda key: key not in ENV_SHOWN_KEYS)

    def masked_rdzv_conf(self) -> tuple[tuple[str, str], ...]:
        """The --rdzv-conf pairs as others see them: a secret-named key's value (password) `***`."""
        return mask_pairs(self.rdzv_conf, is_secret_key)

    def redact(self, text: str) -> str:
        """`text` with every secret value replaced by `***` (a script that prints its environment, torch's
        line that prints the rdzv conf): what saved logs, the collector and exports show."""
        for value in sorted(self.secret_values(), key=len, reverse=True):
            text = text.replace(value, ENV_MASK)
        return text

    def secret_values(self) -> list[str]:
        """The values masked_env and masked_rdzv_conf hide that are long enough to find in a log (4 characters
        or more: masking "1" or "INFO" everywhere would garble every line). --env-show shows --env values,
        never a password."""
        hidden = [] if self.env_show else [v for k, v in self.env if k not in ENV_SHOWN_KEYS]
        hidden += [v for k, v in self.rdzv_conf if is_secret_key(k)]
        return [v for v in dict.fromkeys(hidden) if len(v) >= ENV_MASK_MIN_CHARS]

    def record_dict(self) -> dict:
        """The spec as the run's history records it: --env values and secret --rdzv-conf values masked
        (spec.json keeps them, 0600)."""
        data = json.loads(self.to_json())
        data["env"] = [list(pair) for pair in self.masked_env()]
        data["rdzv_conf"] = [list(pair) for pair in self.masked_rdzv_conf()]
        return data

    # --- persistence (spec.json in the cluster's state folder) ----------

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["gpus"] = str(self.gpus)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        data = json.loads(text)
        data["gpus"] = GpuRequest.parse(data.get("gpus"))
        for key in ("rdzv_conf", "env"):
            data[key] = tuple(tuple(pair) for pair in data.get(key, ()))
        if data.get("script_args") is not None:
            data["script_args"] = tuple(data["script_args"])
        data["mounts"] = tuple(tuple(mount) for mount in data.get("mounts", ()))
        return cls(**data)


_IMAGE_RE = re.compile(
    r"^[a-z0-9][a-z0-9._/-]*(:[0-9]+/[a-z0-9._/-]+)?(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
    r"|^sha256:[0-9a-f]{64}$"
)
_REQUIREMENT_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def image_torch_version(images_dir: Path = IMAGES_DIR) -> str:
    """The torch the node image holds: the runtime image's `torch==` line (images/runtime/requirements.txt)."""
    for line in (images_dir / "runtime" / "requirements.txt").read_text().splitlines():
        match = re.match(r"^\s*torch\s*==\s*([^\s;#]+)", line)
        if match:
            return match.group(1)
    raise UsageError(f"{images_dir / 'runtime' / 'requirements.txt'}: no torch== line")


def requirement_lines(path: str | Path) -> list[tuple[int, str, str]]:
    """(line number, normalized name, the rest: version specifier and markers) of each requirement line;
    options (-r, --index-url) and comments are left out."""
    found = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split(" #")[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        match = _REQUIREMENT_NAME_RE.match(line)
        if match:
            found.append((number, re.sub(r"[-_.]+", "-", match.group(1)).lower(), match.group(3).strip()))
    return found


def check_torch_pin(path: str, torch_version: str, image: str) -> None:
    """Refuse a torch requirement the image's torch does not meet: installing another torch over it
    is a different job (its own image, --image), not a layer of ours."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for number, name, rest in requirement_lines(path):
        if name != "torch":
            continue
        specifier = rest.split(";")[0].strip()
        try:
            ok = SpecifierSet(specifier).contains(torch_version, prereleases=True)
        except InvalidSpecifier:
            ok = False
        if not ok:
            raise UsageError(
                f"--requirements '{path}' line {number}: torch{specifier} differs from the torch of {image} "
                f"({torch_version}); drop the torch line to use {torch_version}, or bring your own torch in your "
                "own image with --image IMAGE"
            )


def pyproject_requirements(*folders: str | Path | None) -> tuple[str, str] | None:
    """`[tool.elastic-sim] requirements = "..."` in the first pyproject.toml found in `folders`
    (the script's, then the project's), as a path relative to that pyproject.toml: (the file, the pyproject)."""
    import tomllib

    for folder in folders:
        if folder is None:
            continue
        pyproject = Path(folder) / "pyproject.toml"
        if not pyproject.is_file():
            continue
        try:
            data = tomllib.loads(pyproject.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise UsageError(f"{pyproject}: not valid TOML ({error}); fix it or pass --requirements") from None
        value = data.get("tool", {}).get("elastic-sim", {}).get("requirements")
        if value is None:
            continue
        if not isinstance(value, str):
            raise UsageError(f'{pyproject}: [tool.elastic-sim] requirements must be a path, e.g. "requirements.txt"')
        path = pyproject.parent / value
        if not path.is_file():
            raise UsageError(
                f"{pyproject}: [tool.elastic-sim] requirements = {value!r}: no such file; give a path "
                "relative to this pyproject.toml"
            )
        return str(path.resolve()), str(pyproject.resolve())
    return None


def parse_size(flag: str, text: str, least: int = 2**20) -> int:
    """Bytes in "64m", "2g", "512k", "1048576" (binary units: 1k = 1024), at least `least` (1 MiB)."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise UsageError(f"{flag} {text!r}: not a size; use a number and k, m or g, e.g. 64m or 2g")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size < least:
        raise UsageError(f"{flag} {text!r}: below {least >> 10} KiB; use e.g. 64m")
    return size


def node_name(index: int) -> str:
    return f"node{index}"


def parse_kv_list(
    flag: str, text: str | None, example: str = "join_timeout=60,last_call_timeout=5"
) -> tuple[tuple[str, str], ...]:
    """`k=v,k2=v2` -> (("k","v"), ("k2","v2")), order kept, as torchrun takes it."""
    if not text:
        return ()
    pairs = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} '{text}': '{item}' is not key=value; use e.g. {flag} {example}")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def parse_env_item(text: str) -> tuple[str, str]:
    """One `--env KEY=VALUE`: the value is kept whole, commas included (CUDA_VISIBLE_DEVICES=0,1)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--env '{text}': not KEY=VALUE; use e.g. --env NCCL_DEBUG=INFO (once per variable)")
    return key.strip(), value


def _positive_int(flag: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{flag} {value!r}: must be a whole number >= 1")


def _check_rdzv_conf(key: str, value: str) -> None:
    if not _CONF_KEY_RE.fullmatch(key):
        raise UsageError(f"--rdzv-conf key '{key}': not a valid key; use key=value pairs such as join_timeout=60")
    if not _CONF_VALUE_RE.fullmatch(value):
        raise UsageError(
            f"--rdzv-conf {key}={value!r}: not a plain value (letters, digits and ._:/@+- only); use e.g. {key}=60"
        )
    if key in RDZV_WHOLE_KEYS and not value.isdigit():
        raise UsageError(f"--rdzv-conf {key}={value!r}: torch reads it as a whole number of seconds; use e.g. {key}=60")


def _check_text(what: str, value: str) -> None:
    """Refuse text that cannot be written as UTF-8 (undecodable bytes from argv): files we write would fail."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(
            f"{what} {value.encode('utf-8', 'backslashreplace').decode()!r}: not UTF-8 text; give it as UTF-8"
        ) from None


def check_script_path(flag: str, script: str | Path) -> str:
    """The absolute path of a user's training script, after checking it is a readable Python file.
    Its folder is mounted (read-only) into every node, so a system file such as /etc/passwd is refused."""
    path = Path(script)
    if path.is_dir():
        raise UsageError(f"{flag} '{script}': a directory; give the path of a torchrun training script (a .py file)")
    if not path.is_file():
        raise UsageError(f"{flag} '{script}': no such file; give the path of a torchrun training script")
    if path.suffix != ".py":
        raise UsageError(f"{flag} '{script}': not a Python script (.py); give the path of a torchrun training script")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{flag} '{script}': not readable; make it readable (chmod +r) or give another script")
    return str(path.resolve())


def machine_memory_mib() -> int:
    """This machine's physical memory, or this process's cgroup memory limit when lower (a CI job's
    container): the most a cluster here can ever use."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    limit = cgroup_memory_limit_mib()
    return min(physical, limit) if limit else physical


CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def cgroup_memory_limit_mib(paths: Sequence[str] = CGROUP_MEMORY_LIMITS) -> int | None:
    """This process's cgroup memory limit in MiB (v2 memory.max, v1 limit_in_bytes); None: no limit."""
    for path in paths:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # v1 writes a huge number for "no limit", v2 writes "max"
            return int(text) // 2**20
        return None
    return None


def node_need_mib(nproc_per_node: int) -> int:
    """The memory one node of `nproc_per_node` workers needs (the shipped trainer's, measured)."""
    return NODE_AGENT_MIB + NODE_WORKER_MIB * nproc_per_node


def max_nodes_in_memory(nproc_per_node: int, memory_mib: int | None = None) -> int:
    """How many nodes of `nproc_per_node` workers fit in this machine's memory (0: not even one)."""
    memory_mib = machine_memory_mib() if memory_mib is None else memory_mib
    return max(0, (memory_mib - HOST_RESERVE_MIB) // node_need_mib(nproc_per_node))


def default_node_memory_mib(nodes: int, nproc_per_node: int, memory_mib: int | None = None) -> int:
    """Each node's memory limit unless --memory says otherwise: an equal share, among the cluster's
    `nodes` (its most), of this machine's memory less the host's reserve, and never below what a node
    needs. An equal share rather than all the others leave: the same script runs on every node, so a
    leak runs away on all of them at once, and their limits together must still leave the host its
    reserve. The floor keeps a node that works from being killed; a spare beyond `nodes` (a scale-up)
    gets the same limit."""
    memory_mib = machine_memory_mib() if memory_mib is None else memory_mib
    return max(node_need_mib(nproc_per_node), (memory_mib - HOST_RESERVE_MIB) // nodes)


def check_fits_in_memory(flag: str, nodes: int, nproc_per_node: int, memory_mib: int | None = None) -> None:
    """Refuse a node count this machine cannot hold, before anything renders or starts (100000 would hang)."""
    memory_mib = machine_memory_mib() if memory_mib is None else memory_mib
    limit = max_nodes_in_memory(nproc_per_node, memory_mib)
    if nodes > limit:
        per_node = node_need_mib(nproc_per_node)
        fix = f"{flag} {limit}" if limit else f"--nproc-per-node {max_workers_in_memory(memory_mib)}"
        raise UsageError(
            f"{flag} {nodes}: more than this machine can hold ({memory_mib / 1024:.0f} GiB; a node of "
            f"{nproc_per_node} worker(s) needs about {per_node} MiB); use {fix} or fewer"
        )


def check_room_beside(
    flag: str, nodes: int, node_mib: int, others: Mapping[str, Sequence[int]], memory_mib: int | None = None
) -> None:
    """Refuse `nodes` nodes of `node_mib` MiB each that this machine cannot hold beside the running nodes
    of other clusters on its engine (`others`: each cluster's name -> the MiB each of its nodes counts for)."""
    memory_mib = machine_memory_mib() if memory_mib is None else memory_mib
    room = memory_mib - HOST_RESERVE_MIB - sum(sum(mibs) for mibs in others.values())
    fits = max(0, room // node_mib)
    if nodes <= fits:
        return
    names = sorted(others)
    held = ", ".join(f"'{name}' ({_nodes(len(others[name]))}, {sum(others[name])} MiB)" for name in names[:5])
    held += f" and {len(names) - 5} more" if len(names) > 5 else ""
    beside = f" beside the running nodes of other clusters: {held}" if names else ""
    down = f"`python -m sim down {names[0] if len(names) == 1 else 'NAME'}`, or " if names else ""
    fewer = f"{flag} {fits} or fewer" if fits else "fewer nodes"
    raise UsageError(
        f"{flag} {nodes}: {_nodes(nodes)} of {node_mib} MiB do not fit in this machine's {memory_mib} MiB"
        f"{beside} ({max(0, room)} MiB left, {HOST_RESERVE_MIB} MiB kept for the host); "
        f"make room with {down}use {fewer} or a smaller --memory"
    )


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def max_workers_in_memory(memory_mib: int) -> int:
    """The most workers one node can have here."""
    return max(1, (memory_mib - HOST_RESERVE_MIB - NODE_AGENT_MIB) // NODE_WORKER_MIB)


# --env values are masked wherever others read them (histories, reports, saved logs, status): any value
# may be a token or a password, and a key's name says nothing sure about it. These keys' values are
# kept: torch switches the verdict reads back from the run's start record (sim/verdict/diagnoses/registry.py).
ENV_MASK = "***"
ENV_MASK_MIN_CHARS = 4
ENV_SHOWN_KEYS = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE",)
# --rdzv-conf values are settings (timeouts) the verdict reads, but a key named like these holds a secret
# (the etcd-v3 backend's `password`): masked as --env values are.
SECRET_KEY = re.compile(r"pass(word|wd|phrase)?|secret|token|credential|api[_-]?key|private[_-]?key", re.IGNORECASE)
# The etcd-v3 password reaches torchrun in this variable (`password_env=`), not on its command line, which
# every process of the node reads (/proc/PID/cmdline) and torch prints at INFO (sim/core/torchrun.py).
RDZV_PASSWORD_ENV = "SIM_RDZV_PASSWORD"


# A switch about a secret is no secret: allow_plain_password=1 stays readable.
SWITCH_KEY = re.compile(r"^(allow|use|enable|disable|require|no)_", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """A setting whose name says its value is a secret (password, token, api_key...), not a switch about one."""
    return SECRET_KEY.search(key) is not None and not SWITCH_KEY.match(key)


def mask_pairs(pairs: Sequence[tuple[str, str]], masked: Callable[[str], bool]) -> tuple[tuple[str, str], ...]:
    """The one way (key, value) pairs are shown to others: the value of every key `masked` names is ***."""
    return tuple((key, ENV_MASK if masked(key) else value) for key, value in pairs)


def spec_from_options(options: Mapping[str, object], script_args: Sequence[str] | None) -> ClusterSpec:
    """Build a spec from CLI-style options (unset ones take the spec's defaults).

    `script_args` (what followed `--`) go to a user script exactly as given, and to the
    shipped trainer over its defaults. A ClusterSpec built directly keeps its args as given."""
    fields = {f.name for f in dataclasses.fields(ClusterSpec)}
    values = {k: v for k, v in options.items() if k in fields and v is not None}
    if "rdzv_conf" in values and isinstance(values["rdzv_conf"], str):
        values["rdzv_conf"] = parse_kv_list("--rdzv-conf", values["rdzv_conf"])
    if "gpus" in values:
        values["gpus"] = GpuRequest.parse(values["gpus"])
    if "env" in values and isinstance(values["env"], list):
        values["env"] = tuple(parse_env_item(item) for item in values["env"])
    if "mounts" in values:
        values["mounts"] = tuple(parse_mount(m) if isinstance(m, str) else tuple(m) for m in values["mounts"])
    if script_args:
        given = tuple(str(arg) for arg in script_args)
        values["script_args"] = given if values.get("script") else over_trainer_defaults(given)
    return ClusterSpec(**values)


def over_trainer_defaults(given: Sequence[str]) -> tuple[str, ...]:
    """The shipped trainer's args: DEFAULT_TRAINER_ARGS with each flag in `given` replaced
    by the given one, so `-- --steps 400` keeps the step time a person needs to inject faults.
    `--flag=value` is split in two, so readers of the args (the run's start record) find it."""
    split: list[str] = []
    for arg in given:
        flag, sep, value = arg.partition("=")
        split += [flag, value] if sep and arg.startswith("--") else [arg]
    overridden = {arg for arg in split if arg.startswith("--")}
    kept = [
        part
        for flag, value in zip(DEFAULT_TRAINER_ARGS[::2], DEFAULT_TRAINER_ARGS[1::2], strict=True)
        if flag not in overridden
        for part in (flag, value)
    ]
    # The given args come last: argparse keeps the last value, so they win even if abbreviated.
    return (*kept, *split)


def emulated_devices_line(per_node: object, failure_timing: str, script_asked_gloo: bool = False) -> str:
    """The one wording of device emulation: the `up` banner, `sim status`, the report and its picture.
    `script_asked_gloo`: NCCL's timing was asked for, but the workers' process groups were gloo at the script's
    asking, so it held none."""
    if script_asked_gloo:
        timing = "gloo's (at once): the script asked for gloo, so NCCL's timing had no group to hold"
    elif failure_timing == "nccl":
        timing = "NCCL's (a dead peer blocks until the timeout)"
    else:
        timing = "gloo's (at once)"
    return f"devices emulated on CPU ({per_node} per node), NCCL → gloo; failure timing {timing}"
