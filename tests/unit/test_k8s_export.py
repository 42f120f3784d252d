"""`sim export k8s`: every shipped scenario, on each of its backends, for each target (the PyTorchJob, the
Kubeflow Trainer v2 TrainJob), as objects that fit the operators' and Chaos Mesh's documented fields
(tests/unit/k8s_schema.py), the kubernetes client's core models, and the restricted Pod Security Standard
(tests/unit/pod_security.py). Offline: nothing here talks to a cluster."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes.client import ApiClient

from sim.cli.main import main
from sim.core.spec import ClusterSpec, GpuRequest
from sim.export.k8s import (
    COMPLETION_INDEX_LABEL,
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    REPLICATED_JOB_LABEL,
    TARGETS,
    export_scenario,
    export_spec,
    write_export,
)
from sim.scenarios.scenario import parse_scenario
from sim.scenarios.shipped import shipped_scenarios

from .k8s_schema import (
    CHAOS_KINDS,
    PYTORCHJOB,
    TRAININGRUNTIME,
    TRAINJOB,
    trainer_problems,
    validate,
    workflow_problems,
)
from .pod_security import restricted_problems

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = [(s, b) for s in shipped_scenarios() for b in s.backends]
_CORE_MODELS = {
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Secret"): "V1Secret",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}


def core_problems(obj: dict, model: str) -> list[str]:
    """The kubernetes client's model of `obj`: its required fields must be there (the models refuse a
    missing one), and writing the model back must give `obj` again (a misspelt field would be dropped)."""
    client = ApiClient()
    try:
        built = client.deserialize(json.dumps(obj), model, "application/json")
    except (ValueError, TypeError) as error:
        return [f"{model}: {error}"]
    back = client.sanitize_for_serialization(built)
    if back != obj:
        return [f"{model}: fields lost or changed in the model: {json.dumps(obj)} -> {json.dumps(back)}"]
    return []


def pods(export) -> list[tuple[str, dict, dict]]:
    """Every pod the export makes, as (where, its PodSpec, its annotations): the job's workers, etcd, and
    each Workflow Task's pod (Chaos Mesh spawns it from the Task's container and pod fields)."""
    found = []
    for obj in export.objects():
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "PyTorchJob":
            for replica, spec in obj["spec"]["pytorchReplicaSpecs"].items():
                template = spec["template"]
                found.append(
                    (f"{name} {replica}", template["spec"], template.get("metadata", {}).get("annotations", {}))
                )
        elif obj["kind"] == "TrainingRuntime":
            for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
                template = job["template"]["spec"]["template"]
                found.append(
                    (f"{name} {job['name']}", template["spec"], template.get("metadata", {}).get("annotations", {}))
                )
        elif obj["kind"] == "Deployment":
            template = obj["spec"]["template"]
            found.append((name, template["spec"], template.get("metadata", {}).get("annotations", {})))
        elif obj["kind"] == "Workflow":
            for t in obj["spec"]["templates"]:
                if t["templateType"] == "Task":
                    # Chaos Mesh's SpawnPodForTask: the container and the Task's volumes, nothing else.
                    pod = {"containers": [t["task"]["container"]], "volumes": t["task"].get("volumes", [])}
                    found.append((f"{name} {t['name']}", pod, {}))
    return found


def all_problems(export) -> list[str]:
    problems = []
    objects = export.objects()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if obj["kind"] == "PyTorchJob":
            problems += validate(obj, PYTORCHJOB)
            for replica in obj["spec"]["pytorchReplicaSpecs"].values():
                problems += core_problems(replica["template"], "V1PodTemplateSpec")
        elif obj["kind"] == "TrainJob":
            runtimes = [o for o in objects if o["kind"] == "TrainingRuntime"]
            problems += trainer_problems(runtimes[0], obj) if len(runtimes) == 1 else ["a TrainJob without its runtime"]
            for env in obj["spec"].get("trainer", {}).get("env", []):
                problems += core_problems(env, "V1EnvVar")
        elif obj["kind"] == "TrainingRuntime":
            problems += validate(obj, TRAININGRUNTIME)
            for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
                problems += core_problems(job["template"], "V1JobTemplateSpec")
        elif obj["kind"] == "Workflow":
            problems += workflow_problems(obj)
            for template in obj["spec"]["templates"]:
                if template["templateType"] == "Task":
                    problems += core_problems(template["task"]["container"], "V1Container")
                    problems += [p for v in template["task"].get("volumes", []) for p in core_problems(v, "V1Volume")]
        elif key in _CORE_MODELS:
            problems += core_problems(obj, _CORE_MODELS[key])
        else:
            problems.append(f"unexpected object {key}")
    for where, pod, notes in pods(export):
        problems += restricted_problems(pod, notes, where)
    return problems


def _objects(export, kind: str) -> list[dict]:
    return [o for o in export.objects() if o["kind"] == kind]


def _worker_pod(export) -> dict:
    (job,) = _objects(export, "PyTorchJob") or _objects(export, "TrainingRuntime")
    if job["kind"] == "PyTorchJob":
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    return job["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("scenario", "backend"), SCENARIOS, ids=[f"{s.name}-{b}" for s, b in SCENARIOS])
def test_every_shipped_scenario_exports_valid_objects(scenario, backend, target, tmp_path):
    export = export_scenario(scenario, backend, image="registry.example/elastic-sim-node:1", target=target)
    assert all_problems(export) == []
    kinds = [obj["kind"] for obj in export.objects()]
    if target == "pytorchjob":
        assert kinds.count("PyTorchJob") == 1 and "TrainJob" not in kinds
    else:
        assert kinds.count("TrainJob") == kinds.count("TrainingRuntime") == 1 and "PyTorchJob" not in kinds
    assert ("Deployment" in kinds and "Service" in kinds) == (backend != "c10d")
    assert {where for where, _, _ in pods(export)}, "no pod checked"
    # Every step is either in the Workflow or named in the notes: none is dropped without a word.
    notes = "\n".join(export.notes)
    workflow = next((o for o in export.objects() if o["kind"] == "Workflow"), None)
    names = {t["name"] for t in workflow["spec"]["templates"]} if workflow else set()
    for index, step in enumerate(scenario.steps):
        assert any(step.fault in name for name in names) or f"steps[{index}] ({step.fault}" in notes
    # Written out, every file reads back as the same objects.
    written = write_export(export, tmp_path, scenario.name)
    read = [doc for path in written if path.suffix == ".yaml" for doc in yaml.safe_load_all(path.read_text())]
    assert sorted(map(json.dumps, read)) == sorted(map(json.dumps, export.objects()))
    assert (tmp_path / "NOTES.md").read_text().startswith(f"# {scenario.name}")


def test_the_validators_catch_what_they_claim():
    """Checks that can fail: a misspelt field, a bad enum value, a missing required field, a dangling child."""
    export = export_scenario(next(s for s in shipped_scenarios() if s.name == "tour"))
    job = next(o for o in export.objects() if o["kind"] == "PyTorchJob")
    job["spec"]["elasticPolicy"]["rdzvBackend"] = "etcd-v3"
    job["spec"]["elasticPolicy"]["minReplica"] = 1
    problems = validate(job, PYTORCHJOB)
    assert any("'etcd-v3' is not one of" in p for p in problems)
    assert any("unknown field 'minReplica'" in p for p in problems)
    workflow = next(o for o in export.objects() if o["kind"] == "Workflow")
    chaos = next(t for t in workflow["spec"]["templates"] if t["templateType"] == "StressChaos")
    workflow["spec"]["templates"][0]["children"].append("nowhere")
    assert any("'nowhere' names no template" in p for p in workflow_problems(workflow))
    del chaos["stressChaos"]["selector"]
    assert any("missing required field 'selector'" in p for p in workflow_problems(workflow))
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    template["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    template["spec"]["containers"][0]["comand"] = ["x"]
    assert core_problems(template, "V1PodTemplateSpec")
    del template["spec"]["containers"][0]["name"]
    assert any("name" in p for p in core_problems(template, "V1PodTemplateSpec"))


def test_elastic_policy_carries_the_torchrun_settings():
    spec = ClusterSpec(
        name="job", nodes=3, min_nodes=2, max_nodes=4, nproc_per_node=2, max_restarts=5, rdzv_backend="c10d",
        rdzv_conf=(("join_timeout", "60"), ("last_call_timeout", "2")), gpus=GpuRequest.parse("2"),
    )  # fmt: skip
    export = export_spec(spec, image="r/x:1")
    assert all_problems(export) == []
    (job, _claim) = export.objects()
    policy = job["spec"]["elasticPolicy"]
    assert policy == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "maxRestarts": 5,
        "nProcPerNode": 2,
        "rdzvId": "job",
        "rdzvHost": "job-worker-0",
        "rdzvPort": 29400,
        "rdzvBackend": "c10d",
        "rdzvConf": [{"key": "join_timeout", "value": "60"}, {"key": "last_call_timeout", "value": "2"}],
    }
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    container = worker["template"]["spec"]["containers"][0]
    assert worker["replicas"] == 3
    assert container["image"] == "r/x:1"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    argv = container["command"] + container["args"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "job-worker-0:29400"
    assert argv[argv.index("--nnodes") + 1] == "2:4"


def test_etcd_v3_is_passed_in_the_container_command():
    export = export_spec(ClusterSpec(name="v3", nodes=2, rdzv_backend="etcd-v3"))
    assert all_problems(export) == []
    job = export.objects()[0]
    assert "rdzvBackend" not in job["spec"]["elasticPolicy"]
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--rdzv-backend") + 1] == "etcd-v3"
    assert args[args.index("--rdzv-endpoint") + 1] == "v3-etcd:2379"
    etcd = next(o for o in export.objects() if o["kind"] == "Deployment")
    assert "--enable-v2=true" not in etcd["spec"]["template"]["spec"]["containers"][0]["command"]
    assert any("not etcd-v3" in note for note in export.notes)


SCENARIO = """
name: mapped
description: one of each mapping
cluster: {nodes: 3, nproc_per_node: 1, rdzv_backend: [etcd-v2]}
trainer: {steps: 400, step_time: 0.5}
steps:
  - fault: kill-node
    target: node2
    at: {time: 10s}
  - fault: partition
    groups: node0,node1|node2
    at: {step: 40}
    duration: 5s
  - fault: kill-worker
    target: node1
    at: {after: 3s}
  - fault: skew-clock
    target: node1
    by: -10m
    at: {world_size: 3}
    duration: 10s
  - fault: etcd-kill
    at: {after: 1s}
  - fault: etcd-start
    at: {after: 20s}
expect: {outcome: recovers}
"""


def test_each_fault_maps_as_documented():
    export = export_scenario(parse_scenario(SCENARIO))
    assert all_problems(export) == []
    workflow = next(o for o in export.objects() if o["kind"] == "Workflow")
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    kill = templates["s00-kill-node"]["podChaos"]
    assert kill["action"] == "pod-kill"
    assert kill["selector"]["labelSelectors"] == {
        JOB_NAME_LABEL: "mapped",
        REPLICA_TYPE_LABEL: "worker",
        REPLICA_INDEX_LABEL: "2",
    }
    assert templates["s00-kill-node-wait"] == {
        "name": "s00-kill-node-wait",
        "templateType": "Suspend",
        "deadline": "10s",
    }
    # A step trigger: 40 steps x 0.5 s, a time trigger with its comment.
    assert templates["s01-partition-wait"]["deadline"] == "20s"
    assert "step 40 -> 20s" in workflow["metadata"]["annotations"]["elastic-sim/triggers"]
    partition = templates["s01-partition"]
    assert partition["networkChaos"]["action"] == "partition" and partition["deadline"] == "5s"
    assert partition["networkChaos"]["target"]["selector"]["expressionSelectors"][0]["values"] == ["2"]
    # No Chaos Mesh primitive: kubectl exec with the same signal (SIGKILL = 9).
    task = templates["s02-kill-worker"]
    assert task["templateType"] == "Task" and "kubectl exec" in task["task"]["container"]["command"][-1]
    assert " 9 -1 -1 " in task["task"]["container"]["command"][-1]
    # 25 s: the partition's 5 s hold ends at 25 s; 3 s after it.
    assert templates["s02-kill-worker-wait"]["deadline"] == "28s"
    skew = templates["s03-skew-clock"]
    assert skew["timeChaos"]["timeOffset"] == "-600s" and skew["deadline"] == "10s"
    # etcd-kill held down until the etcd-start 20 s later: pod-failure for 20 s.
    etcd = templates["s04-etcd-kill"]["podChaos"]
    assert etcd["action"] == "pod-failure" and etcd["duration"] == "20s"
    notes = "\n".join(export.notes)
    assert "steps[5] (etcd-start" in notes and "world size" in notes
    assert {key for key, _ in CHAOS_KINDS.values()} >= {k for t in templates.values() for k in t if k.endswith("Chaos")}


def test_cli_writes_a_folder(tmp_path, capsys):
    assert main(["export", "k8s", "worker-crash", "--backend", "etcd-v3", "-o", str(tmp_path / "out")]) == 0
    files = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == ["NOTES.md", "chaos/rbac.yaml", "chaos/workflow.yaml", "etcd.yaml", "job.yaml", "storage.yaml"]
    assert "kubectl apply -f" in capsys.readouterr().out
    assert main(["export", "k8s", "--nodes", "2", "--rdzv-backend", "c10d", "-o", str(tmp_path / "job")]) == 0
    assert not (tmp_path / "job" / "chaos").exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["export", "k8s", "--rdzv-backend", "static", "--nodes", "2", "--min-nodes", "2"], "--rdzv-backend static"),
        (["export", "k8s", "worker-crash", "--backend", "static"], "--backend static"),
        (["export", "k8s", "no-such-scenario"], "scenario 'no-such-scenario'"),
        (["export", "k8s", "--backend", "c10d"], "--backend picks a scenario's backend"),
    ],
)
def test_bad_input_is_one_line(argv, says, capsys, tmp_path):
    assert main([*argv, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_heal_ends_the_reversible_faults_before_it_only():
    scenario = parse_scenario(
        """
name: held
description: a heal ends the pause, not the kill
cluster: {nodes: 3, nproc_per_node: 1}
steps:
  - fault: kill-node
    target: node2
    at: {time: 10s}
  - fault: pause
    target: node1
    at: {time: 12s}
  - fault: heal
    all: true
    at: {time: 30s}
expect: {outcome: recovers}
"""
    )
    export = export_scenario(scenario)
    assert all_problems(export) == []
    workflow = next(o for o in export.objects() if o["kind"] == "Workflow")
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    assert templates["s00-kill-node"]["podChaos"]["action"] == "pod-kill"
    assert templates["s01-pause-hold"]["deadline"] == "18s"
    assert "s02-heal-at" not in templates and any("steps[2] (heal" in note for note in export.notes)


def test_a_frozen_or_isolated_etcd_is_cut_from_the_job():
    """etcd-pause and etcd-isolate export a NetworkChaos partition between the etcd pod and the job's pods (both
    raised a TypeError: the partition's other side, `target`, was also the pod's parameter name)."""
    scenario = parse_scenario(
        """
name: etcd-cut-off
description: etcd frozen, then cut off
cluster: {nodes: 2, nproc_per_node: 1, rdzv_backend: etcd-v2}
steps:
  - fault: etcd-pause
    at: {time: 10s}
  - fault: etcd-unpause
    at: {time: 16s}
  - fault: etcd-isolate
    at: {time: 20s}
    duration: 5s
expect: {outcome: recovers}
"""
    )
    export = export_scenario(scenario)
    assert all_problems(export) == []
    workflow = next(o for o in export.objects() if o["kind"] == "Workflow")
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    for name, held in (("s00-etcd-pause", "6s"), ("s02-etcd-isolate", "5s")):
        chaos = templates[name]["networkChaos"]
        assert chaos["action"] == "partition" and templates[name]["deadline"] == held
        assert chaos["selector"]["labelSelectors"]["app.kubernetes.io/name"] == "etcd"
        assert chaos["target"]["selector"] != chaos["selector"]


# ---------------------------------------------------------------- least privilege (issue 37, finding 4)


def test_the_restricted_profile_check_catches_each_control():
    """The validator can fail: each control of the restricted profile, broken once on a good worker pod."""
    good = _worker_pod(export_spec(ClusterSpec(name="j", nodes=2, rdzv_backend="c10d")))
    assert restricted_problems(good) == []

    def broken(change) -> list[str]:
        pod = json.loads(json.dumps(good))
        change(pod, pod["containers"][0])
        return restricted_problems(pod)

    cases = {
        "runAsNonRoot": lambda p, c: p["securityContext"].pop("runAsNonRoot"),
        "runAsUser: 0": lambda p, c: c["securityContext"].update(runAsUser=0),
        "seccompProfile": lambda p, c: p["securityContext"].pop("seccompProfile"),
        "'Unconfined'": lambda p, c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "must include ALL": lambda p, c: c["securityContext"].pop("capabilities"),
        "only NET_BIND_SERVICE": lambda p, c: c["securityContext"]["capabilities"].update(add=["NET_RAW"]),
        "allowPrivilegeEscalation": lambda p, c: c["securityContext"].pop("allowPrivilegeEscalation"),
        "privileged": lambda p, c: c["securityContext"].update(privileged=True),
        "hostNetwork": lambda p, c: p.update(hostNetwork=True),
        "hostPath": lambda p, c: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "not a restricted volume type": lambda p, c: p["volumes"].append(
            {"name": "n", "nfs": {"server": "s", "path": "/"}}
        ),
        "hostPort": lambda p, c: c.update(ports=[{"containerPort": 1, "hostPort": 1}]),
        "procMount": lambda p, c: c["securityContext"].update(procMount="Unmasked"),
        "not a safe sysctl": lambda p, c: p["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]
        ),
        "seLinuxOptions.type": lambda p, c: p["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
    }
    for says, change in cases.items():
        assert any(says in problem for problem in broken(change)), says


TOKEN, PASSWORD = "hf_s3cretvalue", "pa55word-etcd"


@pytest.mark.parametrize("target", TARGETS)
def test_workers_run_restricted_and_mount_no_token(target):
    export = export_scenario(next(s for s in shipped_scenarios() if s.name == "tour"), target=target)
    pod = _worker_pod(export)
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert [p for where, pod, a in pods(export) for p in restricted_problems(pod, a, where)] == []


def _rbac(export) -> tuple[dict, dict, dict]:
    (account,) = _objects(export, "ServiceAccount")
    (role,) = _objects(export, "Role")
    (binding,) = _objects(export, "RoleBinding")
    return account, role, binding


def _token(export) -> dict:
    (token,) = [s for s in _objects(export, "Secret") if s["type"] == "kubernetes.io/service-account-token"]
    return token


def test_the_chaos_tasks_run_as_their_own_account_with_exec_only():
    """The tour's exec faults (kill-worker, hang-worker, pause...): the Tasks' ServiceAccount may list and get
    pods and exec into them, nothing more; the default account (which the workers run as) gets nothing."""
    export = export_scenario(next(s for s in shipped_scenarios() if s.name == "worker-crash"))
    account, role, binding = _rbac(export)
    assert account["metadata"]["name"] == "worker-crash-chaos"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "worker-crash-chaos", "namespace": "default"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    # A Chaos Mesh Task cannot name an account: each mounts that account's token where kubectl reads one.
    token = _token(export)
    assert token["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "worker-crash-chaos"}
    assert "data" not in token and "stringData" not in token  # Kubernetes fills it in
    (workflow,) = _objects(export, "Workflow")
    tasks = [t["task"] for t in workflow["spec"]["templates"] if t["templateType"] == "Task"]
    assert tasks
    for task in tasks:
        assert set(task) == {"container", "volumes"}
        assert task["volumes"] == [
            {"name": "chaos-token", "secret": {"secretName": "worker-crash-chaos-token", "defaultMode": 0o444}}
        ]
        mount = {"name": "chaos-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}
        assert task["container"]["volumeMounts"] == [mount]
        assert task["container"]["securityContext"]["runAsNonRoot"] is True


def test_a_scale_task_may_scale_that_job_only():
    export = export_scenario(next(s for s in shipped_scenarios() if s.name == "scale-down"))
    _, role, _ = _rbac(export)
    scale = [r for r in role["rules"] if r["apiGroups"] == ["kubeflow.org"]]
    named = {"apiGroups": ["kubeflow.org"], "resourceNames": ["scale-down"]}
    assert scale == [
        {**named, "resources": ["pytorchjobs"], "verbs": ["get"]},
        {**named, "resources": ["pytorchjobs/scale"], "verbs": ["get", "patch"]},
    ]
    assert not any("pods/exec" in r["resources"] for r in role["rules"])  # scale-down has no exec step


@pytest.mark.parametrize("target", TARGETS)
def test_env_values_and_the_etcd_password_are_in_a_secret_only(target, tmp_path):
    """Every --env value (the project's masking rule: all but ENV_SHOWN_KEYS) and the etcd-v3 password go in a
    Secret, written 0600; the pods refer to it (secretKeyRef, a password_file); no other file holds them."""
    spec = ClusterSpec(
        name="sec", nodes=2, rdzv_backend="etcd-v3",
        rdzv_conf=(("user", "root"), ("password", PASSWORD), ("allow_plain_password", "1")),
        env=(("HF_TOKEN", TOKEN), ("NCCL_DEBUG", "INFO"), ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")),
    )  # fmt: skip
    export = export_spec(spec, target=target)
    assert all_problems(export) == []
    (secret,) = _objects(export, "Secret")
    assert secret["metadata"]["name"] == "sec-secrets"
    assert secret["stringData"] == {"HF_TOKEN": TOKEN, "NCCL_DEBUG": "INFO", "etcd-password": PASSWORD}
    container = _worker_pod(export)["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "sec-secrets", "key": "HF_TOKEN"}},
    }
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"}
    args = container["args"]
    conf = args[args.index("--rdzv-conf") + 1]
    assert "password_file=/etc/elastic-sim/secret/etcd-password" in conf.split(",")
    assert {"name": "secret", "mountPath": "/etc/elastic-sim/secret", "readOnly": True} in container["volumeMounts"]
    others = [o for o in export.objects() if o["kind"] != "Secret"]
    assert TOKEN not in json.dumps(others) and PASSWORD not in json.dumps(others)

    out = tmp_path / "out"
    out.mkdir()
    (out / "secret.yaml").write_text("old")
    os.chmod(out / "secret.yaml", 0o644)  # a file from before keeps no wider mode
    written = write_export(export, out, "sec")
    assert stat.S_IMODE((out / "secret.yaml").stat().st_mode) == 0o600
    assert yaml.safe_load((out / "secret.yaml").read_text().split("\n", 1)[1]) == secret
    for path in written:
        if path.name != "secret.yaml":
            assert TOKEN not in path.read_text() and PASSWORD not in path.read_text(), path


def test_the_secret_file_does_not_follow_a_link(tmp_path):
    export = export_spec(ClusterSpec(name="s", nodes=2, rdzv_backend="c10d", env=(("API_KEY", TOKEN),)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("theirs")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "secret.yaml").symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_export(export, tmp_path / "out", "s")
    assert elsewhere.read_text() == "theirs"


def test_no_secret_and_no_rbac_where_nothing_needs_them():
    export = export_spec(ClusterSpec(name="plain", nodes=2, rdzv_backend="c10d"))
    assert not _objects(export, "Secret") and not _objects(export, "Role") and not _objects(export, "ServiceAccount")


# ---------------------------------------------------------------- Kubeflow Trainer v2 (issue 40, part 2)


def test_trainjob_refers_to_our_torch_runtime_with_a_fixed_node_count():
    spec = ClusterSpec(
        name="tj", nodes=3, min_nodes=2, max_nodes=4, nproc_per_node=2, rdzv_backend="c10d", gpus=GpuRequest.parse("1")
    )
    export = export_spec(spec, image="r/x:1", target="trainjob")
    assert all_problems(export) == []
    (runtime,) = _objects(export, "TrainingRuntime")
    (job,) = _objects(export, "TrainJob")
    assert [o["kind"] for o in export.files["job.yaml"]] == ["TrainingRuntime", "TrainJob"]  # the runtime first
    assert job["spec"]["runtimeRef"] == {"name": "tj", "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"}
    assert job["spec"]["trainer"] == {"numNodes": 4, "numProcPerNode": 2}  # --nnodes 2:4 -> numNodes: 4
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 4, "torch": {}}
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    container = _worker_pod(export)["containers"][0]
    assert container["name"] == "node" and container["image"] == "r/x:1"
    argv = container["command"] + container["args"]
    assert argv[argv.index("--nnodes") + 1] == "2:4"  # torchrun's own rounds still take 2 to 4 of the pods
    assert argv[argv.index("--rdzv-endpoint") + 1] == "tj-node-0-0.tj:29400"  # node 0 under JobSet's Service
    assert {"name": "ckpt", "persistentVolumeClaim": {"claimName": "tj-ckpt"}} in _worker_pod(export)["volumes"]
    assert "elastic policy" in export.lost and "numNodes: 4" in export.lost


def test_trainjob_keeps_etcd_v3_in_torchruns_command():
    export = export_spec(ClusterSpec(name="v3", nodes=2, rdzv_backend="etcd-v3"), target="trainjob")
    assert all_problems(export) == []
    args = _worker_pod(export)["containers"][0]["args"]
    assert args[args.index("--rdzv-backend") + 1] == "etcd-v3"
    assert args[args.index("--rdzv-endpoint") + 1] == "v3-etcd:2379"
    assert _objects(export, "TrainJob")[0]["spec"]["trainer"]["numNodes"] == 2  # a fixed --nnodes keeps --nodes


def test_trainjob_faults_target_the_jobset_pod_labels():
    export = export_scenario(parse_scenario(SCENARIO), target="trainjob")
    assert all_problems(export) == []
    (workflow,) = _objects(export, "Workflow")
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    assert templates["s00-kill-node"]["podChaos"]["selector"]["labelSelectors"] == {
        JOBSET_NAME_LABEL: "mapped",
        REPLICATED_JOB_LABEL: "node",
        COMPLETION_INDEX_LABEL: "2",
    }
    target = templates["s01-partition"]["networkChaos"]["target"]["selector"]["expressionSelectors"][0]
    assert target == {"key": COMPLETION_INDEX_LABEL, "operator": "In", "values": ["2"]}
    task = templates["s02-kill-worker"]["task"]["container"]["command"][-1]
    assert f"-l {JOBSET_NAME_LABEL}=mapped,{REPLICATED_JOB_LABEL}=node" in task and " -c node " in task
    assert templates["s03-skew-clock"]["timeChaos"]["containerNames"] == ["node"]
    assert "training.kubeflow.org" not in json.dumps(workflow)


def test_trainjob_drops_scale_faults_and_says_so():
    scenario = next(s for s in shipped_scenarios() if s.name == "tour")
    export = export_scenario(scenario, target="trainjob")
    scales = [f"steps[{i}] (scale)" for i, step in enumerate(scenario.steps) if step.fault == "scale"]
    assert scales and export.not_exported == scales
    (workflow,) = _objects(export, "Workflow")
    assert not any("scale" in t["name"] for t in workflow["spec"]["templates"])
    assert not any(r["apiGroups"] == ["kubeflow.org"] for r in _rbac(export)[1]["rules"])
    for where in scales:
        assert where in export.lost
    assert "--target pytorchjob" in export.lost and len(export.lost.splitlines()) == 1
    # The pytorchjob target keeps them, and says nothing is lost.
    assert export_scenario(scenario).lost is None


def test_the_trainer_validators_catch_what_they_claim():
    export = export_spec(ClusterSpec(name="tj", nodes=2, rdzv_backend="c10d"), target="trainjob")
    runtime, job = export.files["job.yaml"]
    assert trainer_problems(runtime, job) == []
    bad_job = json.loads(json.dumps(job))
    bad_job["spec"]["trainer"]["numNode"] = 2
    bad_job["spec"]["runtimeRef"]["name"] = "other"
    bad_job["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"}]
    problems = trainer_problems(runtime, bad_job)
    assert any("unknown field 'numNode'" in p for p in problems)
    del bad_job["spec"]["trainer"]["numNode"]
    problems = trainer_problems(runtime, bad_job)
    assert any("does not name TrainingRuntime" in p for p in problems) and any("reserved" in p for p in problems)
    bad_runtime = json.loads(json.dumps(runtime))
    bad_runtime["spec"]["mlPolicy"]["mpi"] = {}
    node = bad_runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    problems = trainer_problems(bad_runtime, job)
    assert any("only one of the policies" in p for p in problems) and any(
        "no container named 'node'" in p for p in problems
    )
    node["template"]["metadata"]["labels"] = {}
    assert any("Trainer needs one" in p for p in trainer_problems(bad_runtime, job))
    bad_name = json.loads(json.dumps(job))
    bad_name["metadata"]["name"] = "1tj"
    assert any("does not match" in p for p in validate(bad_name, TRAINJOB))
    node["replicas"] = "1"
    assert any("expected integer" in p for p in validate(bad_runtime, TRAININGRUNTIME))


def test_a_name_starting_with_a_digit_becomes_an_rfc1035_label():
    export = export_spec(ClusterSpec(name="9lives", nodes=2, rdzv_backend="c10d"), target="trainjob")
    assert all_problems(export) == []
    assert _objects(export, "TrainJob")[0]["metadata"]["name"] == "sim-9lives"


def _sim(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: `python -m sim ...` in a fresh process, from this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "sim", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_trainjob_end_to_end(tmp_path):
    done = _sim("export", "k8s", "tour", "--target", "trainjob", "--image", "r/node:1", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lost = [line for line in done.stderr.splitlines() if "elastic policy" in line]
    assert len(lost) == 1 and "Traceback" not in done.stderr
    out = tmp_path / "out"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["NOTES.md", "chaos/rbac.yaml", "chaos/workflow.yaml", "etcd.yaml", "job.yaml", "storage.yaml"]
    kinds = [d["kind"] for d in yaml.safe_load_all((out / "job.yaml").read_text())]
    assert kinds == ["TrainingRuntime", "TrainJob"]
    notes = (out / "NOTES.md").read_text()
    scenario = next(s for s in shipped_scenarios() if s.name == "tour")
    assert lost == [export_scenario(scenario, target="trainjob").lost]  # the one line, as the export words it
    scales = [(i, step) for i, step in enumerate(scenario.steps) if step.fault == "scale"]
    assert scales
    for index, step in scales:  # each scale step, named on the terminal and in NOTES.md
        assert f"steps[{index}] (scale)" in lost[0]
        assert f"steps[{index}] (scale, line {step.line}): scale is NOT exported" in notes
    for says in ("no elastic policy", "--nnodes 1:3 becomes numNodes: 3", "--target pytorchjob"):
        assert says in lost[0] and says in notes, says
    assert "ElasticPolicy API was removed in v2.2.0" in notes and "kubectl scale pytorchjob/NAME" in notes
    # The default target is still the elastic PyTorchJob, with no such line.
    done = _sim("export", "k8s", "tour", "-o", "legacy", cwd=tmp_path)
    assert done.returncode == 0 and "elastic policy" not in done.stderr
    assert yaml.safe_load_all((tmp_path / "legacy" / "job.yaml").read_text()).__next__()["kind"] == "PyTorchJob"


def test_cli_bad_target_is_one_line(tmp_path):
    done = _sim("export", "k8s", "tour", "--target", "jobset", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "--target" in done.stderr and "'jobset'" in done.stderr and "trainjob" in done.stderr
    assert not (tmp_path / "out").exists()
