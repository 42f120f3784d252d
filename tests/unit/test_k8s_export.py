"""`sim export k8s`: every shipped scenario, on each of its backends, as objects that fit the operator's
and Chaos Mesh's documented fields (tests/unit/k8s_schema.py) and the kubernetes client's core models.
Offline: nothing here talks to a cluster."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client import ApiClient

from chaos.k8s import (
    JOB_NAME_LABEL,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    export_scenario,
    export_spec,
    write_export,
)
from chaos.scenario import parse_scenario
from chaos.shipped import shipped_scenarios
from sim.cli.main import main
from sim.core.spec import ClusterSpec, GpuRequest

from .k8s_schema import CHAOS_KINDS, PYTORCHJOB, validate, workflow_problems

SCENARIOS = [(s, b) for s in shipped_scenarios() for b in s.backends]
_CORE_MODELS = {
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
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


def all_problems(export) -> list[str]:
    problems = []
    for obj in export.objects():
        key = (obj["apiVersion"], obj["kind"])
        if obj["kind"] == "PyTorchJob":
            problems += validate(obj, PYTORCHJOB)
            for replica in obj["spec"]["pytorchReplicaSpecs"].values():
                problems += core_problems(replica["template"], "V1PodTemplateSpec")
        elif obj["kind"] == "Workflow":
            problems += workflow_problems(obj)
            for template in obj["spec"]["templates"]:
                if template["templateType"] == "Task":
                    problems += core_problems(template["task"]["container"], "V1Container")
        elif key in _CORE_MODELS:
            problems += core_problems(obj, _CORE_MODELS[key])
        else:
            problems.append(f"unexpected object {key}")
    return problems


@pytest.mark.parametrize(("scenario", "backend"), SCENARIOS, ids=[f"{s.name}-{b}" for s, b in SCENARIOS])
def test_every_shipped_scenario_exports_valid_objects(scenario, backend, tmp_path):
    export = export_scenario(scenario, backend, image="registry.example/elastic-sim-node:1")
    assert all_problems(export) == []
    kinds = [obj["kind"] for obj in export.objects()]
    assert kinds.count("PyTorchJob") == 1
    assert ("Deployment" in kinds and "Service" in kinds) == (backend != "c10d")
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
