"""Safety on a shared engine (issue 26): names that cannot become paths, sweeps that touch only what
this state home owns, one `up`/`down` of a name at a time. Pure parts, with a fake engine; the real
engine's tests are in tests/integration/test_safety.py."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import sim.cli.main as cli
from sim.core import labels
from sim.core.errors import UsageError
from sim.core.paths import check_name, cluster_dir, inside, state_home
from sim.engines import cluster as cluster_mod
from sim.engines.docker import RESOURCE_KINDS, Container, Labelled
from sim.engines.engine import ComposeEngine


class FakeEngine:
    """Containers, networks and volumes with labels; removes what it is asked to, records it."""

    def __init__(self):
        self.things: dict[str, list[Labelled]] = {kind: [] for kind in RESOURCE_KINDS}
        self.removed: list[str] = []

    def add(self, kind: str, rid: str, tags: dict[str, str]) -> None:
        self.things[kind].append(Labelled(rid, tags))

    def ping(self) -> str:
        return "fake"

    def engine_id(self) -> str:
        return "fake-engine"

    def image_inspect(self, tag: str) -> dict | None:
        return None  # no label: our node image's uid

    def _match(self, kind: str, label_filter: str) -> list[Labelled]:
        key, _, value = label_filter.removeprefix("label=").partition("=")
        return [r for r in self.things[kind] if key in r.labels and (not value or r.labels[key] == value)]

    def labelled(self, kind, label_filter):
        return self._match(kind, label_filter)

    def ids(self, kind, label_filter):
        return [r.id for r in self._match(kind, label_filter)]

    def containers(self, label_filter):
        return [
            Container(r.id, r.id, r.labels, "running", "Up", None, {}) for r in self._match("container", label_filter)
        ]

    def remove(self, kind, ids):
        self.removed += list(ids)
        self.things[kind] = [r for r in self.things[kind] if r.id not in ids]

    def logs(self, cid, *, tail=None, timestamps=False):
        return f"log of {cid}\n"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SIM_LOCK_DIR", str(tmp_path / "locks"))
    return tmp_path / "home"


@pytest.mark.parametrize(
    "name", ["../x", "../../../../../tmp/x/victim", "/abs", "a/b", ".", "..", "", "A", "x" * 41, "a.b", "-x"]
)
def test_a_name_that_is_no_name_never_becomes_a_path(home, name):
    with pytest.raises(UsageError, match="not a valid cluster name"):
        cluster_dir(name)
    with pytest.raises(UsageError, match="not a valid cluster name"):
        cluster_mod.run_dir(name, "20260101-000000-abcd")
    with pytest.raises(UsageError, match="not a valid cluster name"):
        cluster_mod.Cluster(name, FakeEngine())


@pytest.mark.parametrize("run_id", ["../../x", "a/b", ".hidden", ""])
def test_a_run_id_that_is_no_token_is_refused(home, run_id):
    with pytest.raises(UsageError, match="not a valid run id"):
        cluster_mod.run_dir("ok", run_id)


def test_inside_refuses_a_symlink_out(home, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="outside the state folder"):
        inside(root, "link", "x")
    assert inside(root, "plain") == root / "plain"
    assert check_name("node-1_a") == "node-1_a"


def test_down_all_with_a_crafted_label_deletes_nothing_outside_the_state_folder(home, tmp_path, monkeypatch, capsys):
    victim = tmp_path / "x" / "victim"
    victim.mkdir(parents=True)
    (victim / "precious").write_text("mine")
    engine = FakeEngine()
    # The label a stranger sets: from the state folder's clusters/ up to the victim.
    crafted = "../" * len((home / "clusters").parts) + str(victim).lstrip("/")
    engine.add("container", "c-crafted", {labels.CLUSTER: crafted, labels.OWNER: labels.owner()})
    monkeypatch.setattr(cli, "_docker", lambda: engine)
    monkeypatch.setattr(cli, "choose_engine", lambda docker, name: ComposeEngine(docker))
    assert cli.main(["down", "--all"]) == 0
    assert (victim / "precious").read_text() == "mine"
    assert not (tmp_path / "x" / "victim-unknown").exists()
    assert engine.removed == []
    assert "no cluster name" in capsys.readouterr().out


def test_down_all_removes_only_what_this_home_owns(home, monkeypatch, capsys):
    engine = FakeEngine()
    engine.add("container", "c-mine", {labels.CLUSTER: "mine", labels.OWNER: labels.owner(), labels.NODE: "node0"})
    engine.add("container", "c-theirs", {labels.CLUSTER: "theirs", labels.OWNER: "otherhost:/elsewhere"})
    engine.add("container", "c-old", {labels.CLUSTER: "old"})  # no owner label: not known to be ours
    monkeypatch.setattr(cli, "_docker", lambda: engine)
    monkeypatch.setattr(cli, "choose_engine", lambda docker, name: ComposeEngine(docker))
    assert cli.main(["down", "--all"]) == 0
    assert engine.removed == ["c-mine"]
    out = capsys.readouterr().out
    assert "removed cluster 'mine'" in out and "old, theirs" in out


def test_a_crafted_node_label_does_not_place_logs_outside_the_run_folder(home, tmp_path):
    engine = FakeEngine()
    engine.add(
        "container",
        "c0123456789abcdef",
        {labels.CLUSTER: "c1", labels.OWNER: labels.owner(), labels.NODE: "../../../../escaped", labels.RUN: "../r"},
    )
    cluster_mod.Cluster("c1", engine).down()
    logs = list((state_home() / "runs").glob("*/logs/*.log"))
    assert [p.name for p in logs] == ["container-c0123456789a.log"]
    assert logs[0].parent.parent.name == "c1-unknown"
    assert not list(tmp_path.glob("escaped*"))


def test_up_refuses_a_name_another_home_holds(home):
    engine = FakeEngine()
    engine.add("container", "c-theirs", {labels.CLUSTER: "shared", labels.OWNER: "otherhost:/elsewhere"})
    with pytest.raises(UsageError, match=r"another state home \(otherhost:/elsewhere\).*--replace"):
        cluster_mod._clear_name(cluster_mod.Cluster("shared", engine), replace=False, progress=lambda _: None)
    assert engine.removed == []
    cluster_mod._clear_name(cluster_mod.Cluster("shared", engine), replace=True, progress=lambda _: None)
    assert engine.removed == ["c-theirs"]


def test_the_owner_label_is_on_every_rendered_resource(home):
    from sim.core.spec import ClusterSpec
    from sim.engines.render import render

    project = render(ClusterSpec(name="o1", nodes=2), node_image="n", etcd_image="e", run_id="r1", events_dir=None)
    tagged = [s["labels"] for s in project["services"].values()]
    tagged += [n["labels"] for n in project["networks"].values()] + [v["labels"] for v in project["volumes"].values()]
    assert tagged and all(t[labels.OWNER] == labels.owner() for t in tagged)
    assert labels.owner().endswith(str(home.resolve()))


def _hold(name: str, seconds: float, queue) -> None:
    with cluster_mod.name_lock(FakeEngine(), name):
        queue.put(("in", time.monotonic()))
        time.sleep(seconds)
        queue.put(("out", time.monotonic()))


def test_the_name_lock_admits_one_process_at_a_time_and_is_reentrant(home):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_hold, args=("same", 0.5, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(10)
    events = sorted((queue.get(timeout=1) for _ in range(4)), key=lambda e: e[1])
    assert [e[0] for e in events] == ["in", "out", "in", "out"]
    engine = FakeEngine()
    with cluster_mod.name_lock(engine, "same"), cluster_mod.name_lock(engine, "same"):
        pass  # a failed `up` removes what it made under the lock it holds


def test_state_files_holding_env_values_are_private(home):
    import stat

    from sim.core.history import FILE_NAME, History
    from sim.core.spec import ClusterSpec
    from sim.engines.cluster import run_start_record, write_state
    from sim.engines.images import ImageSet

    spec = ClusterSpec(name="secret", nodes=1, env=(("TOKEN", "hunter2"),))
    cluster = cluster_mod.Cluster("secret", FakeEngine())
    write_state(cluster, spec, ImageSet("b", "r", "e", "n"), "r1")
    History(cluster_mod.run_dir("secret", "r1") / FILE_NAME).append(run_start_record(spec, "r1"))
    private = [cluster.state_dir / n for n in ("compose.yaml", "spec.json")]
    private += [cluster_mod.run_dir("secret", "r1") / n for n in ("compose.yaml", "spec.json", FILE_NAME)]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in private} == {p.name: 0o600 for p in private}


def test_down_never_signals_a_process_that_reused_a_stale_collector_pid(home, monkeypatch):
    import subprocess
    import sys

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        cluster = cluster_mod.Cluster("stale", FakeEngine())
        cluster.state_dir.mkdir(parents=True)
        (cluster.state_dir / cluster_mod.COLLECTOR_PID_FILE).write_text(str(bystander.pid))
        monkeypatch.setattr(cluster_mod, "COLLECTOR_DRAIN_S", 0.3)
        cluster.down()
        assert bystander.poll() is None, "a process that is not the collector was signalled"
        assert not cluster_mod._is_collector(bystander.pid, "stale")
    finally:
        bystander.kill()
        bystander.wait()


def test_a_gigabyte_log_line_does_not_take_the_collectors_memory_beyond_a_bound():
    import tracemalloc

    from sim.engines.docker import MAX_LINE_BYTES, _lines

    chunk = b"x" * 65536

    def stream():  # a 1 GiB line without a newline, then a normal one (the chunks are made as they go)
        yield b"2026-12-02T00:00:00.000000000Z before\n2026-12-02T00:00:01.000000000Z "
        for _ in range(1 << 14):
            yield chunk
        yield b"tail\n2026-12-02T00:00:02.000000000Z after\n"

    tracemalloc.start()
    try:
        lines = [line[:80] + f"...{len(line)}" if len(line) > 100 else line for line in _lines(stream())]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines[0].endswith("before") and lines[-1].endswith("after") and len(lines) == 3
    assert "line cut" not in lines[1] and lines[1].endswith(
        str(MAX_LINE_BYTES + len(" [elastic-sim: line cut at 1048576 bytes]"))
    )
    assert peak < 8 * MAX_LINE_BYTES, peak


def test_the_node_cap_counts_the_cgroup_memory_limit(tmp_path):
    from sim.core.spec import cgroup_memory_limit_mib

    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")
    assert cgroup_memory_limit_mib([str(v2)]) is None
    v2.write_text(f"{2 * 2**30}\n")
    assert cgroup_memory_limit_mib([str(v2)]) == 2048
    v1.write_text(f"{2**63 - 4096}\n")  # cgroup v1's "no limit"
    assert cgroup_memory_limit_mib([str(tmp_path / "none"), str(v1)]) is None


def test_a_tree_the_nodes_user_cannot_read_is_named_before_anything_starts(tmp_path):
    """A 0700 project folder (a home folder's mode, mkdtemp's and pytest's): the nodes hold no capability,
    so uid 1000 (and the nodes' root alike) cannot copy it; found here, not as a bare tar error in every node."""
    from sim.core.hostpaths import check_readable_by_nodes, unreadable_by

    me = os.geteuid()
    other = me + 1000
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_text("print(1)\n")
    (project / "pkg" / "model.py").write_text("x = 1\n")
    (project / ".git").mkdir()
    (project / ".git" / "secret").write_text("")
    (project / ".git" / "secret").chmod(0o600)  # not copied: not judged
    os.symlink("/nonexistent", project / "link")  # copied as a link: not judged
    for path in (project, project / "pkg"):
        path.chmod(0o755)
    for path in (project / "train.py", project / "pkg" / "model.py"):
        path.chmod(0o644)
    assert unreadable_by(project, other, walk=True) is None
    (project / "pkg" / "model.py").chmod(0o600)
    found = unreadable_by(project, other, walk=True)
    assert found is not None and found[0] == project / "pkg" / "model.py"
    assert unreadable_by(project, me, walk=True) is None  # the owner reads its own 0600 file
    assert unreadable_by(project, other, walk=False) is None  # a mount's top only
    project.chmod(0o700)
    with pytest.raises(UsageError) as refused:
        check_readable_by_nodes("project folder", project, other, walk=True)
    text = str(refused.value)
    assert f"project folder {project}: the nodes' user (uid {other}" in text
    assert "mode 0700" in text and f"chmod -R a+rX {project}" in text and "\n" not in text
    if me == 0:  # the group's bits count for a user in the folder's group, and only for one
        project.chmod(0o750)
        os.chown(project, me, other)
        assert unreadable_by(project, other, walk=False) is None  # no groups known: the one its uid names
        assert unreadable_by(project, other + 1, (100, other), walk=False) is None  # a supplementary group
        assert unreadable_by(project, other, (100,), walk=False) is not None  # its image puts it in 100 only
        with pytest.raises(UsageError, match=f"owner uid {me}, group {other}\\)"):
            check_readable_by_nodes("project folder", project, other, (100,), walk=True)
