"""A small etcd v3 client over etcd's JSON gateway (``/v3/...``), standard library only.

Why this and not a gRPC client: see the package README ("Client"). In short, the gateway is served
by every etcd 3.4+ on its client port, needs no native wheel (grpcio) and no protobuf, and the
rendezvous needs only range, txn, put, delete, lease grant and one-shot watches.

Rules this client keeps:
- A request that may have reached the server is sent again only when a second copy cannot change
  the outcome: reads, and the rendezvous state's compare-and-set (applied once, the copy's compare
  fails and answers with the state that holds our write; torch's state machine reads it as such).
  Those are sent again when the connection broke under them (etcd killed while the request was in
  flight), at most RESENDS times; a read timeout is never resent. Anything else (an ``add``, which
  must not apply twice) fails on a broken connection. Requests that provably did not reach etcd are
  retried: the connect step failed (then the next endpoint is tried, and all of them again until
  reconnect_timeout: etcd restarting is a pause, not an end), or etcd answered "invalid auth token"
  (then we authenticate again). Without the resend, a read in flight when etcd is killed fails the
  torchrun agent whose monitor loop made it (num_nodes_waiting lets every error through).
- reconnect_timeout bounds the outage, not each call: it runs from the first connect that failed,
  for every call of every thread, until a connect succeeds. Once etcd has been unreachable that
  long, each call tries the endpoints once and fails, so an etcd gone for good ends the agent
  promptly (its monitor call, then its shutdown and close calls) instead of once per call.
- An idle pooled connection that the server has closed (etcd restarted) is detected before reuse.
- One connection per thread: torch's dynamic handler calls the backend from its keep-alive thread
  as well as from the agent's main thread.
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .config import Endpoint, EtcdConfig

# gRPC status codes the gateway returns in {"code": N}.
_GRPC_NOT_FOUND = 5
_GRPC_UNAUTHENTICATED = 16
# Between rounds of connect attempts while etcd is down.
RECONNECT_PAUSE_S = 0.5
RESENDS = 2  # times a resend-safe request goes out again after its connection broke


class EtcdError(Exception):
    """etcd could not be reached, or it refused or failed the request."""


class EtcdConnectionError(EtcdError):
    """No answer: connect failed, the connection broke, or the read timed out."""


class EtcdServerError(EtcdError):
    """etcd answered with an error (gRPC ``code`` and ``message``)."""

    def __init__(self, status: int, code: int | None, message: str) -> None:
        super().__init__(f"etcd answered HTTP {status}, code {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class LeaseNotFoundError(EtcdServerError):
    """The lease a put referred to has expired or was revoked."""


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int = 0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix`` (etcd's rule)."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")),
        value=base64.b64decode(raw.get("value", "")),
        mod_revision=int(raw.get("mod_revision", 0)),
        create_revision=int(raw.get("create_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[dict[str, Any]]

    def range_kvs(self, index: int) -> list[KeyValue]:
        """The key-values of the ``index``-th operation, which must be a range."""
        return [_kv(raw) for raw in self.responses[index].get("response_range", {}).get("kvs", [])]


class _LeaseCache:
    """One lease per client, replaced once it has lived half its TTL.

    A key put with a lease lives at least TTL/2 after its last write, at most TTL. One lease per
    write would leave thousands of leases behind (keep-alive writes every few seconds per node);
    one lease for the whole process would let a long job's keys expire under it.
    """

    def __init__(self, ttl_s: int) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._lease_id = 0
        self._renew_at = 0.0

    def get(self, client: EtcdClient) -> int:
        with self._lock:
            if not self._lease_id or time.monotonic() >= self._renew_at:
                answer = client.call("/v3/lease/grant", {"TTL": str(self.ttl_s)})
                self._lease_id = int(answer["ID"])
                self._renew_at = time.monotonic() + self.ttl_s / 2
            return self._lease_id

    def forget(self, lease_id: int) -> None:
        with self._lock:
            if self._lease_id == lease_id:
                self._lease_id = 0


class EtcdClient:
    """Thread-safe; each thread keeps its own keep-alive HTTP connection."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self._local = threading.local()
        self._endpoint_index = 0
        # When the current outage began (monotonic; None while etcd answers): see _connect_any.
        self._unreachable_since: float | None = None
        self._outage_lock = threading.Lock()
        self._token: str | None = None
        self._auth_lock = threading.Lock()
        self._ssl_context = self._make_ssl_context() if config.protocol == "https" else None
        self._leases = _LeaseCache(config.ttl_s)

    # -- transport --

    def _make_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.config.ca_cert)
        if self.config.ssl_cert:
            context.load_cert_chain(self.config.ssl_cert, self.config.ssl_cert_key)
        return context

    def _new_connection(self, endpoint: Endpoint, read_timeout_s: float | None) -> http.client.HTTPConnection:
        if self._ssl_context is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                endpoint.host, endpoint.port, timeout=self.config.connect_timeout_s, context=self._ssl_context
            )
        else:
            conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=self.config.connect_timeout_s)
        conn.connect()
        conn.sock.settimeout(read_timeout_s)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _connect_any(self, read_timeout_s: float | None) -> http.client.HTTPConnection:
        """Connect to the first endpoint that accepts, starting with the last one that worked; while none
        does (etcd restarting), try again until reconnect_timeout has passed since the outage began: the
        first failed connect of any call, on any thread, since the last one that succeeded."""
        endpoints = self.config.endpoints
        while True:
            began = time.monotonic()
            errors = []
            for step in range(len(endpoints)):
                index = (self._endpoint_index + step) % len(endpoints)
                try:
                    conn = self._new_connection(endpoints[index], read_timeout_s)
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(f"{endpoints[index]}: {exc}")
                    continue
                self._endpoint_index = index
                self._unreachable_since = None
                return conn
            with self._outage_lock:
                if self._unreachable_since is None:
                    self._unreachable_since = began
                since = self._unreachable_since
            now = time.monotonic()
            if now + RECONNECT_PAUSE_S > since + self.config.reconnect_timeout_s:
                raise EtcdConnectionError(
                    f"cannot connect to etcd at {'; '.join(errors)} (unreachable for {now - since:.0f} s, "
                    f"reconnect_timeout={self.config.reconnect_timeout_s:g})"
                )
            time.sleep(RECONNECT_PAUSE_S)

    def _pooled_connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and _closed_by_peer(conn):
            conn.close()
            conn = None
        if conn is None:
            conn = self._connect_any(self.config.read_timeout_s)
            self._local.conn = conn
        return conn

    def _drop_pooled_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        self._drop_pooled_connection()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = self._token
        return headers

    def _post(self, path: str, body: dict[str, Any], resend_safe: bool = False) -> dict[str, Any]:
        sends = 1 + (RESENDS if resend_safe else 0)
        for send in range(sends):
            conn = self._pooled_connection()  # after a broken one: waits for etcd, up to reconnect_timeout
            try:
                conn.request("POST", path, json.dumps(body), self._headers())
                response = conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop_pooled_connection()
                if send + 1 < sends and not isinstance(exc, TimeoutError):
                    continue
                raise EtcdConnectionError(f"etcd request {path} failed: {exc!r}") from exc
            return _decode_answer(response.status, payload)
        raise AssertionError("unreachable: the last send returns or raises")

    def call(self, path: str, body: dict[str, Any], resend_safe: bool = False) -> dict[str, Any]:
        """POST one gateway request; authenticates first (and once more if the token expired).
        ``resend_safe``: a second copy cannot change the outcome (see the module's rules)."""
        if self.config.user is not None and self._token is None:
            self._authenticate()
        try:
            return self._post(path, body, resend_safe)
        except EtcdServerError as exc:
            if exc.code != _GRPC_UNAUTHENTICATED or self.config.user is None:
                raise
        # Refused for the token, so not applied: safe to send again with a fresh one.
        self._authenticate()
        return self._post(path, body, resend_safe)

    def _authenticate(self) -> None:
        with self._auth_lock:
            self._token = None
            answer = self._post("/v3/auth/authenticate", {"name": self.config.user, "password": self.config.password})
            self._token = answer["token"]

    # -- key-value --

    def get(self, key: bytes) -> KeyValue | None:
        kvs = self.range(key)
        return kvs[0] if kvs else None

    def range(self, key: bytes, range_end: bytes | None = None, count_only: bool = False) -> list[KeyValue]:
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        if count_only:
            body["count_only"] = True
        answer = self.call("/v3/kv/range", body, resend_safe=True)
        if count_only:
            return [KeyValue(b"", b"", 0, 0)] * int(answer.get("count", 0))
        return [_kv(raw) for raw in answer.get("kvs", [])]

    def put(self, key: bytes, value: bytes, leased: bool = False) -> int:
        """Put unconditionally; returns the new revision."""
        return self.txn([], [put_op(key, value)], [], leased=leased).revision

    def delete(self, key: bytes, range_end: bytes | None = None) -> int:
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        return int(self.call("/v3/kv/deleterange", body).get("deleted", 0))

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]],
        leased: bool = False,
        resend_safe: bool = False,
    ) -> TxnResult:
        """One atomic transaction. ``leased``: every put in it carries this client's current lease.
        ``resend_safe``: the caller reads a second copy's answer right (see the module's rules)."""
        for _attempt in range(2):
            lease_id = self._leases.get(self) if leased else 0
            body = {
                "compare": compare,
                "success": [_with_lease(op, lease_id) for op in success],
                "failure": [_with_lease(op, lease_id) for op in failure],
            }
            try:
                answer = self.call("/v3/kv/txn", body, resend_safe=resend_safe)
            except LeaseNotFoundError:
                # Expired or revoked (e.g. etcd lost its data); etcd rejected the txn whole: grant anew and resend.
                self._leases.forget(lease_id)
                continue
            return TxnResult(
                succeeded=bool(answer.get("succeeded", False)),
                revision=int(answer.get("header", {}).get("revision", 0)),
                responses=answer.get("responses", []),
            )
        raise LeaseNotFoundError(404, _GRPC_NOT_FOUND, "the lease was lost twice in a row")

    def watch_once(self, key: bytes, range_end: bytes | None, start_revision: int, timeout_s: float) -> bool:
        """Wait until a key in the range changes at or after ``start_revision``; False on timeout.

        Uses a connection of its own, dropped afterwards: the gateway streams the watch as one
        endless response, so the connection cannot go back to the pool.
        """
        if self.config.user is not None and self._token is None:
            self._authenticate()
        create: dict[str, Any] = {"key": b64(key), "start_revision": str(start_revision)}
        if range_end is not None:
            create["range_end"] = b64(range_end)
        deadline = time.monotonic() + timeout_s
        conn = self._connect_any(max(timeout_s, 0.001))
        sock = conn.sock
        try:
            conn.request("POST", "/v3/watch", json.dumps({"create_request": create}), self._headers())
            response = conn.getresponse()
            if response.status != 200:
                _decode_answer(response.status, response.read())
            for message in _json_lines(response, sock, deadline):
                result = message.get("result", {})
                if "error" in message:
                    raise EtcdServerError(response.status, message["error"].get("code"), str(message["error"]))
                if result.get("events") or result.get("canceled") or result.get("compact_revision"):
                    return True  # an event, or the watch ended (compaction): the caller reads again
            return False
        except TimeoutError:
            return False
        except (OSError, http.client.HTTPException) as exc:
            raise EtcdConnectionError(f"etcd watch failed: {exc!r}") from exc
        finally:
            conn.close()


def put_op(key: bytes, value: bytes) -> dict[str, Any]:
    return {"request_put": {"key": b64(key), "value": b64(value)}}


def range_op(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def mod_revision_is(key: bytes, revision: int) -> dict[str, Any]:
    """Compare: the key was last modified at ``revision`` (0: the key does not exist)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def _with_lease(op: dict[str, Any], lease_id: int) -> dict[str, Any]:
    if lease_id and "request_put" in op:
        return {"request_put": {**op["request_put"], "lease": str(lease_id)}}
    return op


def _decode_answer(status: int, payload: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(payload) if payload else {}
    except ValueError:
        raise EtcdServerError(status, None, f"not JSON: {payload[:200]!r}") from None
    if status == 200 and "error" not in answer:
        return answer
    code = answer.get("code")
    message = str(answer.get("message") or answer.get("error") or payload[:200])
    if code == _GRPC_NOT_FOUND and "lease not found" in message:
        raise LeaseNotFoundError(status, code, message)
    raise EtcdServerError(status, code, message)


def _json_lines(response: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> Iterator[dict[str, Any]]:
    """The gateway's stream: one JSON object per line, until ``deadline``."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        sock.settimeout(remaining)
        line = response.readline()
        if not line:
            raise EtcdConnectionError("etcd closed the watch stream")
        if line.strip():
            yield json.loads(line)


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """True if an idle connection has been closed by the server (readable at EOF, or reset)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        if isinstance(sock, ssl.SSLSocket):
            return True  # cannot peek through TLS; a fresh connection is the safe choice
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True
