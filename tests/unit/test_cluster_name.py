"""The cluster name is a value type, ClusterName, made once where the name comes in (a flag, a scenario, a spec,
a Docker label) and passed down: the state and run folders and the name lock take it without checking it again.
A bad name still gets its one line."""

from __future__ import annotations

import pytest
import yaml

from sim.core import paths
from sim.core.errors import UsageError
from sim.core.paths import ClusterName, cluster_dir
from sim.core.spec import DEFAULT_NAME, ClusterSpec
from sim.engines import cluster as cluster_mod
from tests.unit.test_safety import FakeEngine


class NoEngine:
    """Nothing here reaches an engine: the name lock's engine is only named."""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SIM_LOCK_DIR", str(tmp_path / "locks"))
    return tmp_path / "home"


@pytest.fixture
def name_checks(monkeypatch):
    """Counts the checks of a cluster name (not of run ids or node names) from now on."""
    calls = []
    real = paths.check_name

    def counting(value, *, what="cluster name", source="--name"):
        if what == "cluster name":
            calls.append(value)
        return real(value, what=what, source=source)

    monkeypatch.setattr(paths, "check_name", counting)
    monkeypatch.setattr(cluster_mod, "check_name", counting)
    return calls


def test_a_spec_name_is_checked_once_and_passed_down_unchecked(home, name_checks):
    spec = ClusterSpec(name="demo", nodes=2)
    assert isinstance(spec.name, ClusterName) and spec.name == "demo"
    assert name_checks == ["demo"]  # the spec is where it came in
    cluster = cluster_mod.Cluster(spec.name, NoEngine(), source="--name")
    assert cluster.state_dir == cluster_dir(spec.name) == home / "clusters" / "demo"
    assert cluster_mod.run_dir(spec.name, "20260101-000000-abcd") == home / "runs" / "demo-20260101-000000-abcd"
    with cluster_mod.name_lock(FakeEngine(), spec.name):
        pass
    assert name_checks == ["demo"]  # before, each of these checked it again


def test_a_name_already_made_is_the_same_value(name_checks):
    name = ClusterName("demo")
    assert ClusterName(name) is name and ClusterName(name, source="cluster") is name
    assert name_checks == ["demo"]
    assert str(name) == "demo" and type(str(name)) is str and {name: 1}["demo"] == 1


def test_a_bad_name_is_one_line_naming_its_source():
    with pytest.raises(UsageError) as error:
        ClusterSpec(name="Bad/Name")
    assert str(error.value) == (
        "--name 'Bad/Name': not a valid cluster name; use 1-40 lowercase letters, digits, '-' or '_', "
        "starting with a letter or digit"
    )
    with pytest.raises(UsageError, match=r"^cluster '\.\./x': not a valid cluster name"):
        cluster_mod.Cluster("../x", NoEngine())


def test_a_plain_str_that_reaches_a_path_is_still_checked(home):
    """Passed down as a ClusterName; a plain str that reaches a folder anyway (a caller that skipped the edge) is
    checked there, never made a path unchecked."""
    with pytest.raises(UsageError, match="not a valid cluster name"):
        cluster_dir("../x")


def test_the_name_is_written_as_a_plain_string():
    assert yaml.safe_dump({"name": ClusterName("demo")}) == "name: demo\n"


class UpEngine:
    """What `up` asks of an engine that has nothing yet (no Docker): the Compose call is recorded."""

    local = False
    compose_argv = ["docker", "compose"]

    def __init__(self):
        self.projects = []

    def ping(self):
        return "fake"

    def data_root(self):
        return "/var/lib/docker"

    def engine_id(self):
        return "fake-engine"

    def image_inspect(self, tag):
        return None

    def labelled(self, kind, label_filter):
        return []

    def ids(self, kind, label_filter):
        return []

    def containers(self, label_filter):
        return []

    def compose(self, project, compose_file, *args, **kwargs):
        self.projects.append(project)


class Built:
    def ensure(self, **kwargs):
        from sim.engines.images import BuildResult, ImageSet

        return BuildResult(ImageSet("base", "runtime", "etcd", "node"), ())


def test_a_whole_up_checks_the_name_once_where_it_came_in(home, name_checks, monkeypatch):
    """Issue 38: the name came in once (the spec) and `up` passes it down: the state folder, the run folder,
    the name lock, the label filter and the Compose project take it unchecked. Before, writing the spec's JSON
    and its history record deep-copied it into plain strings, checked again (2 more per `up`)."""
    monkeypatch.setattr(cluster_mod.Cluster, "_start_collector", lambda self: None)
    engine = UpEngine()
    spec = ClusterSpec(name="demo", nodes=2)
    cluster = cluster_mod.up(spec, engine, builder=Built(), wait=False, progress=lambda line: None)
    assert name_checks == ["demo"]
    assert engine.projects == ["demo"] and cluster.project == cluster.name == "demo"
    assert (cluster.state_dir / "compose.yaml").exists() and cluster.run_dir.name.startswith("demo-")
    assert cluster.label_filter == "label=" + cluster_mod.labels.CLUSTER + "=demo"


def test_a_copy_of_a_name_is_the_same_value(name_checks):
    import copy
    import dataclasses

    name = ClusterName("demo")
    assert copy.copy(name) is name and copy.deepcopy(name) is name
    assert dataclasses.asdict(ClusterSpec(name=name))["name"] is name
    assert name_checks == ["demo"]


def test_the_command_line_makes_the_name_once_for_every_command_that_names_a_cluster():
    """`sim status NAME`, `sim down NAME`, `sim doctor --name NAME` (and `sim logs --name`): made a ClusterName
    where the command line is read; a bad one is the one line it was, `sim doctor`'s too (it was a label filter
    of a name that is none, "not found")."""
    from sim.cli.main import _resolve_cluster_name, build_parser

    for argv in (["status", "h2"], ["down", "--name", "h2"], ["doctor", "--name", "h2"]):
        args = build_parser().parse_args(argv)
        _resolve_cluster_name(args)
        assert isinstance(args.name, ClusterName) and args.name == "h2", argv
    args = build_parser().parse_args(["status"])
    _resolve_cluster_name(args)
    assert args.name is DEFAULT_NAME  # made once, where it is defined
    for argv in (["status", "Bad/x"], ["doctor", "--name", "../x"]):
        args = build_parser().parse_args(argv)
        with pytest.raises(UsageError, match=r"^cluster '[^']+': not a valid cluster name; use 1-40 lowercase"):
            _resolve_cluster_name(args)


def test_the_names_labels_give_are_made_once_and_a_label_that_is_no_name_names_nothing():
    engine = FakeEngine()
    for rid, name in (("c1", "demo"), ("c2", "../../x"), ("n1", "other")):
        engine.add("container", rid, {cluster_mod.labels.CLUSTER: name, cluster_mod.labels.OWNER: "someone"})
    names = cluster_mod.list_clusters(engine)
    assert names == ["demo", "other"] and all(isinstance(n, ClusterName) for n in names)
