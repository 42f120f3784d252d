"""The restricted Pod Security Standard as a pure check of a pod spec: what the namespace label
`pod-security.kubernetes.io/enforce: restricted` admits, with no cluster.

Written from the Kubernetes docs, https://kubernetes.io/docs/concepts/security/pod-security-standards/
(the Baseline table, then the Restricted one, which includes everything from the Baseline), for Linux pods.
Each control is one function; its name is the doc's control. `restricted_problems` runs them all.
"""

from __future__ import annotations

from collections.abc import Iterator

# Baseline, Capabilities: adding any beyond this list is disallowed (the runtime's default set).
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
# Baseline, Sysctls: the "safe" subset.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
# Restricted, Volume Types: only these (plus PersistentVolumes through a claim).
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _containers(pod: dict) -> Iterator[tuple[str, dict]]:
    for field in ("containers", "initContainers", "ephemeralContainers"):
        for index, container in enumerate(pod.get(field, ())):
            yield f"spec.{field}[{index}]", container


def _context(container: dict) -> dict:
    return container.get("securityContext") or {}


def host_process(pod: dict) -> list[str]:
    problems = []
    if (pod.get("securityContext") or {}).get("windowsOptions", {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess: must be false or unset")
    for where, c in _containers(pod):
        if _context(c).get("windowsOptions", {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess: must be false or unset")
    return problems


def host_namespaces(pod: dict) -> list[str]:
    return [f"spec.{f}: must be false or unset" for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]


def privileged_containers(pod: dict) -> list[str]:
    return [
        f"{w}.securityContext.privileged: must be false or unset"
        for w, c in _containers(pod)
        if _context(c).get("privileged")
    ]


def capabilities(pod: dict) -> list[str]:
    """Baseline: nothing added beyond the default set. Restricted: drop ALL; add only NET_BIND_SERVICE."""
    problems = []
    for where, c in _containers(pod):
        caps = _context(c).get("capabilities") or {}
        added = set(caps.get("add") or ())
        if added - BASELINE_CAPABILITIES:
            problems.append(f"{where}: adds capabilities {sorted(added - BASELINE_CAPABILITIES)} (baseline)")
        if added - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds {sorted(added - {'NET_BIND_SERVICE'})}: only NET_BIND_SERVICE may be added")
        if where.startswith("spec.ephemeralContainers"):
            continue
        if "ALL" not in (caps.get("drop") or ()):
            problems.append(f"{where}.securityContext.capabilities.drop: must include ALL")
    return problems


def host_path_volumes(pod: dict) -> list[str]:
    return [
        f"spec.volumes[{i}] ({v.get('name')}): hostPath"
        for i, v in enumerate(pod.get("volumes", ()))
        if "hostPath" in v
    ]


def host_ports(pod: dict) -> list[str]:
    return [
        f"{where}.ports[{i}].hostPort: must be 0 or unset"
        for where, c in _containers(pod)
        for i, port in enumerate(c.get("ports", ()))
        if port.get("hostPort")
    ]


def apparmor(pod: dict, annotations: dict) -> list[str]:
    problems = []
    contexts = [("spec.securityContext", pod.get("securityContext") or {})]
    contexts += [(f"{w}.securityContext", _context(c)) for w, c in _containers(pod)]
    for where, context in contexts:
        kind = (context.get("appArmorProfile") or {}).get("type")
        if kind not in (None, "RuntimeDefault", "Localhost"):
            problems.append(f"{where}.appArmorProfile.type: {kind!r} (RuntimeDefault, Localhost or unset)")
    for key, value in annotations.items():
        if (
            key.startswith("container.apparmor.security.beta.kubernetes.io/")
            and value != "runtime/default"
            and not value.startswith("localhost/")
        ):
            problems.append(f"metadata.annotations[{key}]: {value!r}")
    return problems


def selinux(pod: dict) -> list[str]:
    problems = []
    contexts = [("spec.securityContext", pod.get("securityContext") or {})]
    contexts += [(f"{w}.securityContext", _context(c)) for w, c in _containers(pod)]
    for where, context in contexts:
        options = context.get("seLinuxOptions") or {}
        if options.get("type", "") not in SELINUX_TYPES:
            problems.append(f"{where}.seLinuxOptions.type: {options['type']!r}")
        for field in ("user", "role"):
            if options.get(field):
                problems.append(f"{where}.seLinuxOptions.{field}: must be unset")
    return problems


def proc_mount(pod: dict) -> list[str]:
    return [
        f"{w}.securityContext.procMount: must be Default or unset"
        for w, c in _containers(pod)
        if _context(c).get("procMount", "Default") != "Default"
    ]


def seccomp(pod: dict) -> list[str]:
    """Baseline: never Unconfined. Restricted: RuntimeDefault or Localhost, on the pod or on every container."""
    problems = []
    allowed = ("RuntimeDefault", "Localhost")
    pod_type = ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod_type is not None and pod_type not in allowed:
        problems.append(f"spec.securityContext.seccompProfile.type: {pod_type!r} (RuntimeDefault or Localhost)")
    for where, c in _containers(pod):
        kind = (_context(c).get("seccompProfile") or {}).get("type")
        if kind is not None and kind not in allowed:
            problems.append(f"{where}.securityContext.seccompProfile.type: {kind!r} (RuntimeDefault or Localhost)")
        elif kind is None and pod_type is None:
            problems.append(f"{where}: no seccompProfile, and none on the pod (RuntimeDefault or Localhost)")
    return problems


def sysctls(pod: dict) -> list[str]:
    names = [s.get("name") for s in (pod.get("securityContext") or {}).get("sysctls", ())]
    return [f"spec.securityContext.sysctls: {n} is not a safe sysctl" for n in names if n not in SAFE_SYSCTLS]


def volume_types(pod: dict) -> list[str]:
    problems = []
    for index, volume in enumerate(pod.get("volumes", ())):
        kinds = set(volume) - {"name"}
        if kinds - RESTRICTED_VOLUMES:
            problems.append(
                f"spec.volumes[{index}] ({volume.get('name')}): {sorted(kinds)} is not a restricted volume type"
            )
    return problems


def privilege_escalation(pod: dict) -> list[str]:
    return [
        f"{w}.securityContext.allowPrivilegeEscalation: must be false"
        for w, c in _containers(pod)
        if _context(c).get("allowPrivilegeEscalation") is not False
    ]


def running_as_non_root(pod: dict) -> list[str]:
    """runAsNonRoot true on the pod (and no container sets it false), or on every container."""
    pod_value = (pod.get("securityContext") or {}).get("runAsNonRoot")
    problems = []
    if pod_value is False:
        problems.append("spec.securityContext.runAsNonRoot: must be true")
    for where, c in _containers(pod):
        value = _context(c).get("runAsNonRoot")
        if value is False or (value is None and pod_value is not True):
            problems.append(f"{where}.securityContext.runAsNonRoot: must be true (here or on the pod)")
    return problems


def running_as_non_root_user(pod: dict) -> list[str]:
    problems = []
    if (pod.get("securityContext") or {}).get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser: 0")
    for where, c in _containers(pod):
        if _context(c).get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser: 0")
    return problems


BASELINE = (
    host_process,
    host_namespaces,
    privileged_containers,
    host_path_volumes,
    host_ports,
    selinux,
    proc_mount,
    sysctls,
)
RESTRICTED = (
    *BASELINE,
    capabilities,
    seccomp,
    volume_types,
    privilege_escalation,
    running_as_non_root,
    running_as_non_root_user,
)


def restricted_problems(pod: dict, annotations: dict | None = None, where: str = "pod") -> list[str]:
    """Every way `pod` (a PodSpec) breaks the restricted profile, as 'where: problem'; [] when it is admitted."""
    problems = [p for check in RESTRICTED for p in check(pod)] + apparmor(pod, annotations or {})
    return [f"{where}: {p}" for p in problems]
