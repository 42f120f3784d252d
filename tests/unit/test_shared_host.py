"""Safe on a shared machine, part two (issue 37): the pure logic behind the real-engine tests in
tests/integration/test_shared_host.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from sim.core.errors import UsageError
from sim.core.spec import ClusterSpec
from sim.engines.docker import DEFAULT_HOST, resolve_engine
from sim.engines.render import render, to_yaml
from sim.engines.swarm_render import SwarmLayout, to_stack

IMAGES = {"node_image": "node:t", "etcd_image": "etcd:t", "run_id": "r1"}


def test_the_stack_file_escapes_every_string_once_what_it_adds_included():
    spec = ClusterSpec(name="demo", nodes=2, env=(("PRICE", "$5"),))
    layout = SwarmLayout(ckpt_nfs="10.0.0.5:/srv/${HOME}")
    project = render(spec, **IMAGES)
    stack = to_stack(project, layout, max_nodes=2)
    # `docker stack deploy` interpolates as Compose does: `$$` is one `$` to it.
    assert stack["volumes"]["ckpt"]["driver_opts"]["device"] == ":/srv/$${HOME}"
    assert stack["services"]["node0"]["environment"]["PRICE"] == "$$5"
    assert to_stack(yaml.safe_load(to_yaml(project)), layout, max_nodes=2) == stack


def make_context(config: Path, name: str, host: str, *, tls: bool = False) -> None:
    """A context as `docker context create` writes it (meta.json under the sha256 of its name)."""
    key = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / key
    meta.mkdir(parents=True)
    endpoints = {"docker": {"Host": host, "SkipTLSVerify": False}}
    (meta / "meta.json").write_text(json.dumps({"Name": name, "Metadata": {}, "Endpoints": endpoints}))
    if tls:
        (config / "contexts" / "tls" / key / "docker").mkdir(parents=True)


def test_the_engine_is_resolved_as_the_docker_cli_does(tmp_path):
    config = tmp_path / "cfg"
    make_context(config, "remote", "unix:///run/other.sock")
    base = {"DOCKER_CONFIG": str(config)}
    assert resolve_engine(base).host == DEFAULT_HOST
    (config / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    engine = resolve_engine(base)
    assert (engine.host, engine.source) == ("unix:///run/other.sock", "Docker context 'remote'")
    env = engine.cli_env({**base, "DOCKER_CONTEXT": "x"})
    assert env["DOCKER_HOST"] == "unix:///run/other.sock" and "DOCKER_CONTEXT" not in env
    assert resolve_engine({**base, "DOCKER_CONTEXT": "default"}).host == DEFAULT_HOST
    assert resolve_engine({**base, "DOCKER_HOST": "unix:///x.sock"}).host == "unix:///x.sock"
    with pytest.raises(UsageError, match=r"^Docker context 'gone' \(DOCKER_CONTEXT\): not found; `docker context ls`"):
        resolve_engine({**base, "DOCKER_CONTEXT": "gone"})


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"DOCKER_HOST": "tcp://10.0.0.5:2375"}, True),
        ({"DOCKER_HOST": "tcp://engine.example:2375"}, True),
        ({"DOCKER_HOST": "tcp://10.0.0.5:2376", "DOCKER_TLS_VERIFY": "1"}, False),
        ({"DOCKER_HOST": "tcp://10.0.0.5:2376", "DOCKER_CERT_PATH": "/certs"}, False),
        ({"DOCKER_HOST": "tcp://127.0.0.1:2375"}, False),
        ({"DOCKER_HOST": "tcp://localhost:2375"}, False),
        ({"DOCKER_HOST": "tcp://[::1]:2375"}, False),
        ({"DOCKER_HOST": "ssh://me@engine.example"}, False),
    ],
)
def test_a_plain_tcp_engine_is_refused_unless_tls_or_this_machine(env, refused):
    if refused:
        with pytest.raises(UsageError, match="plain TCP without TLS"):
            resolve_engine(env)
    else:
        assert resolve_engine(env).host == env["DOCKER_HOST"]


def test_a_plain_tcp_context_is_refused_and_one_with_tls_files_is_not(tmp_path):
    config = tmp_path / "cfg"
    make_context(config, "plain", "tcp://10.0.0.5:2375")
    make_context(config, "tls", "tcp://10.0.0.5:2376", tls=True)
    with pytest.raises(UsageError, match="^Docker context 'plain' tcp://10.0.0.5:2375: plain TCP"):
        resolve_engine({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "plain"})
    engine = resolve_engine({"DOCKER_CONFIG": str(config), "DOCKER_CONTEXT": "tls"})
    assert engine.cli_env({})["DOCKER_CERT_PATH"].endswith("/docker")


def test_a_node_name_with_dollars_is_drawn_as_written(tmp_path, capsys):
    """A side-channel line names its own node; `n$^{$` went to matplotlib's math parser, and the report died."""
    from sim.cli.main import main as sim_main

    run, plain = tmp_path / "run", tmp_path / "plain"
    for folder in (run, plain):
        shutil.copytree(Path(__file__).resolve().parent.parent / "data" / "runs" / "engine_lost", folder)
    lines = (run / "history.jsonl").read_text().splitlines()
    worker = next(json.loads(line) for line in lines if json.loads(line)["type"] == "worker")
    lines.append(json.dumps({**worker, "node": "n$^{$", "t": worker["t"] + 0.01}))
    (run / "history.jsonl").write_text("\n".join(lines) + "\n")
    verdict_code = sim_main(["report", str(plain)])  # that run's verdict: FAIL, exit 1
    capsys.readouterr()
    assert sim_main(["report", str(run)]) == verdict_code, capsys.readouterr().err
    assert (run / "report" / "timeline.png").stat().st_size > 0


def test_a_lock_is_never_opened_through_a_link_and_its_timeout_is_checked(tmp_path, monkeypatch):
    from sim.engines.locks import LockTimeout, engine_lock, engine_lock_path

    monkeypatch.setenv("SIM_LOCK_DIR", str(tmp_path / "locks"))
    path = engine_lock_path("ABCD:EFGH/..", "x.lock")
    assert path == tmp_path / "locks" / "ABCD-EFGH.x.lock" and oct(path.parent.stat().st_mode)[-4:] == "1777"
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError, match=r"x.lock: cannot open it \(a link\)"):
        with engine_lock("ABCD:EFGH/..", "x.lock", None, "test"):
            pass
    assert not (tmp_path / "elsewhere").exists()
    monkeypatch.setenv("SIM_LOCK_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="^SIM_LOCK_TIMEOUT 'soon': not a number of seconds"):
        with engine_lock("e", "y.lock", None, "test"):
            pass
    monkeypatch.setenv("SIM_LOCK_TIMEOUT", "0.3")
    said = []
    with engine_lock("e", "y.lock", None, "test"):
        with pytest.raises(LockTimeout, match=rf"^waiting: pid {os.getpid()} \(user .*\) holds the lock .* after 0.3s"):
            with engine_lock("e", "y.lock", said.append, "waiting"):
                pass
    assert said and f"pid {os.getpid()}" in said[0]
