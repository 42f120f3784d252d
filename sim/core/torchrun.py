"""The torchrun command line each node runs: a pure function of the spec."""

from __future__ import annotations

from sim.core.spec import (
    C10D_PORT,
    ETCD_CLIENT_PORT,
    RDZV_PASSWORD_ENV,
    STATIC_MASTER_PORT,
    ClusterSpec,
    node_name,
)


def rdzv_endpoint(spec: ClusterSpec) -> str:
    if spec.uses_etcd:
        return f"etcd:{ETCD_CLIENT_PORT}"
    # c10d and static: the first node hosts the store, so it is the job's
    # single point of failure (torch's documented c10d limitation).
    port = C10D_PORT if spec.rdzv_backend == "c10d" else STATIC_MASTER_PORT
    return f"{node_name(0)}:{port}"


def torchrun_argv(spec: ClusterSpec, node_index: int, rdzv_id: str) -> list[str]:
    nnodes = str(spec.min_nodes) if spec.min_nodes == spec.max_nodes else f"{spec.min_nodes}:{spec.max_nodes}"
    argv = [
        "torchrun",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(spec.nproc_per_node),
        "--max-restarts",
        str(spec.max_restarts),
    ]
    if spec.monitor_interval is not None:
        argv += ["--monitor-interval", f"{spec.monitor_interval:g}"]
    if spec.rdzv_backend == "static":
        argv += [
            "--rdzv-backend",
            "static",
            "--node-rank",
            str(node_index),
            "--master-addr",
            node_name(0),
            "--master-port",
            str(STATIC_MASTER_PORT),
        ]
    else:
        argv += [
            "--rdzv-backend",
            spec.rdzv_backend,
            "--rdzv-endpoint",
            rdzv_endpoint(spec),
            "--rdzv-id",
            rdzv_id,
        ]
        if spec.rdzv_conf:
            argv += ["--rdzv-conf", ",".join(_conf_word(k, v) for k, v in spec.rdzv_conf)]
    argv.append(spec.script_in_node)
    argv += list(spec.effective_script_args)
    return argv


def torchrun_env(spec: ClusterSpec) -> dict[str, str]:
    """What torchrun reads from its environment, not its command line: the etcd-v3 password, which
    every process of the node could read in /proc/PID/cmdline and torch prints in its INFO line of the conf."""
    password = dict(spec.rdzv_conf).get("password")
    return {RDZV_PASSWORD_ENV: password} if password else {}


def _conf_word(key: str, value: str) -> str:
    # The etcd-v3 backend reads `password_env` (rendezvous-etcd-v3/config.py); torchrun_env sets the variable.
    return f"password_env={RDZV_PASSWORD_ENV}" if key == "password" else f"{key}={value}"
