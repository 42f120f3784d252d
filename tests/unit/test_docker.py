"""The docker SDK provider's own logic, on a fake API client (no engine)."""

from __future__ import annotations

import http.server
import io
import json
import socketserver
import struct
import threading

import docker as docker_sdk
import docker.errors as sdk_errors
import pytest
import requests
import urllib3

from sim.engines import docker as provider
from sim.engines.docker import DockerError


class RefusingApi:
    """An engine whose first `refusals` pauses fail with the given runtime message."""

    def __init__(self, refusals: int, message: str):
        self.refusals, self.message, self.pauses = refusals, message, 0

    def pause(self, container: str) -> None:
        self.pauses += 1
        if self.pauses <= self.refusals:
            response = requests.Response()
            response.status_code = 500
            raise sdk_errors.APIError("500", response=response, explanation=self.message)


def engine(api) -> provider.Docker:
    docker = provider.Docker()
    docker.__dict__["api"] = api  # the cached client
    return docker


FREEZE_REFUSAL = "Cannot pause container c1: OCI runtime pause failed: unable to freeze: unknown"


def test_pause_asks_again_when_runc_could_not_freeze_in_time(monkeypatch):
    monkeypatch.setattr(provider.time, "sleep", lambda s: None)
    api = RefusingApi(refusals=3, message=FREEZE_REFUSAL)
    engine(api).pause("c1")
    assert api.pauses == 4


def test_pause_gives_up_after_its_attempts_with_the_engines_reason(monkeypatch):
    monkeypatch.setattr(provider.time, "sleep", lambda s: None)
    api = RefusingApi(refusals=100, message=FREEZE_REFUSAL)
    with pytest.raises(DockerError, match="docker pause failed: .*unable to freeze"):
        engine(api).pause("c1")
    assert api.pauses == provider.FREEZE_ATTEMPTS


def test_pause_does_not_repeat_any_other_refusal(monkeypatch):
    monkeypatch.setattr(provider.time, "sleep", lambda s: None)
    api = RefusingApi(refusals=1, message="Container c1 is not running")
    with pytest.raises(DockerError, match="is not running"):
        engine(api).pause("c1")
    assert api.pauses == 1


def test_an_unreachable_engine_is_named_by_the_innermost_os_error():
    nested = requests.exceptions.ConnectionError(
        urllib3.exceptions.ProtocolError("Connection aborted.", FileNotFoundError(2, "No such file or directory"))
    )
    assert str(provider._unreachable("ps", nested)).startswith(
        "docker ps: Docker engine not reachable (No such file or directory); "
    )
    plain = requests.exceptions.ConnectionError("ssh: connect to host hostb port 22: Connection timed out")
    assert "(ssh: connect to host hostb port 22: Connection timed out)" in str(provider._unreachable(None, plain))


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


class EngineOnASocket(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A Docker engine on a Unix socket that knows one exec: its start answers the upgrade headers and the
    command's whole output in one write, as a client reads it when it comes late to the headers (a loaded
    machine: the command printed and exited before the client read the response)."""

    daemon_threads = True

    def __init__(self, path: str, output: bytes):
        self.output = output

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # a Unix socket's peer has no address to log
                pass

            def answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/containers/c1/exec"):
                    self.answer(201, {"Id": "e1"})
                elif self.path.endswith("/exec/e1/start"):
                    head = b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                    self.wfile.write(head + b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + server.output)
                    self.close_connection = True
                else:
                    self.answer(404, {"message": f"no route {self.path}"})

            def do_GET(self) -> None:
                if self.path.endswith("/exec/e1/json"):
                    self.answer(200, {"ID": "e1", "Running": False, "ExitCode": 0})
                else:
                    self.answer(404, {"message": f"no route {self.path}"})

        server = self
        super().__init__(path, Handler)


@pytest.fixture
def engine_with_output(tmp_path):
    servers = []

    def start(output: bytes) -> provider.Docker:
        path = str(tmp_path / "engine.sock")
        server = EngineOnASocket(path, output)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return engine(docker_sdk.APIClient(base_url=f"unix://{path}", version="1.41"))

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_an_exec_whose_output_came_with_the_response_headers_keeps_all_of_it(engine_with_output):
    # The SDK's exec_start read beneath http.client's buffer: this output was lost, stdout came back empty.
    rows = b"".join(b'{"pid": %d, "ppid": 1, "args": ["python3"], "env": {}}\n' % pid for pid in range(1, 40))
    docker = engine_with_output(frame(1, rows[:700]) + frame(2, b"a warning\n") + frame(1, rows[700:]))
    result = docker.exec("c1", ["python3", "-c", "probe"])
    assert (result.exit_code, result.stdout, result.stderr) == (0, rows.decode(), "a warning\n")


def test_output_frames_are_read_whole_however_the_bytes_are_cut():
    stream = frame(1, b"out one\n") + frame(2, b"err\n") + frame(1, b"") + frame(1, b"out two\n")
    source = io.BytesIO(stream)
    got = list(provider._frames(lambda n: source.read(min(n, 3))))  # reads that return 3 bytes at most
    assert got == [(1, b"out one\n"), (2, b"err\n"), (1, b"out two\n")]


def test_a_stream_that_ends_inside_a_frame_keeps_what_came():
    stream = io.BytesIO(frame(1, b"whole\n") + frame(1, b"cut short")[:-5])
    assert list(provider._frames(stream.read)) == [(1, b"whole\n"), (1, b"cut ")]
