"""Safe on a shared engine (issue 26), with the real engine and real processes: a crafted label
deletes nothing outside the state folder; two state homes and two `up`s of one name at once
cannot destroy each other's cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from sim.core import labels
from sim.engines.cluster import Cluster
from tests.conftest import ROOT, SESSION, run_sim, unique_name

pytestmark = pytest.mark.docker

LONG_JOB = ["--", "--steps", "100000", "--step-time", "0.1"]


def create_labelled(docker, image: str, tags: dict[str, str]) -> str:
    """A container made by hand, as anyone who reaches the engine can (never started: enough for a label)."""
    return docker.api.create_container(image, command=["true"], labels={labels.SESSION: SESSION, **tags})["Id"]


def test_down_all_with_a_crafted_label_deletes_nothing_outside_the_state_folder(docker, images, tmp_path):
    home = tmp_path / "home"
    victim = tmp_path / "x" / "victim"
    victim.mkdir(parents=True)
    (victim / "precious").write_text("mine")
    crafted = "../" * len((home / "clusters").parts) + str(victim).lstrip("/")
    env = {"SIM_HOME": str(home)}
    owner = run_sim_owner(env)
    name = unique_name("t-craft")
    stranger = create_labelled(docker, images.etcd, {labels.CLUSTER: crafted, labels.OWNER: owner})
    # A cluster of this home whose node and run labels are crafted: its logs stay in its run folder.
    own = create_labelled(
        docker,
        images.etcd,
        {labels.CLUSTER: name, labels.OWNER: owner, labels.NODE: "../../../escaped", labels.RUN: "../r"},
    )
    try:
        result = run_sim("down", "--all", env=env)
        assert result.returncode == 0, result.stderr
        assert (victim / "precious").read_text() == "mine"
        assert not (tmp_path / "x" / "victim-unknown").exists()
        assert not list(tmp_path.rglob("escaped*"))
        assert f"removed cluster '{name}'" in result.stdout
        assert "no cluster name" in result.stdout and crafted in result.stdout
        assert [c.id for c in docker.containers(f"label={labels.CLUSTER}={crafted}")] == [stranger]
        assert not docker.containers(labels.cluster_filter(name))
        saved = list((home / "runs").glob(f"{name}-unknown/logs/*.log"))
        assert [p.name for p in saved] == [f"container-{own[:12]}.log"]
    finally:
        docker.remove("container", [stranger, own])


def run_sim_owner(env: dict) -> str:
    """The owner label value a `sim` process with this environment puts on what it makes."""
    code = "from sim.core import labels; print(labels.owner())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_two_homes_two_ups_of_one_name_at_once(docker, images, tmp_path):
    name = unique_name("t-shared")
    homes = [tmp_path / "a", tmp_path / "b"]
    argv = [sys.executable, "-m", "sim", "up", "--name", name, "--nodes", "1", "--nproc-per-node", "1", "--detach"]
    procs = [
        subprocess.Popen(
            argv + LONG_JOB,
            cwd=ROOT,
            env={**os.environ, "SIM_HOME": str(home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for home in homes
    ]
    try:
        results = [(p.wait(timeout=400), *p.communicate()) for p in procs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2], results
        winner = homes[[code for code, _, _ in results].index(0)]
        loser = homes[[code for code, _, _ in results].index(2)]
        refusal = next(err for code, _, err in results if code == 2).strip().splitlines()
        assert len(refusal) <= 2 and "belongs to another state home" in refusal[-1] and "--replace" in refusal[-1]
        assert "Traceback" not in refusal[-1]
        before = {c.id for c in Cluster(name, docker).containers() if c.state == "running"}
        assert before, "the winner's cluster runs"
        time.sleep(2)
        assert {c.id for c in Cluster(name, docker).containers() if c.state == "running"} == before
        assert Cluster(name, docker).owners() == {run_sim_owner({"SIM_HOME": str(winner)})}
        # --replace removes it deliberately.
        replaced = run_sim(*argv[3:], "--replace", *LONG_JOB, env={"SIM_HOME": str(loser)})
        assert replaced.returncode == 0, replaced.stderr[-2000:]
        assert "--replace: removing the cluster" in replaced.stderr
        assert not before & {c.id for c in Cluster(name, docker).containers()}
        assert Cluster(name, docker).owners() == {run_sim_owner({"SIM_HOME": str(loser)})}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for home in homes:
            run_sim("down", name, env={"SIM_HOME": str(home)})
    assert not Cluster(name, docker).exists()


def node_faults_in_force(cluster: Cluster, node: str) -> dict[str, str]:
    """What a fault would leave inside the node, read there: our iptables chains' rules, tc qdiscs,
    the cgroup CPU quota, the wall clock's offset."""
    iptables = cluster.net_exec(node, "iptables", "-w", "-S").stdout  # from the network helper: nodes hold no cap
    qdiscs = cluster.net_exec(node, "tc", "qdisc", "show").stdout
    read_quota = "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"  # v2 or v1
    cpu_max = cluster.exec(node, "sh", "-c", read_quota).stdout.strip()
    before = time.time()
    printed = cluster.exec(node, "python3", "-c", "import time; print(time.time())").stdout
    offset = float(printed) - (before + time.time()) / 2
    return {
        "iptables": "\n".join(line for line in iptables.splitlines() if "DROP" in line or "REJECT" in line),
        "tc": "\n".join(line for line in qdiscs.splitlines() if "tbf" in line or "netem" in line),
        "cgroup quota": "" if cpu_max in ("max 100000", "-1") else cpu_max or "unreadable",
        "engine quota": str(max(0, cluster.docker.resources(cluster.container(node).id).cpu_quota) or ""),
        "clock": "" if abs(offset) < 2 else f"{offset:+.1f} s",
    }


def test_sigterm_of_chaos_run_mid_fault_leaves_no_fault_in_force(docker, images, tmp_path):
    from sim.core.spec import ClusterSpec
    from sim.engines.cluster import up
    from tests.integration.test_leaks import SimProcess

    spec = ClusterSpec(
        name=unique_name("t-term"),
        nodes=2,
        nproc_per_node=1,
        rdzv_backend="c10d",
        script_args=("--steps", "1000000", "--step-time", "0.1"),
    )
    scenario = tmp_path / "held.yaml"
    scenario.write_text(
        "name: held\ndescription: four faults held for ten minutes\n"
        "cluster: {nodes: 2, nproc_per_node: 1, rdzv_backend: c10d}\n"
        "steps:\n"
        "  - {fault: partition, isolate: [node1], at: {step: 1}, duration: 10m}\n"
        "  - {fault: netem, target: node1, rate: 1mbit, at: {after: 0s}, duration: 10m}\n"
        "  - {fault: slow-node, target: node1, cpus: 0.2, at: {after: 0s}, duration: 10m}\n"
        "  - {fault: skew-clock, target: node1, by: 60s, at: {after: 0s}}\n"
        "expect: {outcome: recovers}\ntimeout: 15m\n"
    )
    cluster = up(spec, docker, progress=lambda line: None)
    try:
        clean = node_faults_in_force(cluster, "node1")
        assert not any(clean.values()), clean
        runner = SimProcess("chaos", "run", str(scenario), "--cluster", spec.name)
        runner.wait_for_line("[chaos] waiting for the job to end")
        held = node_faults_in_force(cluster, "node1")
        assert all(held.values()), held  # all four in force
        code = runner.signal(signal.SIGTERM)
        assert code != 0 and "Traceback" not in "".join(runner.seen) + runner.proc.stdout.read()
        after = node_faults_in_force(cluster, "node1")
        assert after == {k: "" for k in held}, (held, after)
        assert run_sim("faults", "--name", spec.name).stdout.strip() == "no faults in force"
    finally:
        run_sim("down", spec.name)


def _status(cluster: Cluster, node: str, field: str, user: str | None = None) -> str:
    status = cluster.exec(node, "sh", "-c", f"grep {field}: /proc/self/status", user=user).stdout
    return status.split()[1]


def test_nodes_and_etcd_run_with_every_capability_dropped_and_no_new_privileges(docker, images):
    """Finding 9: a running cluster's nodes and etcd hold no capability at all, in their bounding set, root
    included, and no process there can gain one (NoNewPrivs); the network faults' helper alone holds
    NET_ADMIN, and from it iptables and tc run in the node's namespace, where a root exec in the node
    cannot; `sim doctor`'s audit of the running cluster is clean."""
    from sim.cli.doctor import running_audit
    from sim.core.spec import ClusterSpec
    from sim.engines.cluster import up

    spec = ClusterSpec(name=unique_name("t-caps"), nodes=1, nproc_per_node=1, rdzv_backend="etcd-v2")
    cluster = up(spec, docker, progress=lambda line: None)
    try:
        for service in ("node0", "etcd"):
            host = docker.inspect(cluster.container(service).id)["HostConfig"]
            assert host["CapDrop"] == ["ALL"] and not host["CapAdd"], host
            assert host["SecurityOpt"] == ["no-new-privileges:true"], host
            for user in (None, "root"):
                assert int(_status(cluster, service, "CapBnd", user), 16) == 0
                assert int(_status(cluster, service, "CapEff", user), 16) == 0
                assert _status(cluster, service, "NoNewPrivs", user) == "1"
            denied = cluster.exec(service, "iptables", "-w", "-S", user="root")
            assert not denied.ok and "denied" in (denied.stderr + denied.stdout).lower(), denied
            assert cluster.net_exec(service, "iptables", "-w", "-S").ok
            assert cluster.net_exec(service, "tc", "qdisc", "show").ok
        checks = running_audit(docker, spec.name)
        assert [c.ok for c in checks] == [True], [c.detail for c in checks]
    finally:
        run_sim("down", spec.name)


SECRET = "hunter2-h1-s3cr3t"


def test_env_values_stay_out_of_history_report_and_logs(docker, images, tmp_path):
    """Finding 8: a real `sim up --env` whose script prints the value: the run's history, saved logs,
    `sim logs` and `sim report` show *** instead; spec.json (0600) keeps it for the next `up`."""
    project = tmp_path / "job"
    project.mkdir(mode=0o755)
    script = project / "train.py"
    script.write_text("import os\nprint('token is', os.environ['SIM_TEST_TOKEN'], flush=True)\n")
    name = unique_name("t-env")
    result = run_sim(
        "up", "--name", name, "--nodes", "1", "--rdzv-backend", "c10d", "--script", str(script),
        "--env", f"SIM_TEST_TOKEN={SECRET}", "--detach",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    cluster = Cluster(name, docker)
    try:
        run_dir = cluster.run_dir
        spec_file = cluster.state_dir / "spec.json"
        assert SECRET in spec_file.read_text() and spec_file.stat().st_mode & 0o077 == 0
        deadline = time.monotonic() + 120
        shown = ""
        while "token is" not in shown and time.monotonic() < deadline:  # the script prints once it starts
            time.sleep(1)
            shown = run_sim("logs", name).stdout
        assert "token is ***" in shown and SECRET not in shown, shown[-2000:]
    finally:
        run_sim("down", name)
    assert SECRET not in result.stdout + result.stderr
    saved = (run_dir / "logs" / "node0.log").read_text()
    assert "token is ***" in saved and SECRET not in saved
    history = (run_dir / "history.jsonl").read_text()
    assert "SIM_TEST_TOKEN" in history and SECRET not in history
    report = run_sim("report", name)
    assert SECRET not in report.stdout + report.stderr


def test_a_project_folder_the_nodes_cannot_read_is_refused_before_anything_is_made(docker, images, tmp_path):
    """pytest's and mkdtemp's folders, like home folders, are 0700: the nodes' user (uid 1000, no
    capabilities) cannot copy them. Before, every node died with `tar: This does not look like a tar
    archive` and `up` blamed the start; now one line names the folder and the chmod, and nothing is made."""
    project = tmp_path / "job"
    project.mkdir(mode=0o700)
    (project / "train.py").write_text("print('hello')\n")
    name = unique_name("t-unread")
    result = run_sim(
        "up", "--name", name, "--nodes", "1", "--rdzv-backend", "c10d", "--script", str(project / "train.py")
    )
    assert result.returncode != 0
    error = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "cannot read it" in error[0] and f"chmod -R a+rX {project}" in error[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not Cluster(name, docker).exists()
