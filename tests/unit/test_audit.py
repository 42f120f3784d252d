"""Privilege audit (issue 11 item 6): the rendered cluster, and the rules on crafted projects."""

from __future__ import annotations

import copy

import pytest

from sim.cli.doctor import rendered_audit, running_audit
from sim.core import labels
from sim.core.errors import ClusterNotFoundError
from sim.core.spec import USER_SCRIPT_DIR, ClusterSpec, GpuRequest
from sim.engines.audit import ALLOWED_CAPS, SWARM_TASK_LABEL, audit_project, project_from_inspect, swarm_gaps
from sim.engines.docker import Container
from sim.engines.render import render
from sim.engines.swarm_render import SwarmLayout, to_stack


def _rendered(spec: ClusterSpec) -> dict:
    return render(spec, node_image="node:t", etcd_image="etcd:t", run_id="r1")


@pytest.fixture
def user_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    return str(script)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"rdzv_backend": "etcd-v2", "nodes": 3},
        {"rdzv_backend": "c10d"},
        {"rdzv_backend": "static", "nodes": 2, "min_nodes": 2},
        {"gpus": GpuRequest.parse("1"), "nodes": 2},
        {"gpus": GpuRequest.parse("all")},
    ],
    ids=["default", "etcd-v2", "c10d", "static", "gpus-1", "gpus-all"],
)
def test_rendered_clusters_keep_every_rule(options):
    assert audit_project(_rendered(ClusterSpec(**options))) == []


def test_rendered_user_script_is_read_only_and_no_cluster_container_holds_a_capability(user_script):
    project = _rendered(ClusterSpec(script=user_script, rdzv_backend="c10d"))
    assert audit_project(project) == []
    for service in project["services"].values():
        assert "privileged" not in service and not service.get("ports")
        assert service["cap_drop"] == ["ALL"] and not service.get("cap_add")
        assert service["security_opt"] == ["no-new-privileges:true"]
        assert service["labels"][labels.ROLE] in ("node", "etcd")
        assert str(service.get("user", "sim")).split(":")[0] not in ("root", "0")
    mounts = [
        m for m in project["services"]["node0"]["volumes"] if isinstance(m, dict) and m["target"] == USER_SCRIPT_DIR
    ]
    assert mounts and all(m["read_only"] for m in mounts)


NODE = {labels.ROLE: "node"}
# a service that keeps every rule, before its one breach
_KEPT = {"labels": NODE, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"]}
RULES = {
    "privileged": {**_KEPT, "privileged": True},
    "cap_drop": {**_KEPT, "cap_drop": ["NET_RAW"]},
    "cap_add": {**_KEPT, "cap_add": ["SYS_ADMIN"]},
    "no_new_privileges": {**_KEPT, "security_opt": ["no-new-privileges:false", "label=disable"]},
    "root": {**_KEPT, "user": "0:0"},
    "script_writable": {**_KEPT, "volumes": [{"type": "bind", "source": "/home/u", "target": USER_SCRIPT_DIR}]},
    "docker_socket": {**_KEPT, "volumes": ["/var/run/docker.sock:/var/run/docker.sock"]},
    "port": {**_KEPT, "ports": ["8080:80"]},
    "host_namespace": {**_KEPT, "network_mode": "host"},
}


@pytest.mark.parametrize("rule", list(RULES))
def test_each_rule_finds_its_breach(rule):
    findings = audit_project({"services": {"node0": RULES[rule]}})
    assert [f.rule for f in findings] == [rule] and "node0" in str(findings[0])


def test_net_admin_only_on_the_network_helper_and_loopback_ports_pass():
    helper = {labels.ROLE: labels.NETNS_HELPER}
    findings = audit_project(
        {
            "services": {
                "unlabelled": {"cap_drop": ["all"], "cap_add": ["NET_ADMIN"], "security_opt": ["no-new-privileges"]},
                "node0": {
                    "labels": NODE,
                    "cap_drop": ["CAP_ALL"],
                    "cap_add": ["CAP_NET_ADMIN"],
                    "security_opt": ["no-new-privileges=true"],
                    "ports": ["127.0.0.1:8080:80", {"host_ip": "::1"}],
                    "volumes": [f"/src:{USER_SCRIPT_DIR}:ro"],
                },
                "helper": {
                    "labels": helper,
                    "cap_drop": ["ALL"],
                    "cap_add": ["NET_ADMIN"],
                    "security_opt": ["no-new-privileges:true"],
                },
            }
        }
    )
    assert [(f.service, f.rule) for f in findings] == [("unlabelled", "cap_add"), ("node0", "cap_add")]


def _inspect(**host) -> dict:
    return {
        "Name": "/sim-node0",
        "Config": {"User": "sim", "Labels": {labels.ROLE: "node", labels.NODE: "node0"}},
        "HostConfig": {
            "Privileged": False,
            "CapAdd": None,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges:true"],
            "PortBindings": {},
            "NetworkMode": "sim_c",
            **host,
        },
        "Mounts": [{"Type": "bind", "Source": "/u", "Destination": USER_SCRIPT_DIR, "RW": False}],
    }


def test_a_running_cluster_is_judged_by_the_same_rules():
    assert audit_project(project_from_inspect([_inspect()])) == []
    bad = _inspect(
        Privileged=True,
        CapDrop=None,
        SecurityOpt=None,
        PortBindings={"29400/tcp": [{"HostIp": "0.0.0.0", "HostPort": "29400"}]},
    )
    bad["Config"]["User"] = ""
    bad["Mounts"][0]["RW"] = True
    rules = sorted(f.rule for f in audit_project(project_from_inspect([bad])))
    assert rules == ["cap_drop", "no_new_privileges", "port", "privileged", "root", "script_writable"]


class _FakeDocker:
    def __init__(self, inspected: dict[str, dict]):
        self.inspected = inspected

    def containers(self, label_filter):
        return [Container(cid, cid, {}, "running", "Up", None, {}) for cid in self.inspected]

    def inspect(self, container):
        return self.inspected[container]


def test_doctor_prints_the_audit_of_a_rendered_and_of_a_running_cluster():
    assert [c.ok for c in rendered_audit()] == [True]
    assert [c.ok for c in running_audit(_FakeDocker({"c1": _inspect()}), "sim")] == [True]
    failed = running_audit(_FakeDocker({"c1": _inspect(CapAdd=["SYS_PTRACE"])}), "sim")
    assert [c.ok for c in failed] == [False] and "SYS_PTRACE" in failed[0].detail
    with pytest.raises(ClusterNotFoundError):
        running_audit(_FakeDocker({}), "gone")


def test_the_network_faults_helper_keeps_the_rules():
    """The helper that applies a network fault (Cluster.net_exec): NET_ADMIN only, in a node's namespace, not
    the host's; seen while it runs, it breaks no rule. The same with SYS_ADMIN, or the host's network, does."""
    helper = {"Name": "/h", "Config": {"Labels": {labels.ROLE: labels.NETNS_HELPER}, "User": "root"}}
    kept = {"CapDrop": ["ALL"], "CapAdd": ["NET_ADMIN"], "SecurityOpt": ["no-new-privileges:true"]}
    ok = {**helper, "HostConfig": {**kept, "NetworkMode": "container:abc123"}}
    assert audit_project(project_from_inspect([ok])) == []
    bad = {**helper, "HostConfig": {**kept, "CapAdd": ["NET_ADMIN", "SYS_ADMIN"], "NetworkMode": "host"}}
    assert [f.rule for f in audit_project(project_from_inspect([bad]))] == ["cap_add", "host_namespace"]


def test_the_rendered_cluster_drops_every_capability_and_the_audit_sees_it_go(user_script):
    """Each node and etcd drops every capability and adds none back (NET_ADMIN, with its reason in
    ALLOWED_CAPS, is the network helper's alone), with no new privileges on Compose; the audit finds a
    service that keeps Docker's defaults, on a Compose render and on its Swarm stack alike. The stack
    cannot carry no-new-privileges, and the audit names that gap instead of hiding it."""
    project = _rendered(ClusterSpec(script=user_script, nodes=2))
    stack = to_stack(project, SwarmLayout(), max_nodes=2)
    for rendered in (project, stack):
        assert audit_project(rendered) == []
        for service in rendered["services"].values():
            assert service["cap_drop"] == ["ALL"] and "cap_add" not in service
        broken = copy.deepcopy(rendered)
        del broken["services"]["node1"]["cap_drop"]
        broken["services"]["etcd"]["cap_add"] = ["NET_ADMIN"]
        assert sorted((f.service, f.rule) for f in audit_project(broken)) == [
            ("etcd", "cap_add"),
            ("node1", "cap_drop"),
        ]
    assert all(service["security_opt"] == ["no-new-privileges:true"] for service in project["services"].values())
    assert not any("security_opt" in service for service in stack["services"].values())
    assert swarm_gaps(project) == [] and ["no_new_privileges" in gap for gap in swarm_gaps(stack)] == [True]
    del project["services"]["node0"]["security_opt"]
    assert [(f.service, f.rule) for f in audit_project(project)] == [("node0", "no_new_privileges")]
    assert set(ALLOWED_CAPS) == {"NET_ADMIN"} and "iptables" in ALLOWED_CAPS["NET_ADMIN"][1]


def test_a_swarm_tasks_container_is_let_off_no_new_privileges_only():
    task = _inspect(SecurityOpt=None)
    task["Config"]["Labels"][SWARM_TASK_LABEL] = "t1"
    project = project_from_inspect([task])
    assert audit_project(project) == [] and len(swarm_gaps(project)) == 1
    task["HostConfig"]["CapDrop"] = None
    assert [f.rule for f in audit_project(project_from_inspect([task]))] == ["cap_drop"]
