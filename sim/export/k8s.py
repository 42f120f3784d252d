"""A scenario (or a `sim up` spec) as Kubernetes objects: the job (a Kubeflow PyTorchJob, or a Kubeflow Trainer
v2 TrainJob and its TrainingRuntime) and a Chaos Mesh Workflow.

One more renderer of the same spec and fault catalog, like the Compose file (sim/engines/render.py) and the
Swarm stack (sim/engines/swarm_render.py). Pure: nothing here talks to a cluster. Field names follow the
training operator's kubeflow.org/v1 types (pkg/apis/kubeflow.org/v1/pytorch_types.go), Kubeflow Trainer's
trainer.kubeflow.org/v1alpha1 types (pkg/apis/trainer/v1alpha1/, JobSet's jobset.x-k8s.io/v1alpha2 template
inside the runtime) and Chaos Mesh's chaos-mesh.org/v1alpha1 types (api/v1alpha1/*_types.go, the Workflow
docs); tests/unit/test_k8s_export.py checks every object against schemas written from them, the core objects
with the kubernetes client, and every pod against the restricted Pod Security Standard.

Least privilege: every pod runs under the restricted profile (non-root, RuntimeDefault seccomp, all
capabilities dropped, no escalation); the workers mount no service-account token; the Workflow's kubectl
Tasks use a ServiceAccount of their own (its token Secret), bound to what their steps run; --env values and
the etcd password are in a Secret (secret.yaml, written 0600), referenced from the pods, never in a pod's spec.

Every mapping that is not exact is a line of the export's notes (NOTES.md beside the YAML); a step that
cannot be mapped at all is listed there too, never dropped without a word. Nothing here ran on a real
Kubernetes cluster.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import yaml

from sim.core.errors import UsageError
from sim.core.faultkinds import (
    ChaosMesh,
    CutFromJob,
    EndsHold,
    ExecTask,
    Held,
    K8sForm,
    LinkChaos,
    Partitioned,
    PodChaos,
    PodDown,
    ScaleJob,
)
from sim.core.faultkinds.network import CHAOS_PARTITION
from sim.core.parse import go_duration
from sim.core.spec import C10D_PORT, ENV_SHOWN_KEYS, ETCD_CLIENT_PORT, ClusterSpec, parse_size
from sim.core.torchrun import torchrun_argv
from sim.faults import nodescripts
from sim.faults.catalog import FAULTS
from sim.faults.targets import ETCD
from sim.scenarios.scenario import Scenario, Step, scenario_spec_options

KUBEFLOW_API = "kubeflow.org/v1"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
CHAOS_API = "chaos-mesh.org/v1alpha1"
PYTORCHJOB, TRAINJOB = "pytorchjob", "trainjob"
TARGETS = (PYTORCHJOB, TRAINJOB)  # the first is the default: the only one with an elastic policy
# The training operator's pod labels (it sets them on every replica's pod, and again on a re-created one).
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
CONTAINER = "pytorch"  # the operator's default container name (PytorchJobDefaultContainerName)
# A TrainJob's pods: JobSet labels each with its JobSet (named as the TrainJob) and replicated job; the trainer's
# replicated job is one Indexed Job of numNodes pods (Trainer sets replicas 1, parallelism numNodes), whose
# pods the Job controller labels with their completion index (Kubernetes 1.28+), the node's rank.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # Trainer finds the trainer's Job by it
TRAINER_NODE = "node"  # Trainer's name of the trainer's replicated job and container (constants.Node)
ETCD_CONTAINER = "etcd"
# The restricted Pod Security Standard's user: the node image's `sim` (images/runtime, sim/core/labels.py
# NODE_UID); etcd and the kubectl Tasks run as other non-root users (distroless's nonroot, bitnami's 1001).
NODE_UID = 1000
ETCD_UID = 65532
KUBECTL_UID = 1001
SECRET_DIR = "/etc/elastic-sim/secret"  # the Secret's etcd password, mounted as a file (password_file)
# Where kubectl (in-cluster) reads its account's token, ca.crt and namespace: the Tasks mount their own
# account's token Secret here, and a container with a mount at this path gets no other token (the
# ServiceAccount admission plugin mounts the pod's account's token only where nothing is mounted there).
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ETCD_PASSWORD_KEY = "etcd-password"
OPERATOR_BACKENDS = ("c10d", "etcd", "etcd-v2")  # the operator's RDZVBackend enum
DEFAULT_IMAGE = "elastic-sim-node:latest"
DEFAULT_ETCD_IMAGES = {"3.4": "quay.io/coreos/etcd:v3.4.34", "3.5": "quay.io/coreos/etcd:v3.5.17"}
DEFAULT_KUBECTL_IMAGE = "bitnami/kubectl:1.30"
DEFAULT_NAMESPACE = "default"
ENOSPC = 28
# A Workflow chaos template's field that embeds its spec, by templateType (Chaos Mesh's EmbedChaos).
EMBED_FIELDS = {
    "PodChaos": "podChaos",
    "NetworkChaos": "networkChaos",
    "StressChaos": "stressChaos",
    "TimeChaos": "timeChaos",
    "IOChaos": "ioChaos",
}
INSTANT_S = 5  # the deadline of a one-shot chaos (a kill): it acts at once, the node ends after this
UNKNOWN_STEP_TIME_S = 1.0  # a user script's step time is unknown: a step trigger assumes this
RECOVERY_GUESS_S = 30.0  # world_size / round triggers: this long after the step before


@dataclasses.dataclass
class K8sExport:
    """The objects by file (a file may hold several), and the notes of every inexact mapping."""

    files: dict[str, list[dict]]
    notes: list[str]
    comments: dict[str, str] = dataclasses.field(default_factory=dict)  # file -> header comment
    # What the target cannot keep, as one line for the terminal (NOTES.md has each in full); None: all kept.
    lost: str | None = None
    not_exported: list[str] = dataclasses.field(default_factory=list)  # steps the target drops, as "steps[i] (fault)"

    def objects(self) -> list[dict]:
        return [obj for objs in self.files.values() for obj in objs]


@dataclasses.dataclass(frozen=True)
class _Options:
    name: str
    namespace: str
    image: str
    etcd_image: str
    kubectl_image: str
    target: str = PYTORCHJOB

    @property
    def container(self) -> str:
        return TRAINER_NODE if self.target == TRAINJOB else CONTAINER

    @property
    def secret(self) -> str:
        return f"{self.name}-secrets"

    @property
    def chaos_account(self) -> str:
        return f"{self.name}-chaos"

    @property
    def chaos_token(self) -> str:
        return f"{self.name}-chaos-token"


# ---------------------------------------------------------------- the job


def export_spec(
    spec: ClusterSpec,
    *,
    image: str = DEFAULT_IMAGE,
    etcd_image: str | None = None,
    kubectl_image: str = DEFAULT_KUBECTL_IMAGE,
    namespace: str = DEFAULT_NAMESPACE,
    target: str = PYTORCHJOB,
) -> K8sExport:
    """The job alone: what `sim up` with the same options would run, as a PyTorchJob (or a TrainJob)."""
    return _export(spec, None, image, etcd_image, kubectl_image, namespace, target)


def export_scenario(
    scenario: Scenario,
    backend: str | None = None,
    *,
    image: str = DEFAULT_IMAGE,
    etcd_image: str | None = None,
    kubectl_image: str = DEFAULT_KUBECTL_IMAGE,
    namespace: str = DEFAULT_NAMESPACE,
    target: str = PYTORCHJOB,
) -> K8sExport:
    """The scenario's cluster on `backend` (default: its first) and its steps as a Chaos Mesh Workflow."""
    backend = backend or scenario.backends[0]
    from sim.core.spec import spec_from_options

    options = scenario_spec_options(scenario, backend)
    options["name"] = _k8s_name(scenario.name)
    spec = spec_from_options(options, None)
    return _export(spec, scenario, image, etcd_image, kubectl_image, namespace, target)


def _k8s_name(name: str) -> str:
    """An RFC 1035 label (a Service's name, and a TrainJob's): lowercase letters, digits and '-', starting with
    a letter (a cluster name may hold '_', or start with a digit)."""
    name = name.replace("_", "-").strip("-")[:40] or "sim"
    return name if name[0].isalpha() else f"sim-{name}"


def _export(
    spec: ClusterSpec,
    scenario: Scenario | None,
    image: str,
    etcd_image: str | None,
    kubectl_image: str,
    namespace: str,
    target: str = PYTORCHJOB,
) -> K8sExport:
    if target not in TARGETS:
        raise UsageError(f"--target {target}: not a target; use {' or '.join(TARGETS)}")
    if spec.rdzv_backend == "static":
        raise UsageError(
            "--rdzv-backend static: a PyTorchJob without elasticPolicy needs a Master replica and per-pod ranks, "
            "which this export does not write; use c10d or an etcd backend"
        )
    name = _k8s_name(spec.name)
    etcd = etcd_image or DEFAULT_ETCD_IMAGES[spec.etcd_server_version]
    opts = _Options(name, namespace, image, etcd, kubectl_image, target)
    operator = "the operator" if target == PYTORCHJOB else "Kubeflow Trainer (JobSet, Indexed Jobs)"
    notes: list[str] = [
        f"Nothing here ran on a real Kubernetes cluster: the objects are checked offline against {operator}'s "
        "and Chaos Mesh's documented fields, and every pod against the restricted Pod Security Standard "
        "(tests/unit/test_k8s_export.py).",
        f"The worker image {image!r} must be in a registry the cluster can pull from (push `sim build`'s "
        "node image and pass --image).",
        f"Every pod runs under the restricted Pod Security profile: runAsNonRoot (workers as uid {NODE_UID}, the "
        "node image's `sim`; another --image needs its own runAsUser), seccomp RuntimeDefault, all capabilities "
        "dropped, no privilege escalation. The workers mount no service-account token.",
        "The workers' side channel (per-step events, sim report's verdict) is not collected: read the pods' "
        f"logs (kubectl logs) and the {'PyTorchJob' if target == PYTORCHJOB else 'TrainJob'}'s conditions instead.",
    ]
    secrets = _Secrets(spec, opts)
    if target == PYTORCHJOB:
        notes.insert(
            2,
            "Restarts: torchrun's own (--max-restarts, elasticPolicy.maxRestarts) restart the workers inside a "
            "pod; a pod that ends is re-created by the operator per the replica's restartPolicy (OnFailure), which "
            "a local run has no counterpart of (a killed node stays down there until started).",
        )
        files: dict[str, list[dict]] = {"job.yaml": [_pytorchjob(spec, opts, notes, secrets)]}
    else:
        files = {"job.yaml": _trainjob(spec, opts, notes, secrets)}
    files["storage.yaml"] = [_ckpt_claim(spec, opts, notes)]
    if spec.uses_etcd:
        files["etcd.yaml"] = _etcd(spec, opts, notes)
    export = K8sExport(files, notes)
    if scenario is not None and scenario.steps:
        _Workflow(spec, scenario, opts, export).build()
    if secrets.data:
        files[SECRET_FILE] = [secrets.secret()]
        notes.append(
            f"Secrets: {', '.join(secrets.data)} are in the Secret {opts.secret} ({SECRET_FILE}, written 0600), "
            "referenced from the pods (secretKeyRef; the etcd password as a file, rdzv-conf password_file); "
            "no pod spec holds a value. Keep the file out of version control, or create the Secret another way."
        )
    if target == TRAINJOB:
        export.lost = _trainjob_lost(spec, export)
    return export


SECRET_FILE = "secret.yaml"


class _Secrets:
    """The values that go in the export's Secret, and how a pod refers to each.

    The project's masking rule (sim/core/spec.py ENV_SHOWN_KEYS, masked_env): every --env value may be a
    token or a password, and a key's name says nothing sure about it, so every --env value but those few
    torch switches goes in the Secret; so does an etcd-v3 password from --rdzv-conf."""

    def __init__(self, spec: ClusterSpec, opts: _Options):
        self.opts = opts
        self.data: dict[str, str] = {key: value for key, value in spec.env if key not in ENV_SHOWN_KEYS}
        self.password = dict(spec.rdzv_conf).get("password")
        if self.password is not None:
            self.data[ETCD_PASSWORD_KEY] = self.password

    def env_entry(self, key: str, value: str) -> dict:
        if key in self.data and key != ETCD_PASSWORD_KEY:
            ref = {"name": self.opts.secret, "key": key}
            return {"name": key, "valueFrom": {"secretKeyRef": ref}}
        return {"name": key, "value": value}

    def rdzv_conf(self, conf: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        """--rdzv-conf with the password replaced by the file the Secret mounts (rendezvous-etcd-v3 reads
        password_file), so neither the command line nor elasticPolicy holds it."""
        return tuple(
            ("password_file", f"{SECRET_DIR}/{ETCD_PASSWORD_KEY}") if key == "password" else (key, value)
            for key, value in conf
        )

    def mount(self, pod_spec: dict, container: dict) -> None:
        if self.password is None:
            return
        items = [{"key": ETCD_PASSWORD_KEY, "path": ETCD_PASSWORD_KEY}]
        # 0440 with the pod's fsGroup: readable by the workers' group, by nobody else.
        source = {"secretName": self.opts.secret, "items": items, "defaultMode": 0o440}
        pod_spec["volumes"].append({"name": "secret", "secret": source})
        container["volumeMounts"].append({"name": "secret", "mountPath": SECRET_DIR, "readOnly": True})

    def secret(self) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": self.opts.secret, "namespace": self.opts.namespace, "labels": _part_of()},
            "type": "Opaque",
            "stringData": dict(self.data),
        }


def _part_of() -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "sim"}


def _pod_env(spec: ClusterSpec, secrets: _Secrets) -> list[dict]:
    env = {
        "LOGLEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "SIM_CKPT_DIR": "/ckpt",
        "SIM_CLUSTER": spec.name,
        "SIM_INSTRUMENT": "1" if spec.instrument else "0",
    }
    if spec.gpus.enabled:
        env["SIM_BACKEND"] = "nccl"
    env.update(dict(spec.env))
    return [secrets.env_entry(key, str(value)) for key, value in env.items()]


def rdzv_host(spec: ClusterSpec, name: str, target: str = PYTORCHJOB) -> str:
    """The rendezvous endpoint's host in the cluster: the etcd Service, or node 0 (c10d): the operator's
    Service of worker 0, or the pod of index 0 under JobSet's headless Service (named as the JobSet)."""
    if spec.uses_etcd:
        return f"{name}-etcd"
    return f"{name}-worker-0" if target == PYTORCHJOB else f"{name}-{TRAINER_NODE}-0-0.{name}"


def container_argv(spec: ClusterSpec, name: str, target: str = PYTORCHJOB) -> list[str]:
    """sim.core.torchrun's command line with the cluster's endpoint: the operator's (or Trainer's) PET_*
    settings are defaults that an explicit flag wins over, so etcd-v3 (unknown to both) works too."""
    argv = torchrun_argv(spec, 0, rdzv_id=name)
    port = ETCD_CLIENT_PORT if spec.uses_etcd else C10D_PORT
    endpoint = argv.index("--rdzv-endpoint") + 1
    argv[endpoint] = f"{rdzv_host(spec, name, target)}:{port}"
    return argv


def restricted_pod(pod_spec: dict, uid: int) -> dict:
    """`pod_spec` under the restricted Pod Security Standard: non-root as `uid` (its group too, and the
    volumes' group), the runtime's default seccomp profile; each container drops every capability and may
    not escalate."""
    pod_spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in pod_spec["containers"]:
        container["securityContext"] = _restricted_container()
    return pod_spec


def _restricted_container(uid: int | None = None) -> dict:
    """A container's part of the restricted profile; with `uid`, the pod's part too (for a pod whose spec we
    do not write: a Chaos Mesh Task's)."""
    context: dict = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if uid is not None:
        context.update(runAsNonRoot=True, runAsUser=uid, runAsGroup=uid, seccompProfile={"type": "RuntimeDefault"})
    return context


def _worker_pod(spec: ClusterSpec, opts: _Options, notes: list[str], secrets: _Secrets) -> dict:
    """The worker's pod spec, the same for both targets but for the container's name."""
    if secrets.password is not None:
        spec = dataclasses.replace(spec, rdzv_conf=secrets.rdzv_conf(spec.rdzv_conf))
    argv = container_argv(spec, opts.name, opts.target)
    container: dict = {
        "name": opts.container,
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "command": argv[:1],
        "args": argv[1:],
        "env": _pod_env(spec, secrets),
        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
    }
    resources: dict = {}
    if spec.gpus.enabled:
        count = spec.gpus.count if spec.gpus.mode == "count" else 1
        resources["limits"] = {"nvidia.com/gpu": str(count)}
        if spec.gpus.mode == "all":
            notes.append("--gpus all: Kubernetes asks for a number of GPUs; the export asks for 1 per pod.")
    if spec.memory is not None and spec.memory_limit is not None:
        # A --memory given only: the default is a share of this machine, which says nothing of the cluster's.
        resources.setdefault("limits", {})["memory"] = str(spec.memory_limit)
    if resources:
        container["resources"] = resources
    if spec.uses_etcd:
        # The node image's wait for etcd's health, as in a local run.
        container["command"] = ["elastic-sim-await-etcd"]
        container["args"] = [f"{rdzv_host(spec, opts.name)}:{ETCD_CLIENT_PORT}", "120", "--", *argv]
    if spec.script is not None:
        notes.append(
            f"--script {spec.script}: a local file; the export runs {spec.script_in_node} in the image, so the "
            "script must be baked into the image (or mounted from a ConfigMap) at that path."
        )
    pod_spec: dict = {
        # Training code needs no Kubernetes API: no token for it to use (the Tasks' account is their own).
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": f"{opts.name}-ckpt"}}],
    }
    if spec.gpus.enabled:
        # NCCL uses shared memory between local ranks, as the local run's shm_size.
        pod_spec["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    secrets.mount(pod_spec, container)
    # No capability, no escalation, as on a local run (whose network helper alone holds NET_ADMIN); Chaos
    # Mesh's daemon applies network, time and I/O faults from outside the pod.
    return restricted_pod(pod_spec, NODE_UID)


def _pytorchjob(spec: ClusterSpec, opts: _Options, notes: list[str], secrets: _Secrets) -> dict:
    policy: dict = {
        "minReplicas": spec.min_nodes,
        "maxReplicas": spec.max_nodes,
        "maxRestarts": spec.max_restarts,
        "nProcPerNode": spec.nproc_per_node,
        "rdzvId": opts.name,
        "rdzvHost": rdzv_host(spec, opts.name),
        "rdzvPort": ETCD_CLIENT_PORT if spec.uses_etcd else C10D_PORT,
    }
    if spec.rdzv_backend in OPERATOR_BACKENDS:
        policy["rdzvBackend"] = spec.rdzv_backend
    else:
        notes.append(
            f"rdzvBackend: the operator knows {', '.join(OPERATOR_BACKENDS)}, not {spec.rdzv_backend}; the "
            f"container's own torchrun command passes --rdzv-backend {spec.rdzv_backend} (the node image holds "
            "the backend), and elasticPolicy names no backend."
        )
    if spec.rdzv_conf:
        conf = secrets.rdzv_conf(spec.rdzv_conf)
        policy["rdzvConf"] = [{"key": key, "value": value} for key, value in conf]
    pod_spec = _worker_pod(spec, opts, notes, secrets)
    if spec.nodes != spec.max_nodes:
        notes.append(
            f"replicas: {spec.nodes} pods start (the local cluster's --nodes) of maxReplicas {spec.max_nodes}; "
            f"`kubectl scale pytorchjob/{opts.name} --replicas=N` adds or removes workers."
        )
    return {
        "apiVersion": KUBEFLOW_API,
        "kind": "PyTorchJob",
        "metadata": {"name": opts.name, "namespace": opts.namespace, "labels": _part_of()},
        "spec": {
            "elasticPolicy": policy,
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": spec.nodes,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": pod_spec},
                }
            },
        },
    }


# A Job of the TrainJob fails after this many pod failures (a failed container restarted in place counts);
# JobSet then re-creates every Job, up to JOBSET_RESTARTS times, before the TrainJob fails.
JOB_BACKOFF_LIMIT = 100
JOBSET_RESTARTS = 3


def trainjob_nodes(spec: ClusterSpec) -> int:
    """Trainer v2 has no elastic policy: a fixed node count. --nnodes MIN:MAX becomes MAX; a fixed --nnodes
    keeps --nodes (spare nodes included, as locally)."""
    return spec.max_nodes if spec.min_nodes != spec.max_nodes else spec.nodes


def _trainjob(spec: ClusterSpec, opts: _Options, notes: list[str], secrets: _Secrets) -> list[dict]:
    """Our TrainingRuntime (the job needs one: the stock torch-distributed runtime has no /ckpt claim, no
    etcd rendezvous, no restricted pod) and the TrainJob that refers to it."""
    nodes = trainjob_nodes(spec)
    pod_spec = _worker_pod(spec, opts, notes, secrets)
    pod_spec["restartPolicy"] = "OnFailure"
    runtime = {
        "apiVersion": TRAINER_API,
        "kind": "TrainingRuntime",
        "metadata": {
            "name": opts.name,
            "namespace": opts.namespace,
            # The torch framework label, as the shipped torch-distributed ClusterTrainingRuntime carries.
            "labels": {"trainer.kubeflow.org/framework": "torch", **_part_of()},
        },
        "spec": {
            "mlPolicy": {"numNodes": nodes, "torch": {}},
            "template": {
                "spec": {
                    "failurePolicy": {"maxRestarts": JOBSET_RESTARTS},
                    "replicatedJobs": [
                        {
                            "name": TRAINER_NODE,
                            "replicas": 1,
                            "template": {
                                "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                                "spec": {
                                    "backoffLimit": JOB_BACKOFF_LIMIT,
                                    "template": {"metadata": {"labels": _part_of()}, "spec": pod_spec},
                                },
                            },
                        }
                    ],
                }
            },
        },
    }
    job = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": opts.name, "namespace": opts.namespace, "labels": _part_of()},
        "spec": {
            "runtimeRef": {"name": opts.name, "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"},
            "trainer": {"numNodes": nodes, "numProcPerNode": spec.nproc_per_node},
        },
    }
    notes.append(
        f"TrainJob (Kubeflow Trainer v2, {TRAINER_API}) with a TrainingRuntime of ours, {opts.name}: the stock "
        "torch-distributed ClusterTrainingRuntime has no /ckpt claim and no restricted pod. The container's own "
        "torchrun command carries the rendezvous (backend, endpoint, --nnodes); Trainer's PET_* settings "
        "(PET_NNODES, PET_MASTER_ADDR, ...) are defaults it overrides."
    )
    notes.append(
        "Restarts: torchrun's own (--max-restarts) restart the workers inside a pod; a failed container restarts "
        f"in place (restartPolicy OnFailure) and a deleted pod is re-created by its Indexed Job, up to "
        f"backoffLimit {JOB_BACKOFF_LIMIT} failures; then JobSet re-creates every pod (failurePolicy maxRestarts "
        f"{JOBSET_RESTARTS}) before the TrainJob fails. A killed local node stays down until started."
    )
    return [runtime, job]


def _trainjob_lost(spec: ClusterSpec, export: K8sExport) -> str:
    """What Trainer v2 cannot keep: a note for NOTES.md (each thing in full) and the terminal's one line."""
    nodes = trainjob_nodes(spec)
    nnodes = f"{spec.min_nodes}:{spec.max_nodes}"
    if spec.min_nodes != spec.max_nodes:
        count = f"--nnodes {nnodes} becomes numNodes: {nodes}"
        if spec.nodes != nodes:
            count += f" (the local run starts --nodes {spec.nodes})"
        inside = (
            f"; torchrun keeps --nnodes {nnodes} in its command, so a round still forms with {spec.min_nodes} to "
            f"{spec.max_nodes} of the {nodes} pods while some are down and re-created"
        )
    else:
        count, inside = f"numNodes: {nodes} (--nodes)", ""
    dropped = ", ".join(export.not_exported) or "none in this export"
    export.notes.append(
        "Elasticity: Kubeflow Trainer v2 has no elastic policy (its ElasticPolicy API was removed in v2.2.0): the "
        f"node count is fixed, {count}{inside}; no `kubectl scale`, no min/max replicas. Scale faults are not "
        f"exported: {dropped}. The legacy PyTorchJob target (--target pytorchjob, the default while it is the "
        "only elastic one; Kubeflow Training Operator v1.9) keeps elasticity: elasticPolicy minReplicas/"
        "maxReplicas and `kubectl scale pytorchjob/NAME --replicas=N`, which its scale faults use."
    )
    return (
        f"trainjob: Trainer v2 has no elastic policy: node count fixed, {count}; scale faults not exported: "
        f"{dropped}; --target pytorchjob (the default) keeps elasticity. See NOTES.md."
    )


def _ckpt_claim(spec: ClusterSpec, opts: _Options, notes: list[str]) -> dict:
    size = spec.ckpt_size or "1g"
    notes.append(
        f"/ckpt: a PersistentVolumeClaim {opts.name}-ckpt (ReadWriteMany, {size}) shared by every worker pod, "
        "as the local run's shared volume; the cluster needs a storage class that serves ReadWriteMany (NFS, "
        f"CephFS), writable by uid {NODE_UID} (the pods' fsGroup {NODE_UID} makes it so where the volume "
        "type supports ownership changes; NFS does not)."
    )
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{opts.name}-ckpt", "namespace": opts.namespace},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": _quantity(size)}}},
    }


def _quantity(size: str) -> str:
    """A size as typed (64m, 2g) as a Kubernetes quantity in binary units (64Mi, 2Gi)."""
    return f"{parse_size('size', size, least=0) >> 20}Mi"


def _etcd(spec: ClusterSpec, opts: _Options, notes: list[str]) -> list[dict]:
    labels = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/instance": opts.name}
    host = f"{opts.name}-etcd"
    command = [
        "etcd",
        "--name=etcd",
        "--data-dir=/var/lib/etcd/data",
        f"--listen-client-urls=http://0.0.0.0:{ETCD_CLIENT_PORT}",
        f"--advertise-client-urls=http://{host}:{ETCD_CLIENT_PORT}",
    ]
    if spec.etcd_v2_api:
        command.append("--enable-v2=true")
    notes.append(
        "etcd: one member, data in an emptyDir: a restarted container keeps it (etcd-restart), a deleted pod "
        "loses it (etcd-wipe), as a local run's etcd volume."
    )
    if "password" in dict(spec.rdzv_conf):
        notes.append(
            "etcd auth: the workers send the Secret's password, but this one-member etcd has no users: enable "
            "auth on it (etcdctl user add, auth enable), or point the job at your own etcd."
        )
    pod_spec = {
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": ETCD_CONTAINER,
                "image": opts.etcd_image,
                "command": command,
                "ports": [{"containerPort": ETCD_CLIENT_PORT, "name": "client"}],
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
            }
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": host, "namespace": opts.namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": restricted_pod(pod_spec, ETCD_UID)},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": host, "namespace": opts.namespace, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "client", "port": ETCD_CLIENT_PORT, "targetPort": "client"}]},
    }
    return [deployment, service]


# ---------------------------------------------------------------- the faults

# nodescripts' way to find a node's torchrun workers (their environment names a local rank and a run id).
_WORKERS = "def workers():" + nodescripts.KILL_IN_WRITE.split("def workers():")[1].split("def writing")[0]
# A worker process of the pod it runs in, picked as the nemesis picks one, then signalled (argv: SIGNAL
# RANK LOCAL_RANK SEED; -1: any). Exit 3 when this pod has no such worker, so the task tries the next pod.
_SIGNAL_WORKER = (
    "import json, os, random, signal, sys\n"
    + _WORKERS
    + r"""
sig, rank, local_rank, seed = (int(a) for a in sys.argv[1:5])
def env(pid):
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            return dict(i.split(b'=', 1) for i in f.read().split(b'\0') if b'=' in i)
    except OSError:
        return {}
pids = [p for p in workers()
        if (rank < 0 or env(p).get(b'RANK') == str(rank).encode())
        and (local_rank < 0 or env(p).get(b'LOCAL_RANK') == str(local_rank).encode())]
if not pids:
    sys.exit(print('no such worker in this pod', file=sys.stderr) or 3)
pid = random.Random(seed).choice(sorted(pids))
os.kill(pid, sig)
if sig == signal.SIGSTOP:
    open('/tmp/elastic-sim-stopped', 'a').write(f'{pid}\n')
print(json.dumps({'pid': pid, 'rank': int(env(pid).get(b'RANK', b'-1')), 'signal': sig}))
"""
)
# Continue the workers stopped by _SIGNAL_WORKER (resume-worker, the end of a hang-worker hold).
_CONT_WORKERS = r"""
import os, signal
try:
    pids = {int(p) for p in open('/tmp/elastic-sim-stopped').read().split()}
except OSError:
    pids = set()
for pid in pids:
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass
open('/tmp/elastic-sim-stopped', 'w').close()
print(sorted(pids))
"""
# Every process of the container but PID 1 (the kernel ignores SIGSTOP sent to a namespace's init)
# and this one: pause / unpause (argv: SIGNAL).
_SIGNAL_ALL = r"""
import os, sys
sig, me = int(sys.argv[1]), os.getpid()
done = []
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) not in (1, me, os.getppid()):
        try:
            os.kill(int(p), sig)
            done.append(int(p))
        except OSError:
            pass
print(done)
"""
# hang-collectives: the node image's instrumentation holds a worker before its next collective while
# nodescripts.COLLECTIVE_HANG_FILE exists for its pid (argv: SEED).
_STALL_WORKER = (
    "import json, os, random, sys\n"
    + _WORKERS
    + r"""
pids = sorted(workers())
if not pids:
    sys.exit(print('no worker in this pod', file=sys.stderr) or 3)
pid = random.Random(int(sys.argv[1])).choice(pids)
open(HANG.format(pid=pid), 'a').close()
print(json.dumps({'pid': pid}))
""".replace("HANG", repr(nodescripts.COLLECTIVE_HANG_FILE))
)
# The scripts a kind's ExecTask names (sim/core/faultkinds), by name.
POD_SCRIPTS = {
    "signal-worker": _SIGNAL_WORKER,
    "continue-workers": _CONT_WORKERS,
    "stall-worker": _STALL_WORKER,
    "signal-all": _SIGNAL_ALL,
    "corrupt": nodescripts.CORRUPT,
    "kill-in-write": nodescripts.KILL_IN_WRITE,
}


class _Workflow:
    def __init__(self, spec: ClusterSpec, scenario: Scenario, opts: _Options, export: K8sExport):
        self.spec, self.scenario, self.opts, self.export = spec, scenario, opts, export
        self.step_time = _step_time(spec)
        self.templates: list[dict] = []
        self.branches: list[str] = []
        self.comments: list[str] = []
        self.seed = scenario.seed if scenario.seed is not None else 0
        self.needs_exec = False  # a Task runs kubectl exec: the Tasks' account lists pods and execs into them
        self.needs_scale = False  # a Task runs kubectl scale on the PyTorchJob
        self.container = opts.container
        self.index_label = REPLICA_INDEX_LABEL if opts.target == PYTORCHJOB else COMPLETION_INDEX_LABEL
        self.recreator = "the operator" if opts.target == PYTORCHJOB else "the pod's Indexed Job"

    def note(self, text: str) -> None:
        if text not in self.export.notes:
            self.export.notes.append(text)

    # --- when each step fires, in seconds since training started

    def schedule(self) -> list[tuple[float, Step, int]]:
        timeline: list[tuple[float, Step, int]] = []
        previous = 0.0
        for index, step in enumerate(self.scenario.steps):
            at = self._time_of(step, previous, index)
            for repeat in range(step.repeat_times):
                fired = at + repeat * (step.repeat_every_s or 0.0)
                timeline.append((fired, step, index))
            previous = timeline[-1][0] + (step.duration_s or 0.0)
        return timeline

    def _time_of(self, step: Step, previous: float, index: int) -> float:
        kind, value = step.trigger.kind, step.trigger.value
        where = f"steps[{index}] ({step.fault}, line {step.line})"
        if kind == "time":
            return float(value)
        if kind == "after":
            return previous + float(value)
        if self._dropped(step):
            # Its time still places the steps after it; a note on its trigger would speak of nothing exported.
            return max(value * self.step_time, previous) if kind == "step" else previous + RECOVERY_GUESS_S
        if kind == "step":
            at = value * self.step_time
            self.note(
                f"{where}: `at: {{step: {value}}}` became a time trigger at {at:g}s ({value} steps x "
                f"{self.step_time:g}s per step, counted from the first step); Chaos Mesh cannot watch the "
                "job's step, and a restart that resumes from a checkpoint reaches that step later."
            )
            self.comments.append(f"{where}: step {value} -> {at:g}s after training starts (a time trigger)")
            return max(at, previous)
        at = previous + RECOVERY_GUESS_S
        self.note(
            f"{where}: `at: {{{kind}: {value}}}` became a time trigger {RECOVERY_GUESS_S:g}s after the step before "
            f"({at:g}s); Chaos Mesh cannot watch the job's {kind.replace('_', ' ')}."
        )
        self.comments.append(f"{where}: {kind} {value} -> {at:g}s after training starts (a guess)")
        return at

    def _dropped(self, step: Step) -> bool:
        """A step this target cannot export at all: a scale on a TrainJob (Trainer v2 has no elastic policy)."""
        return FAULTS[step.fault].kind.changes_node_count and self.opts.target == TRAINJOB

    def build(self) -> None:
        timeline = self.schedule()
        held_until = self._holds(timeline)
        for number, (at, step, index) in enumerate(timeline):
            name = f"s{number:02d}-{step.fault}"
            hold = held_until.get(number)
            made = self._step(name, step, index, hold)
            if not made:
                continue
            suspend = {"name": f"{name}-wait", "templateType": "Suspend", "deadline": go_duration(at)}
            branch = {"name": f"{name}-at", "templateType": "Serial", "children": [suspend["name"], made[0]["name"]]}
            self.templates += [suspend, *made, branch]
            self.branches.append(branch["name"])
        if not self.branches:
            return
        entry = {"name": "entry", "templateType": "Parallel", "children": self.branches}
        workflow = {
            "apiVersion": CHAOS_API,
            "kind": "Workflow",
            "metadata": {
                "name": f"{self.opts.name}-chaos",
                "namespace": self.opts.namespace,
                "annotations": {"elastic-sim/scenario": self.scenario.name},
            },
            "spec": {"entry": "entry", "templates": [entry, *self.templates]},
        }
        if self.comments:
            workflow["metadata"]["annotations"]["elastic-sim/triggers"] = "; ".join(self.comments)
        files = self.export.files
        files["chaos/workflow.yaml"] = [workflow]
        header = [
            f"Scenario {self.scenario.name}: apply once training has started (its times count from the first step).",
            *self.comments,
        ]
        self.export.comments["chaos/workflow.yaml"] = "\n".join(f"# {line}" for line in header) + "\n"
        if self.needs_exec or self.needs_scale:
            files["chaos/rbac.yaml"] = _task_rbac(self.opts, exec_=self.needs_exec, scale=self.needs_scale)
            granted = []
            if self.needs_exec:
                granted.append("list pods and exec into them")
            if self.needs_scale:
                granted.append(f"scale pytorchjob/{self.opts.name}")
            self.note(
                "Faults with no Chaos Mesh primitive (one worker process signalled, a checkpoint damaged, "
                "a collective hang, a scale) are Workflow Task templates that run kubectl with image "
                f"{self.opts.kubectl_image}, as the ServiceAccount {self.opts.chaos_account} (chaos/rbac.yaml), which "
                f"may only {' and '.join(granted)} in namespace {self.opts.namespace}. A Chaos Mesh Task cannot "
                f"name an account: each mounts the account's token Secret {self.opts.chaos_token} where kubectl "
                "reads one (and so gets no other). Nothing is granted to the namespace's default account (the "
                "Task pods run as it), and the workers mount no token."
            )

    def _holds(self, timeline: list[tuple[float, Step, int]]) -> dict[int, float | None]:
        """For each step without a duration that a later step ends (heal, unpause, start, resume-worker):
        how long it is held; None: to the end of the run."""
        holds: dict[int, float | None] = {}
        for number, (at, step, _) in enumerate(timeline):
            if step.duration_s is not None:
                continue
            for later_at, later, _ in timeline[number + 1 :]:
                if self._target(later) in (None, self._target(step)) and self._ends(later, step):
                    holds[number] = later_at - at
                    break
            else:
                holds[number] = None
        return holds

    def _ends(self, later: Step, step: Step) -> bool:
        """Whether `later` ends `step`'s fault: an undo of what it holds in force (heal: any), or a start of the
        node it took down."""
        kind, ender = FAULTS[step.fault].kind, FAULTS[later.fault].kind
        form = ender.act.k8s(later.options, self._target(later))
        if isinstance(form, EndsHold) and form.ends == "lost":
            return kind.removes_node
        return FAULTS[step.fault].reversible and ender.undoes and ender.undoes_in_force in (None, kind.in_force)

    def _target(self, step: Step) -> str | None:
        """What a step aims at: its target, an entry's fixed one (etcd-kill: etcd), None for none (heal, scale)."""
        fixed = FAULTS[step.fault].fixed_target
        return fixed if fixed is not None else getattr(step.options, "target", None)

    # --- one step

    def _step(self, name: str, step: Step, index: int, hold: float | None) -> list[dict]:
        """The templates of one step, the one the Serial runs first; [] when the step maps to nothing."""
        o = step.options
        held = step.duration_s if step.duration_s is not None else hold
        run_s = self.scenario.timeout_s
        where = f"steps[{index}] ({step.fault}, line {step.line})"
        fault = step.fault
        form = FAULTS[fault].kind.act.k8s(o, self._target(step))  # the kind's own Kubernetes form
        if form is not None:
            return self._form(name, fault, where, form, held, hold, run_s, index)
        self.note(
            f"{where}: {fault} is NOT exported: no Chaos Mesh primitive, and no exec form here "
            "(run it on a local cluster: `sim chaos run`)."
        )
        return []

    def _form(
        self,
        name: str,
        fault: str,
        where: str,
        form: K8sForm,
        held: float | None,
        hold: float | None,
        run_s: float,
        index: int,
    ) -> list[dict]:
        """The templates of a kind's own Kubernetes form (sim/core/faultkinds), the first one the Serial runs."""
        if isinstance(form, ChaosMesh):
            self.note(f"{where}: {form.note}")
            chaos = {**form.head, "mode": "all", "selector": self._selector(form.target), **form.spec}
            if form.in_container:
                chaos["containerNames"] = [self.container]
            return [self._chaos(name, form.kind, chaos, form.deadline_s or held or run_s)]
        if isinstance(form, PodChaos):
            if form.note:
                self.note(f"{where}: {form.note}")
            extra: dict = {"gracePeriod": form.grace} if form.grace is not None else {}
            if form.in_container or form.container:
                extra["containerNames"] = [self.container if form.in_container else form.container]
            return [self._pod_chaos(name, form.target, form.action, form.duration_s, extra)]
        if isinstance(form, PodDown):
            if hold is not None or form.target == ETCD:
                # Down until a later start (or for the rest of the run): the pod is kept from running.
                duration = hold if hold is not None else run_s
                self.note(
                    f"{where}: PodChaos pod-failure for {duration:g}s: the pod stays down until "
                    f"the scenario starts it again ({self.recreator} or Deployment would re-create a killed pod at "
                    "once)."
                )
                return [self._pod_chaos(name, form.target, "pod-failure", duration)]
            self.note(
                f"{where}: PodChaos pod-kill: {self.recreator} re-creates the pod and it rejoins; locally the node "
                "stays down until `sim start`."
            )
            grace = {"gracePeriod": form.grace} if form.grace is not None else {}
            return [self._pod_chaos(name, form.target, "pod-kill", None, grace)]
        if isinstance(form, CutFromJob):
            if form.note:
                self.note(f"{where}: {form.note}")
            return [self._network(name, form.target, CHAOS_PARTITION, held or run_s, target=self._job_selector())]
        if isinstance(form, Partitioned):
            return self._partition(name, where, form.shape, form.nodes, held or run_s)
        if isinstance(form, LinkChaos):
            for note in form.notes:
                self.note(f"{where}: {note}")
            return self._link(name, form, held or run_s)
        if isinstance(form, ExecTask):
            return [self._form_task(name, form)]
        if isinstance(form, Held):
            if form.note:
                self.note(f"{where}: {form.note}")
            start, end = self._form_task(f"{name}-stop", form.start), self._form_task(f"{name}-cont", form.end)
            return self._held(name, start, end, held, run_s)
        if isinstance(form, ScaleJob):
            if self.opts.target == TRAINJOB:
                self.export.not_exported.append(f"steps[{index}] ({fault})")
                self.note(
                    f"{where}: {fault} is NOT exported: Kubeflow Trainer v2 has no elastic policy, a TrainJob's "
                    "numNodes is fixed (--target pytorchjob exports it as `kubectl scale`)."
                )
                return []
            self.needs_scale = True
            command = f"kubectl scale -n {self.opts.namespace} pytorchjob/{self.opts.name} --replicas={form.nodes}"
            self.note(
                f"{where}: {fault} as a Task that runs `{command}`; the operator adds or deletes the highest pods "
                "(gracefully, with the pods' terminationGracePeriodSeconds; abrupt and grace are not mapped)."
            )
            return [self._task(name, command)]
        if isinstance(form, EndsHold):
            self.note(
                f"{where}: {fault} ends the fault before it: that fault's template lasts until this step's time "
                "(Chaos Mesh undoes a fault when its template's deadline passes); no template of its own."
            )
            return []
        raise TypeError(f"no Kubernetes export for {form!r}")  # pragma: no cover - a new form without its branch

    def _form_task(self, name: str, task: ExecTask) -> dict:
        args = (*task.args, self.seed) if task.seeded else task.args
        return self._exec_task(name, task.target, POD_SCRIPTS[task.script], *args, rank=task.rank)

    # --- template builders

    def _held(self, name: str, start: dict, end: dict, held: float | None, run_s: float) -> list[dict]:
        """A Serial: start, a Suspend for the hold, end; the Serial first."""
        wait = {"name": f"{name}-hold", "templateType": "Suspend", "deadline": go_duration(held or run_s)}
        serial = {"name": name, "templateType": "Serial", "children": [start["name"], wait["name"], end["name"]]}
        return [serial, start, wait, end]

    def _pod_labels(self, target: str) -> dict[str, str]:
        if target == ETCD:
            return {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/instance": self.opts.name}
        if self.opts.target == PYTORCHJOB:
            labels = {JOB_NAME_LABEL: self.opts.name, REPLICA_TYPE_LABEL: "worker"}
        else:
            labels = {JOBSET_NAME_LABEL: self.opts.name, REPLICATED_JOB_LABEL: TRAINER_NODE}
        index = _node_index(target, self.spec)
        if index is not None:
            labels[self.index_label] = str(index)
        return labels

    def _selector(self, target: str, *, not_in: Sequence[int] = ()) -> dict:
        selector: dict = {"namespaces": [self.opts.namespace], "labelSelectors": self._pod_labels(target)}
        if not_in:
            selector["expressionSelectors"] = [
                {"key": self.index_label, "operator": "NotIn", "values": [str(i) for i in not_in]}
            ]
        return selector

    def _job_selector(self) -> dict:
        return {"mode": "all", "selector": self._selector("random")}

    def _mode(self, target: str) -> str:
        """`one` (Chaos Mesh picks a pod at random) for a target that names no single pod."""
        if target != ETCD and _node_index(target, self.spec) is None:
            if target == "rank0":
                self.note(
                    "target rank0: the pod of global rank 0 is not known to a selector; a Chaos Mesh object "
                    "picks one worker pod at random (mode one); exec tasks look for RANK=0 in every pod."
                )
            return "one"
        return "all"

    def _chaos(self, name: str, kind: str, chaos: dict, deadline_s: float | None) -> dict:
        template = {"name": name, "templateType": kind, EMBED_FIELDS[kind]: chaos}
        template["deadline"] = go_duration(deadline_s if deadline_s is not None else INSTANT_S)
        return template

    def _pod_chaos(
        self, name: str, target: str, action: str, duration_s: float | None, extra: dict | None = None
    ) -> dict:
        chaos = {"action": action, "mode": self._mode(target), "selector": self._selector(target), **(extra or {})}
        if action == "pod-failure":
            chaos["duration"] = go_duration(duration_s)
        return self._chaos(name, "PodChaos", chaos, duration_s)

    def _network(self, name: str, pod: str, action: str, deadline_s: float, **fields: dict) -> dict:
        # `pod`, not `target`: a partition's other side is its `target` field.
        chaos: dict = {
            "action": action,
            "mode": self._mode(pod),
            "selector": self._selector(pod),
            "direction": "both",
        }
        if "target" in fields:
            chaos["target"] = fields.pop("target")
        chaos.update(fields)
        return self._chaos(name, "NetworkChaos", chaos, deadline_s)

    def _partition(self, name: str, where: str, shape: str, value, deadline_s: float) -> list[dict]:
        nodes = list(self.spec.node_names)

        def side(names: Sequence[str]) -> dict:
            indices = [_node_index(n, self.spec) for n in names if n != ETCD]
            if ETCD in names:
                return {"mode": "all", "selector": self._selector(ETCD)}
            selector = self._selector("random")
            selector["expressionSelectors"] = [
                {"key": self.index_label, "operator": "In", "values": [str(i) for i in indices]}
            ]
            return {"mode": "all", "selector": selector}

        cuts: list[dict] = []
        if shape == "groups":
            for i, group in enumerate(value):
                for other in value[i + 1 :]:
                    cuts.append({"from": group, "to": other, "direction": "both"})
        elif shape == "one_way":
            cuts.append({"from": value[0], "to": value[1], "direction": "to"})
            self.note(f"{where}: one_way as NetworkChaos direction `to` (packets from the first side dropped).")
        else:
            others = {
                "isolate": [n for n in nodes if n not in value] + ([ETCD] if self.spec.uses_etcd else []),
                "from_etcd": [ETCD],
                "from_peers": [n for n in nodes if n not in value],
            }[shape]
            cuts += (
                [{"from": value, "to": [n for n in others if n != ETCD], "direction": "both"}]
                if any(n != ETCD for n in others)
                else []
            )
            if ETCD in others:
                cuts.append({"from": value, "to": [ETCD], "direction": "both"})
        made = []
        for number, cut in enumerate(cuts):
            source = side(cut["from"])
            chaos = {
                "action": CHAOS_PARTITION,
                "mode": "all",
                "selector": source["selector"],
                "direction": cut["direction"],
                "target": side(cut["to"]),
            }
            made.append(self._chaos(f"{name}-{number}", "NetworkChaos", chaos, deadline_s))
        if len(made) == 1:
            made[0]["name"] = name
            return made
        return [{"name": name, "templateType": "Parallel", "children": [t["name"] for t in made]}, *made]

    def _link(self, name: str, form: LinkChaos, deadline_s: float) -> list[dict]:
        made = []
        for action, fields in form.parts:
            chaos = {"action": action, "mode": self._mode(form.target), "selector": self._selector(form.target)}
            chaos["direction"] = "to"
            chaos.update(fields)
            made.append(self._chaos(f"{name}-{action}", "NetworkChaos", chaos, deadline_s))
        if len(made) == 1:
            made[0]["name"] = name
            return made
        return [{"name": name, "templateType": "Parallel", "children": [t["name"] for t in made]}, *made]

    def _task(self, name: str, command: str, env: dict[str, str] | None = None) -> dict:
        """A Task: kubectl as the Tasks' own ServiceAccount, under the restricted profile. Chaos Mesh's Task
        is a container and its volumes (api/v1alpha1/workflow_types.go; its pod runs as the namespace's
        default account, which we grant nothing), so the account is the token Secret mounted where kubectl
        reads one, and the restricted profile is the container's security context."""
        container = {
            "name": "exec",
            "image": self.opts.kubectl_image,
            "command": ["sh", "-c", command],
            "securityContext": _restricted_container(KUBECTL_UID),
            "volumeMounts": [{"name": "chaos-token", "mountPath": TOKEN_DIR, "readOnly": True}],
        }
        if env:
            container["env"] = [{"name": key, "value": value} for key, value in env.items()]
        # 0444: the Task's pod has no fsGroup to give the token to its user alone; only this container mounts it.
        volume = {"name": "chaos-token", "secret": {"secretName": self.opts.chaos_token, "defaultMode": 0o444}}
        return {"name": name, "templateType": "Task", "task": {"container": container, "volumes": [volume]}}

    def _exec_task(self, name: str, target: str, script: str, *args: object, rank: int | None = None) -> dict:
        """A Task that runs `script` (python3 -c) in the target's worker pod through `kubectl exec`: in the
        pod named by the target, or in each worker pod in turn (random: shuffled; rank0 / a rank: the one
        whose script finds the worker) until one succeeds."""
        self.needs_exec = True
        labels = self._pod_labels("random" if rank is not None or target == "rank0" else target)
        if target == "rank0" and script is _SIGNAL_WORKER:
            args = (args[0], 0, *args[2:])
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        ns = self.opts.namespace
        words = " ".join(shlex.quote(str(a)) for a in args)
        order = "shuf" if target == "random" else "cat"
        command = (
            f"for pod in $(kubectl get pods -n {ns} -l {selector} -o name | {order}); do "
            f'kubectl exec -n {ns} "$pod" -c {self.container} -- python3 -c "$SCRIPT" {words} && exit 0; '
            "done; exit 1"
        )
        return self._task(name, command, {"SCRIPT": script})


def _node_index(target: str, spec: ClusterSpec) -> int | None:
    if target == "store-host":
        return 0  # c10d: worker 0 hosts the store (rdzvHost)
    if target.startswith("node") and target[4:].isdigit():
        return int(target[4:])
    return None


def _step_time(spec: ClusterSpec) -> float:
    args = list(spec.effective_script_args)
    if spec.script is None and "--step-time" in args:
        return float(args[len(args) - 1 - args[::-1].index("--step-time") + 1])
    return UNKNOWN_STEP_TIME_S


def _task_rbac(opts: _Options, *, exec_: bool, scale: bool) -> list[dict]:
    """The Tasks' ServiceAccount and what it may do: only what the Workflow's Tasks run, in this namespace.

    kubectl exec: list the job's pods (`kubectl get pods -l`), get the one, then exec: `create` on pods/exec
    (SPDY's POST), and `get` on it too, since kubectl 1.30+ tries a WebSocket first, a GET that API servers
    authorize as `get` (1.35+: and `create`); neither verb grants anything but exec. kubectl scale: get the
    named PyTorchJob (kubectl resolves the name), then patch its scale subresource."""
    rules: list[dict] = []
    if exec_:
        rules += [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
        ]
    if scale:
        rules += [
            {
                "apiGroups": ["kubeflow.org"],
                "resources": ["pytorchjobs"],
                "resourceNames": [opts.name],
                "verbs": ["get"],
            },
            {
                "apiGroups": ["kubeflow.org"],
                "resources": ["pytorchjobs/scale"],
                "resourceNames": [opts.name],
                "verbs": ["get", "patch"],
            },
        ]
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": opts.chaos_account, "namespace": opts.namespace, "labels": _part_of()},
        "automountServiceAccountToken": False,  # its token reaches the Tasks only, through the Secret below
    }
    # The account's token, filled in by Kubernetes' token controller (a manually created service-account
    # token Secret): what the Tasks mount, since a Chaos Mesh Task cannot name a ServiceAccount.
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": opts.chaos_token,
            "namespace": opts.namespace,
            "labels": _part_of(),
            "annotations": {"kubernetes.io/service-account.name": opts.chaos_account},
        },
        "type": "kubernetes.io/service-account-token",
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": opts.chaos_account, "namespace": opts.namespace, "labels": _part_of()},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": opts.chaos_account, "namespace": opts.namespace, "labels": _part_of()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": opts.chaos_account},
        "subjects": [{"kind": "ServiceAccount", "name": opts.chaos_account, "namespace": opts.namespace}],
    }
    return [account, token, role, binding]


# ---------------------------------------------------------------- writing it out


def notes_text(export: K8sExport, title: str) -> str:
    lines = [f"# {title}: what is not exact", ""]
    lines += [f"- {note}" for note in export.notes]
    lines += [
        "",
        "Apply: `kubectl apply -f .` (the job, its etcd and storage), wait until the workers log training steps, "
        "then `kubectl apply -f chaos/` (the Workflow's times count from then). See docs/KUBERNETES.md.",
        "",
    ]
    return "\n".join(lines)


def write_export(export: K8sExport, out_dir: Path, title: str) -> list[Path]:
    """Write each file (YAML, several documents where a file holds several objects) and NOTES.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, objects in export.files.items():
        path = out_dir / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        header = "# Written by elastic-sim (sim export k8s). Not run on a real cluster: see NOTES.md.\n"
        body = yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, width=1000)
        text = header + export.comments.get(file_name, "") + body
        if any(obj["kind"] == "Secret" and ("stringData" in obj or "data" in obj) for obj in objects):
            _write_private(path, text)
        else:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    notes = out_dir / "NOTES.md"
    notes.write_text(notes_text(export, title), encoding="utf-8")
    written.append(notes)
    return written


def _write_private(path: Path, text: str) -> None:
    """A file only its owner reads (0600), whatever stood at that path before: a link is not followed, and
    an older file of that name loses its wider mode."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(fd, 0o600)
        out.write(text)


def to_json(export: K8sExport) -> str:
    return json.dumps(export.objects(), indent=1, sort_keys=True)
