"""The cluster name is a value type, ClusterName, made once where the name comes in (a flag, a scenario, a spec,
a Docker label) and passed down: the state and run folders and the name lock take it without checking it again.
A bad name still gets its one line."""

from __future__ import annotations

import pytest
import yaml

from sim.core import paths
from sim.core.errors import UsageError
from sim.core.paths import ClusterName, cluster_dir
from sim.core.spec import ClusterSpec
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
