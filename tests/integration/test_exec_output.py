"""An exec's output reaches the harness whole when the client is slow to read the response (a loaded machine),
on the real engine: the node's process probe, whose output once came back empty with exit 0 (issue 36)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import threading
import time

import docker as docker_sdk
import pytest

from sim.core import labels
from sim.engines.proctable import PROBE_ARGV, parse_probe
from tests.conftest import SESSION

pytestmark = pytest.mark.docker

ENDED_WITHIN_S = 60.0
# Processes that come and go while the probe reads /proc (a worker exiting between its listdir and its open).
CHURN = "while :; do sleep 0.05 & sleep 0.01; done"


@contextlib.contextmanager
def headers_read_late(docker, monkeypatch):
    """The client reads an exec's response headers only after the command has ended, as a starved client
    does: the command's output is then in the socket already, behind the headers. (The engine holds an
    exec's lock while it copies the output out, so an inspect that shows the exit code comes after it.)"""
    watcher = docker_sdk.APIClient(version=docker.api.api_version, **docker.engine.client_kwargs(os.environ))
    starting: dict[int, str] = {}
    begin = http.client.HTTPResponse.begin

    def late_begin(response):
        exec_id = starting.pop(threading.get_ident(), None)
        deadline = time.monotonic() + ENDED_WITHIN_S
        while exec_id and watcher.exec_inspect(exec_id)["ExitCode"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return begin(response)

    for api in (docker.api, docker._stream_api):
        post = api._post

        def noting_post(url, *args, post=post, **kwargs):
            if started := re.search(r"/exec/(\w+)/start$", url):
                starting[threading.get_ident()] = started.group(1)
            return post(url, *args, **kwargs)

        monkeypatch.setattr(api, "_post", noting_post)
    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)
    try:
        yield
    finally:
        monkeypatch.undo()
        watcher.close()


def test_the_process_probe_reads_a_nodes_table_when_the_client_comes_late(docker, images, monkeypatch):
    with docker.scratch(images.node, labels={labels.SESSION: SESSION}, user="", network=False) as node:
        churn = docker.exec(node.id, ["sh", "-c", CHURN], detach=True)
        assert churn.exit_code is None
        with headers_read_late(docker, monkeypatch):
            probed = docker.exec(node.id, PROBE_ARGV)
            lines: list[str] = []
            code = node.run(["sh", "-c", "echo first; echo second"], lines.append)
    assert probed.ok, probed.stderr
    rows = [json.loads(line) for line in probed.stdout.splitlines()]
    assert any(r["pid"] == 1 for r in rows), "the node's first process was not seen"
    assert any(r["args"] == PROBE_ARGV for r in rows), "the probe did not see itself"
    assert any(r["args"][:2] == ["sh", "-c"] and CHURN in r["args"] for r in rows), "the churner was not seen"
    parse_probe(probed.stdout)  # no agent, no worker, no error
    assert (code, lines) == (0, ["first", "second"])
