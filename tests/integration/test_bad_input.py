"""Bad input: one clear line, a non-zero exit, and nothing created."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sim.core import labels
from tests.conftest import ROOT, SESSION, run_sim


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
    result = run_sim("up", "--name", "nodocker", "--nodes", "2", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
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
    bad.write_text(
        "name: bad\ndescription: a typo\nsteps:\n  - fault: kill-worker\n    at: {step: ten}\n"
        "expect: {outcome: recovers}\n"
    )
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


# ---------------------------------------------------------------- the bad-input table (issue 11)
# Each case: the argv after `python -m sim`, extra environment, files to write first (name -> bytes, in the
# case's own folder, "{dir}" in argv and env names it), and two words the one error line must hold: the
# input it names and a word of its fix. Every case runs in a fresh SIM_HOME; none may create anything.
PREFIX = "badin"
_DEEP = b"name: deep\ndescription: d\nexpect: {outcome: recovers}\nsteps: " + b"[" * 5000 + b"]" * 5000 + b"\n"
_INDENTED = b"name: deep\ndescription: d\nexpect: {outcome: recovers}\ncluster:\n" + b"".join(
    b" " * (2 * i + 2) + b"k%d:\n" % i for i in range(3000)
)
_LAUGHS = (
    b"name: lol\ndescription: d\nexpect: {outcome: recovers}\ncluster:\n  env: &l0 {A: lol}\n"
    b"  rdzv_conf: {<<: ["
    + b"*l0, " * 50000
    + b"*l0]}\nsteps: &s0 [[lol, lol, lol, lol, lol]]\n"
    + b"".join(b"x%d: &s%d [" % (i, i) + b", ".join([b"*s%d" % (i - 1)] * 10) + b"]\n" for i in range(1, 10))
)
_SEQ_BOMB = (
    b"name: lol\ndescription: d\nexpect: {outcome: recovers}\ncluster:\n  script_args: &a0 [lol, lol]\n"
    b"steps: [" + b", ".join([b"*a0"] * 1000) + b"]\n"
)
_HEAD = b"name: bad\ndescription: a bad scenario\nexpect: {outcome: recovers}\n"
_SCRIPT = b"print('train')\n"
_SCENARIO = "{dir}/s.yaml"
# Verbs that would build or start something: their cases run without an engine, so refusing them before
# Docker is asked is what the table checks (the others need the engine to say a cluster is missing).
STARTING_VERBS = ("up", "chaos", "build")
NO_ENGINE = "unix:///nonexistent/docker.sock"

TABLE: dict[str, tuple[list[str], dict[str, str], dict[str, bytes], str, str]] = {
    # sim up: every option
    "up zero nodes": (["up", "--nodes", "0"], {}, {}, "--nodes 0", ">= 1"),
    "up negative nodes": (["up", "--nodes", "-3"], {}, {}, "--nodes -3", ">= 1"),
    "up nodes beyond memory": (["up", "--nodes", "100000"], {}, {}, "--nodes 100000", "or fewer"),
    "up nodes huge": (["up", "--nodes", "9" * 40], {}, {}, "--nodes 9999", "or fewer"),
    "up nproc beyond memory": (
        ["up", "--nproc-per-node", "100000", "--nodes", "1"],
        {},
        {},
        "--nodes 1",
        "--nproc-per-node",
    ),
    "up nodes not a number": (["up", "--nodes", "four"], {}, {}, "--nodes", "--help"),
    "up min above nodes": (["up", "--min-nodes", "3", "--nodes", "2"], {}, {}, "--min-nodes 3", "use --nodes"),
    "up min above max": (
        ["up", "--min-nodes", "3", "--max-nodes", "2", "--nodes", "3"],
        {},
        {},
        "--min-nodes 3",
        "lower --min-nodes",
    ),
    "up zero workers": (["up", "--nproc-per-node", "0"], {}, {}, "--nproc-per-node 0", ">= 1"),
    "up negative restarts": (["up", "--max-restarts", "-1"], {}, {}, "--max-restarts -1", ">= 0"),
    "up zero monitor interval": (["up", "--monitor-interval", "0"], {}, {}, "--monitor-interval", "e.g."),
    "up infinite monitor interval": (["up", "--monitor-interval", "inf"], {}, {}, "--monitor-interval", "e.g."),
    "up unknown backend": (["up", "--rdzv-backend", "zookeeper"], {}, {}, "zookeeper", "use one of"),
    "up static elastic": (["up", "--rdzv-backend", "static", "--min-nodes", "1"], {}, {}, "static", "--min-nodes"),
    "up rdzv-conf no equals": (["up", "--rdzv-conf", "join_timeout"], {}, {}, "join_timeout", "e.g."),
    "up rdzv-conf shell": (["up", "--rdzv-conf", "join_timeout=60;rm -rf /"], {}, {}, "join_timeout", "e.g."),
    "up rdzv-conf subshell": (["up", "--rdzv-conf", "close_timeout=$(id)"], {}, {}, "close_timeout", "e.g."),
    "up rdzv-conf not whole": (["up", "--rdzv-conf", "join_timeout=1.5"], {}, {}, "join_timeout", "whole number"),
    "up rdzv-conf bad key": (["up", "--rdzv-conf", "a b=1"], {}, {}, "a b", "join_timeout=60"),
    "up env no equals": (["up", "--env", "NOEQUALS"], {}, {}, "NOEQUALS", "--env NCCL_DEBUG=INFO"),
    "up env shell key": (["up", "--env", "A;rm -rf /=1"], {}, {}, "A;rm -rf /", "KEY=VALUE"),
    "up env subshell key": (["up", "--env", "$(id)=1"], {}, {}, "$(id)", "KEY=VALUE"),
    "up missing script": (["up", "--script", "/nonexistent/train.py"], {}, {}, "/nonexistent/train.py", "give"),
    "up script is a directory": (["up", "--script", "{dir}"], {}, {}, "a directory", "give the path"),
    "up script is /etc/passwd": (["up", "--script", "/etc/passwd"], {}, {}, "/etc/passwd", "give the path"),
    "up bad gpus": (["up", "--gpus", "lots"], {}, {}, "lots", "use none, all"),
    "up huge gpus": (["up", "--gpus", "9" * 30], {}, {}, "--gpus", "a number up to"),
    "up bad progress regex": (["up", "--progress-regex", "step (\\d+"], {}, {}, "--progress-regex", "e.g."),
    "up name uppercase": (["up", "--name", "BAD"], {}, {}, "BAD", "lowercase"),
    "up name shell": (["up", "--name", "x;rm -rf /"], {}, {}, "x;rm -rf /", "lowercase"),
    "up name subshell": (["up", "--name", "$(reboot)"], {}, {}, "$(reboot)", "lowercase"),
    "up name too long": (["up", "--name", "a" * 300], {}, {}, "aaaa", "1-40"),
    "up timeout zero": (["up", "--timeout", "0"], {}, {}, "--timeout 0", "e.g. --timeout 300"),
    "up timeout negative": (["up", "--timeout", "-5"], {}, {}, "--timeout -5", "e.g. --timeout 300"),
    "up timeout nan": (["up", "--timeout", "nan"], {}, {}, "--timeout nan", "e.g. --timeout 300"),
    "up unknown flag": (["up", "--nodez", "3"], {}, {}, "--nodez", "--help"),
    # the other verbs
    "down name and all": (["down", PREFIX + "-x", "--all"], {}, {}, "--all", "not both"),
    "down missing cluster": (["down", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim ls"),
    "ls extra argument": (["ls", "extra"], {}, {}, "extra", "--help"),
    "status missing cluster": (["status", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim ls"),
    "report missing run": (["report", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "runs are in"),
    "report no runs": (["report"], {}, {}, "no runs", "sim up"),
    "report bad expect": (["report", "--expect", "maybe"], {}, {}, "maybe", "--help"),
    "logs missing cluster": (["logs", "--name", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim ls"),
    "build extra argument": (["build", "now"], {}, {}, "now", "--help"),
    "kill-worker missing cluster": (
        ["kill-worker", "--name", PREFIX + "-missing"],
        {},
        {},
        PREFIX + "-missing",
        "sim up",
    ),
    "kill bad signal": (
        ["kill-agent", "node0", "--signal", "SIGFOO", "--name", PREFIX + "-m"],
        {},
        {},
        "SIGFOO",
        "e.g. KILL",
    ),
    "kill without target": (["kill"], {}, {}, "target", "--help"),
    "stop bad grace": (["stop", "node0", "--grace", "soon", "--name", PREFIX + "-m"], {}, {}, "soon", "e.g."),
    "restart missing cluster": (
        ["restart", "node0", "--name", PREFIX + "-missing"],
        {},
        {},
        PREFIX + "-missing",
        "sim",
    ),
    "start missing cluster": (["start", "node0", "--name", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim ls"),
    "pause bad duration": (
        ["pause", "node0", "--for", "forever", "--name", PREFIX + "-m"],
        {},
        {},
        "forever",
        "e.g. 500ms",
    ),
    "unpause missing cluster": (
        ["unpause", "node0", "--name", PREFIX + "-missing"],
        {},
        {},
        PREFIX + "-missing",
        "sim",
    ),
    "partition shell node": (
        ["partition", "--isolate", "node0;ls", "--name", PREFIX + "-missing"],
        {},
        {},
        PREFIX + "-missing",
        "sim",
    ),
    "heal missing cluster": (["heal", "--all", "--name", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim"),
    "netem loss over 100": (
        ["netem", "node0", "--loss", "200%", "--name", PREFIX + "-m"],
        {},
        {},
        "200%",
        "from 0 to 100",
    ),
    "netem bad rate": (["netem", "node0", "--rate", "fast", "--name", PREFIX + "-m"], {}, {}, "fast", "e.g. 1mbit"),
    "etcd unknown action": (["etcd", "explode"], {}, {}, "explode", "--help"),
    "etcd kill with a downtime": (["etcd", "kill", "--downtime", "5s"], {}, {}, "--downtime", "sim etcd restart"),
    "etcd kill held for a while": (["etcd", "kill", "--for", "5s"], {}, {}, "--for", "sim etcd pause"),
    "scale negative": (["scale", "--nodes", "-1", "--name", PREFIX + "-m"], {}, {}, "-1", ">= 0"),
    "faults missing cluster": (["faults", "--name", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim up"),
    "doctor missing cluster": (["doctor", PREFIX + "-missing"], {}, {}, PREFIX + "-missing", "sim ls"),
    "unknown verb": (["explode"], {}, {}, "explode", "--help"),
    "script args for a fault": (["ls", "--", "--steps", "3"], {}, {}, "--", "sim up"),
    # scenario files
    "chaos missing file": (["chaos", "run", "{dir}/nope.yaml"], {}, {}, "nope.yaml", "shipped:"),
    "chaos scenario is a directory": (
        ["chaos", "run", "{dir}/d.yaml"],
        {},
        {"d.yaml/x": b""},
        "d.yaml",
        "a directory; give a scenario file",
    ),
    "chaos empty file": (["chaos", "run", _SCENARIO], {}, {"s.yaml": b""}, "s.yaml:1", "needs at least"),
    "chaos not yaml": (["chaos", "run", _SCENARIO], {}, {"s.yaml": b"name: [unclosed\n"}, "s.yaml:", "not valid YAML"),
    "chaos not utf-8": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": b"name: caf\xe9\n"},
        "s.yaml:1",
        "save the file as UTF-8",
    ),
    "chaos utf-16": (["chaos", "run", _SCENARIO], {}, {"s.yaml": "name: x\n".encode("utf-16")}, "s.yaml:1", "UTF-8"),
    "chaos nested 5000 deep": (["chaos", "run", _SCENARIO], {}, {"s.yaml": _DEEP}, "nested too deeply", "look for"),
    "chaos indented 3000 deep": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _INDENTED},
        "nested too deeply",
        "look for",
    ),
    "chaos alias bomb": (["chaos", "run", _SCENARIO], {}, {"s.yaml": _LAUGHS}, "s.yaml", "use"),
    "chaos alias list bomb": (["chaos", "run", _SCENARIO], {}, {"s.yaml": _SEQ_BOMB}, "s.yaml", "give"),
    "chaos merge of scalars": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {<<: [1, 2]}\n"},
        "cluster",
        "merge (<<) only mappings",
    ),
    "chaos nodes beyond memory": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {nodes: 100000}\n"},
        "--nodes 100000",
        "or fewer",
    ),
    "chaos huge number": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {nodes: " + b"9" * 5000 + b"}\n"},
        "s.yaml:4",
        "few digits",
    ),
    "chaos scale beyond memory": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"steps:\n  - fault: scale\n    nodes: 100000\n    at: {after: 5s}\n"},
        "100000",
        "or fewer",
    ),
    "chaos script /etc/passwd": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {script: /etc/passwd}\n"},
        "/etc/passwd",
        "give the path",
    ),
    "chaos script a directory": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {script: /tmp}\n"},
        "a directory",
        "give the path",
    ),
    "chaos env shell key": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {env: {'A;ls': x}}\n"},
        "A;ls",
        "KEY=VALUE",
    ),
    "chaos rdzv-conf shell": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {rdzv_conf: {join_timeout: '1;reboot'}}\n"},
        "join_timeout",
        "e.g.",
    ),
    "chaos shell name": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": b"name: 'a;rm -rf /'\ndescription: d\nexpect: {outcome: recovers}\n"},
        "a;rm -rf /",
        "e.g. worker-crash",
    ),
    "chaos unknown fault": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"steps: [{fault: explode, at: {}}]\n"},
        "explode",
        "use one of",
    ),
    "chaos step typo": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"steps: [{fault: kill-worker, at: {step: ten}}]\n"},
        "steps[0].at.step",
        "use e.g. step: 30",
    ),
    "chaos negative seed": (["chaos", "run", _SCENARIO], {}, {"s.yaml": _HEAD + b"seed: -1\n"}, "seed", "e.g. seed"),
    "chaos script with shipped args": (
        ["chaos", "run", _SCENARIO],
        {},
        {"s.yaml": _HEAD + b"cluster: {script: t.py}\ntrainer: {steps: 5}\n", "t.py": _SCRIPT},
        "trainer",
        "cluster.script_args",
    ),
    # the environment
    "SIM_HOME is a file": (["ls"], {"SIM_HOME": "{dir}/f/home"}, {"f": b"x"}, "SIM_HOME", "point SIM_HOME at a folder"),
    "SIM_CACHE is a file": (["up"], {"SIM_CACHE": "/etc/passwd"}, {}, "SIM_CACHE", "point SIM_CACHE at a folder"),
    "SIM_BASE_IMAGE malformed": (
        ["up"],
        {"SIM_BASE_IMAGE": "Not An Image!"},
        {},
        "SIM_BASE_IMAGE",
        "such as debian-python",
    ),
    "SIM_BASE_IMAGE shell": (["build"], {"SIM_BASE_IMAGE": "busybox;rm -rf /"}, {}, "SIM_BASE_IMAGE", "or unset it"),
    "SIM_DEBIAN_SUITE malformed": (["build"], {"SIM_DEBIAN_SUITE": "../../etc"}, {}, "SIM_DEBIAN_SUITE", "bookworm"),
    "SIM_DEBIAN_MIRROR malformed": (
        ["build"],
        {"SIM_DEBIAN_MIRROR": "deb.debian.org"},
        {},
        "SIM_DEBIAN_MIRROR",
        "http://",
    ),
    "SIM_SESSION malformed": (["up"], {"SIM_SESSION": "a=b,c"}, {}, "SIM_SESSION", "pytest-"),
    "DOCKER_HOST malformed": (["ls"], {"DOCKER_HOST": "bogus"}, {}, "DOCKER_HOST", "unix:///"),
    "DOCKER_HOST unreachable": (
        ["ls"],
        {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
        {},
        "not reachable",
        "make setup",
    ),
}


def _run_case(case: str, base: Path) -> tuple[subprocess.CompletedProcess, Path]:
    argv, env, files, _, _ = TABLE[case]
    folder = base / case.replace(" ", "-").replace("/", "_")
    home = folder / "home"
    home.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    fill = lambda text: text.replace("{dir}", str(folder))  # noqa: E731
    environ = {
        **os.environ,
        "SIM_HOME": str(home),
        "SIM_CACHE": str(folder / "cache"),
        **{key: fill(value) for key, value in env.items()},
    }
    if argv[0] in STARTING_VERBS and "DOCKER_HOST" not in env:
        # A case that wrongly passed the checks must not start a cluster: it fails on the engine instead.
        environ["DOCKER_HOST"] = NO_ENGINE
    result = subprocess.run(
        [sys.executable, "-m", "sim", *map(fill, argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
    )
    return result, home


@pytest.fixture(scope="module")
def table_results(docker):
    """Every case of the table, run at once in a few threads (each is a separate `python -m sim`)."""
    before = _ours(docker)
    with tempfile.TemporaryDirectory(prefix="badin-") as base:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = dict(zip(TABLE, pool.map(lambda case: _run_case(case, Path(base)), TABLE), strict=True))
        homes_left = {case: sorted(p.name for p in home.iterdir()) for case, (_, home) in results.items()}
        yield {case: result for case, (result, _) in results.items()}, homes_left, before, _ours(docker)


def _ours(docker) -> dict[str, list[str]]:
    """Resources of this test session or named like the table's clusters."""
    found = {}
    for kind in ("container", "network", "volume"):
        found[kind] = sorted(
            r.id
            for r in docker.labelled(kind, f"label={labels.CLUSTER}")
            if r.labels.get(labels.SESSION) == SESSION or r.labels.get(labels.CLUSTER, "").startswith(PREFIX)
        )
    return found


def test_the_table_holds_sixty_cases_or_more():
    assert len(TABLE) >= 60


@pytest.mark.parametrize("case", list(TABLE))
def test_bad_input_gives_one_line_and_changes_nothing(case, table_results):
    results, homes_left, _, _ = table_results
    result = results[case]
    _, _, _, names_input, fix = TABLE[case]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert names_input in lines[0] and fix in lines[0], lines[0]
    assert homes_left[case] == [], f"{case} left {homes_left[case]} under SIM_HOME"


def test_bad_input_table_created_no_docker_resources(table_results):
    _, _, before, after = table_results
    assert after == before
