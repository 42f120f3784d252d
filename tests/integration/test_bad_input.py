"""Bad input: one clear line, a non-zero exit, and nothing created."""

from __future__ import annotations

import os

import pytest

from sim import labels
from tests.conftest import SESSION, run_sim


def session_resources(docker) -> dict[str, list[str]]:
    flt = f"label={labels.SESSION}={SESSION}"
    return {kind: docker.ids(kind, flt) for kind in ("container", "network", "volume")}


CASES = {
    "zero nodes": (["--nodes", "0"], "--nodes 0"),
    "min above nodes": (["--min-nodes", "3", "--nodes", "2"], "--min-nodes 3"),
    "unknown backend": (["--rdzv-backend", "zookeeper"], "zookeeper"),
    "missing script": (["--script", "/nonexistent/train.py"], "/nonexistent/train.py"),
    "not a number": (["--nodes", "four"], "--nodes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_up_input_is_one_line_and_creates_nothing(case, docker):
    argv, mentions = CASES[case]
    before = session_resources(docker)
    result = run_sim("up", "--name", f"bad-{case.replace(' ', '-')}", *argv)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert mentions in lines[0] and "Traceback" not in result.stderr
    assert session_resources(docker) == before
    assert not (os.path.exists(os.path.join(os.environ["SIM_HOME"], "clusters", f"bad-{case.replace(' ', '-')}")))


def test_docker_unreachable_is_one_line():
    result = run_sim("up", "--name", "nodocker", "--nodes", "2",
                     env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert result.returncode == 3
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Docker engine not reachable" in lines[0], result.stderr
    assert not os.path.exists(os.path.join(os.environ["SIM_HOME"], "clusters", "nodocker"))


def test_verbs_on_a_missing_cluster(docker):
    for verb in (["status", "no-such"], ["down", "no-such"], ["logs", "--name", "no-such"]):
        result = run_sim(*verb)
        assert result.returncode == 2, verb
        assert result.stderr.strip().count("\n") == 0 and "not found" in result.stderr, result.stderr


def test_invalid_scenario_file_is_one_line_naming_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: a typo\nsteps:\n  - fault: kill-worker\n    at: {step: ten}\n"
                   "expect: {outcome: recovers}\n")
    result = run_sim("chaos", "run", str(bad))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{bad}:5: steps[0].at.step" in lines[0], result.stderr
    unknown = run_sim("chaos", "run", "no-such-scenario")
    assert unknown.returncode == 2 and "shipped:" in unknown.stderr


def test_runaway_nesting_in_a_scenario_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: deep\ndescription: d\nexpect: {outcome: recovers}\nsteps: " + "[" * 5000 + "]" * 5000 + "\n")
    result = run_sim("chaos", "run", str(deep))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{deep}:4: nested too deeply" in lines[0], result.stderr
