"""torch's ``RendezvousBackend`` on etcd v3: the state is one key, written by compare-and-set on its mod revision.

Return values, token handling and error mapping mirror torch's ``EtcdRendezvousBackend`` (etcd-v2):
the token is the key's revision (an int), a token that is not an int is answered with the current
state and ``False``, every etcd failure is a ``RendezvousConnectionError`` and an undecodable state a
``RendezvousStateError``. The value is the base64 text of the state, as etcd-v2 writes it.
"""

from __future__ import annotations

import binascii
from base64 import b64decode, b64encode

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from .client import EtcdClient, EtcdError, KeyValue, mod_revision_is, put_op, range_op

BACKEND_NAME = "etcd-v3"


class EtcdV3RendezvousBackend(RendezvousBackend):
    """The rendezvous state of ``run_id`` at ``<key_prefix>/rendezvous/<run_id>``, kept ``ttl`` after its last write."""

    def __init__(self, client: EtcdClient, run_id: str) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        self._client = client
        self._key = client.config.rendezvous_prefix + run_id.encode()

    @property
    def name(self) -> str:
        return BACKEND_NAME

    @property
    def key(self) -> bytes:
        return self._key

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            kv = self._client.get(self._key)
        except EtcdError as exc:
            raise _connection_error(exc) from exc
        return None if kv is None else _decode_state(kv)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        revision = 0  # compare "mod revision 0": the key must not exist yet
        if token:
            try:
                revision = int(token)
            except (TypeError, ValueError):
                # Not a token we hand out, so it cannot match: answer with the current state.
                return self._current_state_not_set()
        try:
            result = self._client.txn(
                compare=[mod_revision_is(self._key, revision)],
                success=[put_op(self._key, b64encode(state))],
                failure=[range_op(self._key)],
                leased=True,
                resend_safe=True,  # a copy's failed compare answers with the state that holds this write
            )
        except EtcdError as exc:
            raise _connection_error(exc) from exc
        if result.succeeded:
            return state, result.revision, True
        kvs = result.range_kvs(0)
        if not kvs:
            return None
        return *_decode_state(kvs[0]), False

    def _current_state_not_set(self) -> tuple[bytes, Token, bool] | None:
        current = self.get_state()
        return None if current is None else (*current, False)


def _decode_state(kv: KeyValue) -> tuple[bytes, Token]:
    try:
        state = b64decode(kv.value, validate=True)
    except binascii.Error as exc:
        raise RendezvousStateError("The state object is corrupt. See inner exception for details.") from exc
    return state, kv.mod_revision


def _connection_error(exc: EtcdError) -> RendezvousConnectionError:
    return RendezvousConnectionError(f"The connection to etcd has failed: {exc}")
