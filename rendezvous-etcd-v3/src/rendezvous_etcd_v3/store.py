"""A ``torch.distributed.Store`` kept in etcd v3: what the agents share beside the rendezvous state.

Why a store in etcd (and not a TCPStore on one agent, as c10d does): etcd is the one service the
job already depends on and runs highly available; a TCPStore hosted by an agent would make that
agent a single point of failure, which is what users pick etcd to avoid. torch's etcd-v2 backend
makes the same choice with its ``EtcdStore``; this is its v3 counterpart.

Differences from ``EtcdStore``, each deliberate:
- keys and values are stored as raw bytes (v3 keys are bytes, no base64 needed);
- every key carries the client's rotating lease (``ttl``), so a finished job's keys go away;
- a timeout raises ``torch.distributed.DistStoreError``, as ``TCPStore`` does and as torch's
  barrier code expects (``EtcdStore`` raises ``LookupError``);
- an etcd failure raises ``torch.distributed.DistNetworkError``;
- it also has ``compare_set`` (TCPStore's semantics), ``delete_key`` and ``num_keys``.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

from torch.distributed import DistNetworkError, DistStoreError, Store

from .client import EtcdClient, EtcdError, KeyValue, mod_revision_is, prefix_end, put_op, range_op

# A compare-and-set lost to other writers this many times in a row fails (DistStoreError) instead of
# retrying without bound: many contenders, or a writer that keeps changing the key.
MAX_CAS_ATTEMPTS = 1000


class EtcdV3Store(Store):
    def __init__(self, client: EtcdClient, timeout: timedelta | None = None) -> None:
        super().__init__()  # the pybind11 trampoline needs it
        self._client = client
        self._prefix = client.config.store_prefix
        if timeout is not None:
            self.set_timeout(timeout)

    def set(self, key: str | bytes, value: str | bytes) -> None:
        with _as_store_errors("set"):
            self._client.put(self._etcd_key(key), _bytes(value), leased=True)

    def get(self, key: str | bytes) -> bytes:
        """The value, waiting up to the store's timeout for the key to appear."""
        etcd_key = self._etcd_key(key)
        return self._wait_for([etcd_key], self.timeout, f"get({_text(key)!r})")[etcd_key]

    def wait(self, keys: Iterable[str | bytes], override_timeout: timedelta | None = None) -> None:
        timeout = self.timeout if override_timeout is None else override_timeout
        names = list(keys)
        self._wait_for([self._etcd_key(key) for key in names], timeout, f"wait({[_text(k) for k in names]})")

    def check(self, keys: Iterable[str | bytes]) -> bool:
        etcd_keys = [self._etcd_key(key) for key in keys]
        with _as_store_errors("check"):
            found, _revision = self._read(etcd_keys)
        return len(found) == len(etcd_keys)

    def add(self, key: str | bytes, amount: int) -> int:
        """Add to the decimal integer at ``key`` (missing: 0) atomically; returns the new value."""

        def increment(current: KeyValue | None) -> bytes:
            return str((int(current.value) if current is not None else 0) + amount).encode()

        return int(self._update(self._etcd_key(key), increment, "add"))

    def compare_set(self, key: str | bytes, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        """TCPStore's semantics: set ``desired`` if the value is ``expected`` (missing counts as ``b""``).

        Returns the value after the call; for a missing key and a non-empty ``expected``, returns
        ``expected`` and sets nothing, as TCPStore does.
        """
        expected, desired = _bytes(expected_value), _bytes(desired_value)

        def swap(current: KeyValue | None) -> bytes | None:
            if current is None:
                return desired if expected == b"" else None
            return desired if current.value == expected else None

        etcd_key = self._etcd_key(key)
        result = self._update(etcd_key, swap, "compare_set")
        return expected if result is None else result

    def delete_key(self, key: str | bytes) -> bool:
        with _as_store_errors("delete_key"):
            return self._client.delete(self._etcd_key(key)) > 0

    def num_keys(self) -> int:
        with _as_store_errors("num_keys"):
            return len(self._client.range(self._prefix, prefix_end(self._prefix), count_only=True))

    # -- helpers --

    def _etcd_key(self, key: str | bytes) -> bytes:
        return self._prefix + _bytes(key)

    def _read(self, etcd_keys: list[bytes]) -> tuple[dict[bytes, bytes], int]:
        """The keys that exist and their values, read at one revision; and that revision."""
        result = self._client.txn([], [range_op(key) for key in etcd_keys], [])
        found = {}
        for index, key in enumerate(etcd_keys):
            for kv in result.range_kvs(index):
                found[key] = kv.value
        return found, result.revision

    def _wait_for(self, etcd_keys: list[bytes], timeout: timedelta, what: str) -> dict[bytes, bytes]:
        deadline = time.monotonic() + timeout.total_seconds()
        with _as_store_errors(what):
            while True:
                found, revision = self._read(etcd_keys)
                if len(found) == len(etcd_keys):
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [
                        key[len(self._prefix) :].decode(errors="replace") for key in etcd_keys if key not in found
                    ]
                    raise DistStoreError(f"{what}: timed out after {timeout} waiting for keys {missing} in etcd")
                # Any change under the store's prefix since our read wakes us; then read again.
                self._client.watch_once(self._prefix, prefix_end(self._prefix), revision + 1, remaining)

    def _update(self, etcd_key: bytes, compute: Callable[[KeyValue | None], bytes | None], what: str) -> bytes | None:
        """Read, compute the new value, write it if the key is unchanged since the read; retry on a lost race.

        ``compute`` returns None to leave the key as it is; then the current value is returned.
        """
        with _as_store_errors(what):
            for _ in range(MAX_CAS_ATTEMPTS):
                current = self._client.get(etcd_key)
                new_value = compute(current)
                if new_value is None:
                    return None if current is None else current.value
                revision = 0 if current is None else current.mod_revision
                result = self._client.txn(
                    [mod_revision_is(etcd_key, revision)], [put_op(etcd_key, new_value)], [], leased=True
                )
                if result.succeeded:
                    return new_value
                time.sleep(random.uniform(0, 0.01))  # lost a race: spread the retries a little
            key = etcd_key[len(self._prefix) :].decode(errors="replace")
            raise DistStoreError(
                f"{what}: key {key!r} changed under {MAX_CAS_ATTEMPTS} compare-and-set attempts in a row"
            )


@contextlib.contextmanager
def _as_store_errors(what: str) -> Iterator[None]:
    """Turns an etcd failure into the ``DistNetworkError`` that torch's stores raise when the server is gone."""
    try:
        yield
    except EtcdError as exc:
        raise DistNetworkError(f"EtcdV3Store.{what}: {exc}") from exc


def _bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise ValueError(f"store keys and values are str or bytes, not {type(value).__name__}")


def _text(key: str | bytes) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else key
