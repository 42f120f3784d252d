"""Schemas of the custom resources `sim export k8s` writes, from their documented fields, and a tiny validator.

Written from Kubeflow Trainer v2's CRDs (TrainJob, TrainingRuntime, the JobSet template it embeds: below),
the training operator's kubeflow.org/v1 types (pkg/apis/kubeflow.org/v1/pytorch_types.go,
common_types.go: ElasticPolicy, RDZVConf, ReplicaSpec, RunPolicy) and Chaos Mesh's chaos-mesh.org/v1alpha1
types and docs (Workflow Template: name, templateType, deadline, children, task; PodChaos, NetworkChaos,
StressChaos, TimeChaos, IOChaos specs; SelectorSpec). Objects are closed (`additional: False`) where we
write them, so a misspelt field fails. Core objects (pod templates, containers, Deployments, Services)
are checked with the kubernetes client's models instead (test_k8s_export.py).

A schema: {"type": "object", "required": [...], "properties": {...}, "additional": bool}
           {"type": "array", "items": schema} | {"type": "string", "enum": [...], "pattern": re}
           {"type": "integer", "minimum": n} | {"type": "boolean"} | {"type": "any"} | {"map": schema}
           (and maxLength / minLength on strings, maxItems on arrays, minProperties on objects, as in a CRD)
"""

from __future__ import annotations

import re
from typing import Any

_TYPES = {"string": str, "integer": int, "boolean": bool, "number": (int, float), "object": dict, "array": list}
# Go's time.ParseDuration, as Chaos Mesh reads durations and deadlines.
GO_DURATION = r"^[-+]?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$"


def validate(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Every problem with `value` against `schema`, as 'path: problem'; [] when it fits."""
    if "map" in schema:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [p for key, item in value.items() for p in validate(item, schema["map"], f"{path}.{key}")]
    kind = schema.get("type", "any")
    if kind == "any":
        return []
    expected = _TYPES[kind]
    if not isinstance(value, expected) or (kind in ("integer", "number") and isinstance(value, bool)):
        return [f"{path}: expected {kind}, got {type(value).__name__} {value!r}"]
    problems: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
        problems.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if "minimum" in schema and value < schema["minimum"]:
        problems.append(f"{path}: {value} is below {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        problems.append(f"{path}: {value} is above {schema['maximum']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        problems.append(f"{path}: longer than {schema['maxLength']} characters")
    if "minLength" in schema and len(value) < schema["minLength"]:
        problems.append(f"{path}: shorter than {schema['minLength']} characters")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        problems.append(f"{path}: more than {schema['maxItems']} items")
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        problems.append(f"{path}: fewer than {schema['minProperties']} fields")
    if kind == "array":
        for index, item in enumerate(value):
            problems += validate(item, schema.get("items", {}), f"{path}[{index}]")
    if kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in value:
                problems.append(f"{path}: missing required field {name!r}")
        for name, item in value.items():
            if name in properties:
                problems += validate(item, properties[name], f"{path}.{name}")
            elif not schema.get("additional", True):
                problems.append(f"{path}: unknown field {name!r}; known: {', '.join(properties)}")
    return problems


def _obj(properties: dict, required: tuple[str, ...] = (), additional: bool = False, min_properties: int = 0) -> dict:
    schema = {"type": "object", "properties": properties, "required": list(required), "additional": additional}
    if min_properties:
        schema["minProperties"] = min_properties
    return schema


STRING = {"type": "string"}
INT = {"type": "integer"}
STRINGS = {"type": "array", "items": STRING}
ANY_OBJECT = {"type": "object"}
DURATION = {"type": "string", "pattern": GO_DURATION}
METADATA = _obj(
    {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}, "namespace": STRING,
     "labels": {"map": STRING}, "annotations": {"map": STRING}},
    ("name",),
)  # fmt: skip

# ---------------------------------------------------------------- Kubeflow training operator, kubeflow.org/v1

RDZV_BACKENDS = ["c10d", "etcd", "etcd-v2"]  # RDZVBackend
RESTART_POLICIES = ["Always", "OnFailure", "Never", "ExitCode"]  # RestartPolicy
CLEAN_POD_POLICIES = ["All", "Running", "None"]  # CleanPodPolicy
ELASTIC_POLICY = _obj(
    {
        "minReplicas": {"type": "integer", "minimum": 1},
        "maxReplicas": {"type": "integer", "minimum": 1},
        "rdzvBackend": {"type": "string", "enum": RDZV_BACKENDS},
        "rdzvPort": INT,
        "rdzvHost": STRING,
        "rdzvId": STRING,
        "rdzvConf": {"type": "array", "items": _obj({"key": STRING, "value": STRING})},
        "standalone": {"type": "boolean"},
        "nProcPerNode": {"type": "integer", "minimum": 1},
        "maxRestarts": {"type": "integer", "minimum": 0},
        "metrics": {"type": "array"},
    }
)
REPLICA_SPEC = _obj(
    {
        "replicas": {"type": "integer", "minimum": 0},
        "template": ANY_OBJECT,  # a core PodTemplateSpec: checked with the kubernetes client
        "restartPolicy": {"type": "string", "enum": RESTART_POLICIES},
    }
)
PYTORCHJOB = _obj(
    {
        "apiVersion": {"type": "string", "enum": ["kubeflow.org/v1"]},
        "kind": {"type": "string", "enum": ["PyTorchJob"]},
        "metadata": METADATA,
        "spec": _obj(
            {
                "runPolicy": _obj(
                    {
                        "cleanPodPolicy": {"type": "string", "enum": CLEAN_POD_POLICIES},
                        "ttlSecondsAfterFinished": INT,
                        "activeDeadlineSeconds": INT,
                        "backoffLimit": INT,
                        "schedulingPolicy": ANY_OBJECT,
                        "suspend": {"type": "boolean"},
                    }
                ),
                "elasticPolicy": ELASTIC_POLICY,
                "pytorchReplicaSpecs": _obj({"Master": REPLICA_SPEC, "Worker": REPLICA_SPEC}),
                "nprocPerNode": STRING,
            },
            ("pytorchReplicaSpecs",),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

# ---------------------------------------------------------------- Kubeflow Trainer v2, trainer.kubeflow.org/v1alpha1
# From kubeflow/trainer's CRDs (manifests/base/crds/trainer.kubeflow.org_{trainjobs,trainingruntimes}.yaml and
# pkg/apis/trainer/v1alpha1/{trainjob,trainingruntime}_types.go) at master 8c0f5059 (the v2.4 line, after
# v2.3.0; every field written here has the same type in release-2.3), and JobSet's jobset.x-k8s.io/v1alpha2
# JobSetSpec as the TrainingRuntime embeds it. Closed where we write; core objects (the Job template, the
# pod template, EnvVar, ResourceRequirements) are checked with the kubernetes client's models instead.

RFC1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # TrainJob's x-kubernetes-validations on metadata.name (and <= 63)
TRAINER_METADATA = _obj(
    {"name": {"type": "string", "pattern": RFC1035, "maxLength": 63}, "namespace": STRING,
     "labels": {"map": STRING}, "annotations": {"map": STRING}},
    ("name",),
)  # fmt: skip
_MAX253 = {"type": "string", "minLength": 1, "maxLength": 253}
TRAINJOB = _obj(
    {
        "apiVersion": {"type": "string", "enum": ["trainer.kubeflow.org/v1alpha1"]},
        "kind": {"type": "string", "enum": ["TrainJob"]},
        "metadata": TRAINER_METADATA,
        "spec": _obj(
            {
                "runtimeRef": _obj(
                    {
                        "name": _MAX253,
                        "apiGroup": {"type": "string", "maxLength": 253},
                        "kind": {"type": "string", "enum": ["TrainingRuntime", "ClusterTrainingRuntime"]},
                    },
                    ("name",),
                ),
                "initializer": ANY_OBJECT,
                "trainer": _obj(
                    {
                        "image": {"type": "string", "maxLength": 500},
                        "command": {"type": "array", "items": STRING, "maxItems": 128},
                        "args": {"type": "array", "items": STRING, "maxItems": 128},
                        "env": {"type": "array", "maxItems": 128},  # core EnvVar: kubernetes client
                        "numNodes": {"type": "integer", "minimum": 0},
                        "resourcesPerNode": ANY_OBJECT,  # core ResourceRequirements: kubernetes client
                        "numProcPerNode": {"type": "integer", "minimum": 1},  # rule: self >= 1
                    }
                ),
                "runtimePatches": {"type": "array", "maxItems": 16},
                "suspend": {"type": "boolean"},
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "managedBy": {
                    "type": "string",
                    "enum": ["trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"],
                },
            },
            ("runtimeRef",),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
# JobSet's ReplicatedJob: name, groupName, template (a batch JobTemplateSpec: kubernetes client), replicas,
# dependsOn; the JobSetSpec around it.
REPLICATED_JOB = _obj(
    {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "groupName": STRING,
        "template": ANY_OBJECT,
        "replicas": {"type": "integer", "minimum": 0},
        "dependsOn": {"type": "array", "maxItems": 5,
                      "items": _obj({"name": STRING, "status": {"type": "string", "enum": ["Ready", "Complete"]}},
                                    ("name", "status"))},
    },
    ("name", "template"),
)  # fmt: skip
JOBSET_SPEC = _obj(
    {
        "replicatedJobs": {"type": "array", "items": REPLICATED_JOB},
        "network": _obj({"enableDNSHostnames": {"type": "boolean"}, "subdomain": STRING,
                         "publishNotReadyAddresses": {"type": "boolean"}}),
        "successPolicy": _obj({"operator": {"type": "string", "enum": ["All", "Any"]},
                               "targetReplicatedJobs": STRINGS}, ("operator",)),
        "failurePolicy": _obj(
            {"maxRestarts": {"type": "integer", "minimum": 0},
             "restartStrategy": {"type": "string", "enum": ["Recreate", "BlockingRecreate", "InPlaceRestart"]},
             "rules": {"type": "array"}}
        ),
        "startupPolicy": _obj({"startupPolicyOrder": {"type": "string", "enum": ["AnyOrder", "InOrder"]}},
                              ("startupPolicyOrder",)),
        "suspend": {"type": "boolean"},
        "coordinator": ANY_OBJECT,
        "managedBy": STRING,
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "volumeClaimPolicies": {"type": "array", "maxItems": 50},
    }
)  # fmt: skip
TRAININGRUNTIME = _obj(
    {
        "apiVersion": {"type": "string", "enum": ["trainer.kubeflow.org/v1alpha1"]},
        "kind": {"type": "string", "enum": ["TrainingRuntime"]},
        "metadata": METADATA,
        "spec": _obj(
            {
                "mlPolicy": _obj(
                    {
                        "numNodes": {"type": "integer", "minimum": 0},
                        "torch": _obj({"envInjection": ANY_OBJECT}),
                        "mpi": ANY_OBJECT,
                        "flux": ANY_OBJECT,
                        "jax": ANY_OBJECT,
                        "xgboost": ANY_OBJECT,
                    }
                ),
                "podGroupPolicy": ANY_OBJECT,
                "template": _obj({"metadata": ANY_OBJECT, "spec": JOBSET_SPEC}),
            },
            min_properties=1,
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
ML_POLICIES = ("torch", "mpi", "flux", "jax", "xgboost")
TRAINER_ANCESTOR = ("trainer.kubeflow.org/trainjob-ancestor-step", "trainer")
TRAINER_CONTAINER = "node"


def trainer_problems(runtime: dict, job: dict) -> list[str]:
    """Both objects against their schemas, and the CRDs' and the Torch plugin's rules beyond field types:
    one ML policy at most (mlPolicy's x-kubernetes-validations); the TrainJob refers to this runtime, by kind
    and name, in its namespace; the runtime has one replicated job labelled as the trainer's ancestor
    (Trainer finds it by that label), with a container named `node` (the one Trainer gives the PET_* settings,
    numNodes and the TrainJob's image or command); the TrainJob sets no PET_* variable (reserved); names
    are unique."""
    problems = validate(runtime, TRAININGRUNTIME) + validate(job, TRAINJOB)
    if problems:
        return problems
    spec = runtime["spec"]
    policies = [p for p in ML_POLICIES if p in spec.get("mlPolicy", {})]
    if len(policies) > 1:
        problems.append(f"mlPolicy: only one of the policies can be configured, has {policies}")
    ref = job["spec"]["runtimeRef"]
    if ref.get("kind", "ClusterTrainingRuntime") != "TrainingRuntime" or ref["name"] != runtime["metadata"]["name"]:
        problems.append(f"runtimeRef {ref} does not name TrainingRuntime {runtime['metadata']['name']!r}")
    if job["metadata"].get("namespace") != runtime["metadata"].get("namespace"):
        problems.append("a TrainingRuntime is referred to from its own namespace only")
    jobs = spec.get("template", {}).get("spec", {}).get("replicatedJobs", [])
    names = [r["name"] for r in jobs]
    problems += [f"replicated job {n!r} named twice" for n in sorted({n for n in names if names.count(n) > 1})]
    key, value = TRAINER_ANCESTOR
    trainers = [r for r in jobs if r["template"].get("metadata", {}).get("labels", {}).get(key) == value]
    if len(trainers) != 1:
        problems.append(f"{len(trainers)} replicated jobs labelled {key}={value}; Trainer needs one")
    for r in trainers:
        containers = r["template"].get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        if TRAINER_CONTAINER not in [c.get("name") for c in containers]:
            problems.append(f"replicated job {r['name']!r}: no container named {TRAINER_CONTAINER!r}")
    reserved = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
    for env in job["spec"].get("trainer", {}).get("env", []):
        if env.get("name") in reserved:
            problems.append(f"trainer.env {env['name']}: reserved by the Torch plugin")
    return problems


# ---------------------------------------------------------------- Chaos Mesh, chaos-mesh.org/v1alpha1

MODES = ["one", "all", "fixed", "fixed-percent", "random-max-percent"]  # PodMode
SELECTOR = _obj(
    {
        "namespaces": STRINGS,
        "nodes": STRINGS,
        "pods": {"map": STRINGS},
        "nodeSelectors": {"map": STRING},
        "fieldSelectors": {"map": STRING},
        "labelSelectors": {"map": STRING},
        "annotationSelectors": {"map": STRING},
        "podPhaseSelectors": STRINGS,
        "expressionSelectors": {
            "type": "array",
            "items": _obj(
                {
                    "key": STRING,
                    "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": STRINGS,
                },
                ("key", "operator"),
            ),
        },
    }
)
_COMMON = {"mode": {"type": "string", "enum": MODES}, "value": STRING, "selector": SELECTOR, "duration": DURATION}
_COMMON_REQUIRED = ("mode", "selector")
POD_CHAOS = _obj(
    {
        **_COMMON,
        "action": {"type": "string", "enum": ["pod-kill", "pod-failure", "container-kill"]},
        "containerNames": STRINGS,
        "gracePeriod": {"type": "integer", "minimum": 0},
    },
    ("action", *_COMMON_REQUIRED),
)
_CORRELATED = {"correlation": STRING}
NETWORK_CHAOS = _obj(
    {
        **_COMMON,
        "action": {
            "type": "string",
            "enum": ["netem", "delay", "loss", "duplicate", "corrupt", "partition", "bandwidth"],
        },
        "direction": {"type": "string", "enum": ["to", "from", "both"]},
        "target": _obj({"mode": {"type": "string", "enum": MODES}, "value": STRING, "selector": SELECTOR},
                       ("mode", "selector")),
        "externalTargets": STRINGS,
        "device": STRING,
        "delay": _obj({"latency": DURATION, "jitter": DURATION, **_CORRELATED, "reorder": ANY_OBJECT}, ("latency",)),
        "loss": _obj({"loss": STRING, **_CORRELATED}, ("loss",)),
        "duplicate": _obj({"duplicate": STRING, **_CORRELATED}, ("duplicate",)),
        "corrupt": _obj({"corrupt": STRING, **_CORRELATED}, ("corrupt",)),
        "bandwidth": _obj(
            {"rate": {"type": "string", "pattern": r"^\d+(bps|kbps|mbps|gbps|tbps)$"},
             "limit": {"type": "integer", "minimum": 1}, "buffer": {"type": "integer", "minimum": 1},
             "peakrate": INT, "minburst": INT},
            ("rate", "limit", "buffer"),
        ),
    },
    ("action", *_COMMON_REQUIRED),
)  # fmt: skip
STRESS_CHAOS = _obj(
    {
        **_COMMON,
        "containerNames": STRINGS,
        "stressngStressors": STRING,
        "stressors": _obj(
            {
                "cpu": _obj({"workers": {"type": "integer", "minimum": 1},
                             "load": {"type": "integer", "minimum": 0, "maximum": 100}, "options": STRINGS},
                            ("workers",)),
                "memory": _obj({"workers": {"type": "integer", "minimum": 1},
                                "size": {"type": "string", "pattern": r"^\d+(%|B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$"},
                                "oomScoreAdj": INT, "options": STRINGS},
                               ("workers",)),
            }
        ),
    },
    _COMMON_REQUIRED,
)  # fmt: skip
TIME_CHAOS = _obj(
    {**_COMMON, "timeOffset": DURATION, "containerNames": STRINGS,
     "clockIds": {"type": "array", "items": {"type": "string", "pattern": "^CLOCK_[A-Z_]+$"}}},
    ("timeOffset", *_COMMON_REQUIRED),
)  # fmt: skip
IO_METHODS = [
    "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir", "symlink",
    "rename", "link", "open", "read", "write", "flush", "release", "fsync", "opendir", "readdir", "releasedir",
    "fsyncdir", "statfs", "setxattr", "getxattr", "listxattr", "removexattr", "access", "create", "getlk",
    "setlk", "bmap",
]  # fmt: skip
IO_CHAOS = _obj(
    {
        **_COMMON,
        "action": {"type": "string", "enum": ["latency", "fault", "attrOverride", "mistake"]},
        "volumePath": {"type": "string", "pattern": "^/.*$"},
        "path": STRING,
        "errno": {"type": "integer", "minimum": 1},
        "percent": {"type": "integer", "minimum": 0, "maximum": 100},
        "methods": {"type": "array", "items": {"type": "string", "enum": IO_METHODS}},
        "delay": DURATION,
        "containerNames": STRINGS,
    },
    ("action", "volumePath", *_COMMON_REQUIRED),
)
# templateType -> the field that embeds its spec
CHAOS_KINDS = {
    "PodChaos": ("podChaos", POD_CHAOS),
    "NetworkChaos": ("networkChaos", NETWORK_CHAOS),
    "StressChaos": ("stressChaos", STRESS_CHAOS),
    "TimeChaos": ("timeChaos", TIME_CHAOS),
    "IOChaos": ("ioChaos", IO_CHAOS),
}
# Task (api/v1alpha1/workflow_types.go, v2.8.3): a container and its volumes (and labels, since v2.8.0);
# SpawnPodForTask makes a pod of them alone (restartPolicy Never): no account, no pod securityContext.
TASK = _obj({"container": ANY_OBJECT, "volumes": {"type": "array"}, "labels": {"map": STRING}}, ("container",))
TEMPLATE_TYPES = ["Task", "Serial", "Parallel", "Suspend", "Schedule", "StatusCheck", *CHAOS_KINDS]
TEMPLATE = _obj(
    {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "templateType": {"type": "string", "enum": TEMPLATE_TYPES},
        "deadline": DURATION,
        "children": STRINGS,
        "task": TASK,
        "conditionalBranches": {"type": "array"},
        "statusCheck": ANY_OBJECT,
        "abortWithStatusCheck": {"type": "boolean"},
        **{key: schema for key, schema in CHAOS_KINDS.values()},
    },
    ("name", "templateType"),
)
WORKFLOW = _obj(
    {
        "apiVersion": {"type": "string", "enum": ["chaos-mesh.org/v1alpha1"]},
        "kind": {"type": "string", "enum": ["Workflow"]},
        "metadata": METADATA,
        "spec": _obj({"entry": STRING, "templates": {"type": "array", "items": TEMPLATE}}, ("entry", "templates")),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)


def workflow_problems(workflow: dict) -> list[str]:
    """The Workflow's own rules beyond field types: the entry and every child name a template, names are
    unique, each chaos template embeds its spec (and only that one), Serial/Parallel have children,
    Task has a task, and the graph from the entry reaches every template without a cycle."""
    problems = validate(workflow, WORKFLOW)
    if problems:
        return problems
    templates = workflow["spec"]["templates"]
    names = [t["name"] for t in templates]
    by_name = {t["name"]: t for t in templates}
    problems += [f"template {n!r} named twice" for n in sorted({n for n in names if names.count(n) > 1})]
    if workflow["spec"]["entry"] not in by_name:
        problems.append(f"entry {workflow['spec']['entry']!r} names no template")
    embedded = {key for key, _ in CHAOS_KINDS.values()}
    for t in templates:
        kind = t["templateType"]
        given = embedded & t.keys()
        if kind in CHAOS_KINDS:
            if given != {CHAOS_KINDS[kind][0]}:
                problems.append(f"{t['name']}: a {kind} template embeds {CHAOS_KINDS[kind][0]} only; has {given}")
        elif given:
            problems.append(f"{t['name']}: a {kind} template embeds no chaos; has {given}")
        if kind in ("Serial", "Parallel") and not t.get("children"):
            problems.append(f"{t['name']}: a {kind} template needs children")
        if kind != "Serial" and kind != "Parallel" and "children" in t:
            problems.append(f"{t['name']}: only Serial and Parallel take children")
        if kind == "Task" and "task" not in t:
            problems.append(f"{t['name']}: a Task template needs task")
        if kind == "Suspend" and "deadline" not in t:
            problems.append(f"{t['name']}: a Suspend template needs a deadline (how long it waits)")
        for child in t.get("children", ()):
            if child not in by_name:
                problems.append(f"{t['name']}: child {child!r} names no template")
    seen: set[str] = set()

    def walk(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            problems.append(f"cycle through {name!r}")
            return
        seen.add(name)
        for child in by_name.get(name, {}).get("children", ()):
            walk(child, (*stack, name))

    walk(workflow["spec"]["entry"], ())
    problems += [f"template {n!r} is never reached from the entry" for n in names if n not in seen]
    return problems
