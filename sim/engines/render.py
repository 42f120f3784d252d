"""ClusterSpec -> a Compose v2 project (a dict, written as YAML). Pure: no Docker.

The project comes out escaped for Compose's interpolation, every string of it (compose_literal): what
the checks passed (a mount's host path, a command line) is what the engine gets."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from sim.core import labels
from sim.core.faultkinds.clock import CLOCK_OFFSET_FILE
from sim.core.hostpaths import PROJECT_DIR_IN_NODE, PROJECT_EXCLUDES, PROJECT_STAGE_DIR
from sim.core.paths import COMPOSE_TEMPLATE
from sim.core.sidechannel import events_group
from sim.core.spec import USER_SCRIPT_DIR, ClusterSpec, node_name, parse_size
from sim.core.torchrun import rdzv_endpoint, torchrun_argv, torchrun_env
from sim.engines.compose_escape import compose_literal

# The skew-clock fault: Debian's libfaketime (images/node) preloaded into every process of a node, which
# reads the node's clock offset ("+0", "+60s", "-10m") from CLOCK_OFFSET_FILE at most every 2 s. Only the
# wall clock moves, as on a real machine whose clock is off: the monotonic clock is left alone, and so is
# a condition variable's wait on it (without FORCE_MONOTONIC_FIX=0, 0.9.10 turns every such wait into a
# busy loop on glibc >= 2.30), and file times are the kernel's (shared /ckpt).
AWAIT_ETCD = "elastic-sim-await-etcd"  # images/node: runs the agent once etcd is healthy
# images/node: copies the project tree into the node, then runs the agent from that copy.
PROJECT_COPY = "elastic-sim-project"
ETCD_READY_TIMEOUT_S = 120  # Compose's old health wait: 60 probes a second apart, under load longer
FAKETIME_LIB = "/usr/local/lib/faketime/libfaketime.so.1"
CLOCK_ENV = {
    "LD_PRELOAD": FAKETIME_LIB,
    "FAKETIME_TIMESTAMP_FILE": CLOCK_OFFSET_FILE,
    "FAKETIME_CACHE_DURATION": "1",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    "FAKETIME_FORCE_MONOTONIC_FIX": "0",
    "NO_FAKE_STAT": "1",
}


def render(
    spec: ClusterSpec,
    *,
    node_image: str,
    etcd_image: str,
    run_id: str,
    events_dir: Path | None = None,
    template_path: Path = COMPOSE_TEMPLATE,
) -> dict:
    """`events_dir`: the host folder for the workers' side channel (sidechannel.prepare_events_dir);
    None renders nodes without one, so their workers record nothing."""
    template = yaml.safe_load(template_path.read_text())
    node_template = template.pop("x-node")
    common = labels.cluster_labels(spec.name, run_id)
    project = {"name": spec.name, "services": {}, "networks": {}, "volumes": {}}

    if spec.uses_etcd:
        etcd = template["services"]["etcd"]
        etcd["image"] = etcd_image
        etcd["container_name"] = container_name(spec.name, "etcd")
        etcd["labels"] = {**common, labels.ROLE: "etcd", labels.NODE: "etcd"}
        if not spec.etcd_v2_api:  # etcd 3.5 for etcd-v3: no v2 API at all, as on a current cluster
            etcd["command"] = [arg for arg in etcd["command"] if not arg.startswith("--enable-v2")]
        project["services"]["etcd"] = etcd
    for index in range(spec.nodes):
        project["services"][node_name(index)] = render_node(
            spec,
            index,
            node_template,
            node_image=node_image,
            run_id=run_id,
            common_labels=common,
            events_dir=events_dir,
        )

    for net_name, net in template["networks"].items():
        project["networks"][net_name] = {**net, "labels": dict(common)}
    for vol_name, vol in template["volumes"].items():
        if vol_name == "etcd-data" and not spec.uses_etcd:
            continue
        project["volumes"][vol_name] = {**(vol or {}), "labels": dict(common)}
    if spec.ckpt_size is not None:
        # One tmpfs, mounted once on the host and shared by every node (the local driver
        # counts its users): a checkpoint disk that fills up, for the fill-disk fault.
        size = parse_size("--ckpt-size", spec.ckpt_size)
        project["volumes"]["ckpt"]["driver_opts"] = {"type": "tmpfs", "device": "tmpfs", "o": f"size={size}"}
    return compose_literal(project)


def render_node(
    spec: ClusterSpec,
    index: int,
    node_template: dict,
    *,
    node_image: str,
    run_id: str,
    common_labels: dict[str, str],
    events_dir: Path | None = None,
) -> dict:
    name = node_name(index)
    node = copy.deepcopy(node_template)
    node["image"] = node_image
    # torchrun advertises the agent's hostname as the master address, so it must
    # be the name peers resolve through the network's DNS: the service name.
    node["hostname"] = name
    node["container_name"] = container_name(spec.name, name)
    node["labels"] = {**common_labels, labels.ROLE: "node", labels.NODE: name}
    node["command"] = torchrun_argv(spec, index, rdzv_id(spec.name, run_id))
    env = node["environment"]
    env["SIM_CLUSTER"] = spec.name
    env["SIM_NODE"] = name
    env["SIM_INSTRUMENT"] = "1" if spec.instrument else "0"
    env.update(CLOCK_ENV)
    env.update(device_env(spec))
    if events_dir is not None:
        node["volumes"].append({"type": "bind", "source": str(events_dir), "target": env["SIM_EVENTS_DIR"]})
        group = events_group(events_dir)
        if group is not None:  # the harness's own group: the nodes write their records through it
            node["group_add"] = [str(group)]
    else:
        del env["SIM_EVENTS_DIR"]
    env.update(torchrun_env(spec))  # the etcd-v3 password: out of the command line
    env.update(dict(spec.env))
    if spec.script is not None and spec.project_dir is None:
        node["volumes"].append(
            {"type": "bind", "source": str(Path(spec.script).parent), "target": USER_SCRIPT_DIR, "read_only": True}
        )
    for host, target, writable in spec.mounts:
        node["volumes"].append({"type": "bind", "source": host, "target": target, "read_only": not writable})
    # The MiB the node counts for when a later `up` or scale-up weighs what this engine's machine holds.
    node["labels"][labels.MEMORY] = str(spec.counted_memory_mib)
    if spec.memory_limit is not None:
        # No swap: a node over its limit meets the OOM killer, as on a training host without swap.
        node["mem_limit"] = node["memswap_limit"] = spec.memory_limit
    node["pids_limit"] = spec.pids
    if spec.uses_etcd:
        # Compose starts etcd first; the node's agent waits for etcd's health itself (the image's
        # AWAIT_ETCD): sooner than Compose's `service_healthy`, and with no probe for the run's length.
        node["depends_on"] = {"etcd": {"condition": "service_started"}}
        node["command"] = [AWAIT_ETCD, rdzv_endpoint(spec), str(ETCD_READY_TIMEOUT_S), "--", *node["command"]]
    if spec.project_dir is not None:
        # The job's tree, read-only at the staging path, copied at the node's start into a node-local,
        # writable folder that is the job's working folder and on PYTHONPATH, as if baked into the image:
        # relative config paths resolve, relative writes stay on the node. A restarted node keeps its copy.
        node["volumes"].append(
            {"type": "bind", "source": spec.project_dir, "target": PROJECT_STAGE_DIR, "read_only": True}
        )
        node["command"] = [
            PROJECT_COPY,
            PROJECT_STAGE_DIR,
            PROJECT_DIR_IN_NODE,
            ",".join(PROJECT_EXCLUDES),
            "--",
            *node["command"],
        ]
        env.setdefault("PYTHONPATH", PROJECT_DIR_IN_NODE)
    if spec.gpus.enabled:
        device = {"driver": "nvidia", "capabilities": ["gpu"]}
        ids = spec.gpus.device_ids(index)
        if ids is None:
            device["count"] = "all"
        else:
            device["device_ids"] = list(ids)
        node["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
        # NCCL uses shared memory between local ranks; Docker's default 64 MiB is too small.
        node["shm_size"] = "1gb"
        env["SIM_BACKEND"] = "nccl"
    return node


def device_env(spec: ClusterSpec) -> dict[str, str]:
    """The switch of the workers' device emulation (images/node/elastic_sim_devices.py)."""
    if not spec.emulated:
        return {}
    env = {"SIM_DEVICES": "emulated", "SIM_DEVICES_PER_NODE": str(spec.nproc_per_node)}
    env["SIM_FAILURE_TIMING"] = spec.failure_timing
    if spec.script is None:
        env["SIM_BACKEND"] = "gloo"  # the shipped trainer's auto would take the (emulated) nccl path
    return env


def container_name(cluster: str, service: str) -> str:
    return f"{cluster}-{service}"


def rdzv_id(cluster: str, run_id: str) -> str:
    # A fresh id per run: etcd state left by an earlier run can never be joined.
    return f"{cluster}-{run_id}"


def to_yaml(project: dict) -> str:
    header = (
        "# Rendered by elastic-sim (sim/engines/render.py). Plain Compose v2: docker compose -p NAME ps|logs|down\n"
    )
    return header + yaml.safe_dump(project, sort_keys=False, default_flow_style=False, width=1000)
