"""A connection that breaks under a request in flight (etcd killed mid-call): reads and the state's
compare-and-set go out again, an ``add`` never does. Against a real etcd; the transport breaks exactly
once, before or after etcd has applied the request. (In the tour-v3 scenario, a read of an agent's
monitor loop in flight when etcd was killed failed the agent: torch lets num_nodes_waiting's errors
through.)"""

import http.client
from datetime import timedelta

import pytest
import torch.distributed as dist

from rendezvous_etcd_v3 import EtcdV3RendezvousBackend, EtcdV3Store


class BreakOnce:
    """Breaks the connection under the first request to ``path``: with ``applied=False`` before it
    leaves (etcd never sees it), with ``applied=True`` after etcd has answered (the answer is lost).
    Only the transport is touched: etcd is real and really applies what reaches it."""

    def __init__(self, monkeypatch, path: str, applied: bool) -> None:
        self.path = path
        self.applied = applied
        self.broken = 0
        real_request = http.client.HTTPConnection.request
        real_getresponse = http.client.HTTPConnection.getresponse
        relay = self

        def request(conn, method, url, *args, **kwargs):
            conn._sim_url = url
            if url == relay.path and not relay.applied and not relay.broken:
                relay.broken += 1
                raise ConnectionResetError(104, "Connection reset by peer (test)")
            return real_request(conn, method, url, *args, **kwargs)

        def getresponse(conn):
            response = real_getresponse(conn)
            if getattr(conn, "_sim_url", None) == relay.path and relay.applied and not relay.broken:
                response.read()  # etcd has applied the request and answered
                relay.broken += 1
                raise http.client.RemoteDisconnected("Remote end closed connection without response (test)")
            return response

        monkeypatch.setattr(http.client.HTTPConnection, "request", request)
        monkeypatch.setattr(http.client.HTTPConnection, "getresponse", getresponse)


@pytest.mark.parametrize("applied", [False, True])
def test_a_read_whose_connection_broke_is_sent_again(monkeypatch, make_client, applied):
    EtcdV3RendezvousBackend(make_client(), "read").set_state(b"v1")
    broken = BreakOnce(monkeypatch, "/v3/kv/range", applied)
    assert EtcdV3RendezvousBackend(make_client(), "read").get_state()[0] == b"v1"
    assert broken.broken == 1


@pytest.mark.parametrize("applied", [False, True])
def test_a_state_write_whose_connection_broke_is_sent_again(monkeypatch, make_client, applied):
    """Lost before etcd: the copy applies (set by this call). Applied, its answer lost: the copy's compare
    fails and the answer is the state holding this write, not set by this call, which is how torch's
    state holder takes a write someone else made."""
    backend = EtcdV3RendezvousBackend(make_client(), f"cas-{applied}")
    broken = BreakOnce(monkeypatch, "/v3/kv/txn", applied)
    state, token, has_set = backend.set_state(b"mine")
    assert (state, has_set, broken.broken) == (b"mine", not applied, 1)
    assert EtcdV3RendezvousBackend(make_client(), f"cas-{applied}").get_state() == (b"mine", token)


def test_an_add_whose_answer_was_lost_fails_and_applies_once(monkeypatch, make_client):
    store = EtcdV3Store(make_client(), timeout=timedelta(seconds=5))
    broken = BreakOnce(monkeypatch, "/v3/kv/txn", applied=True)
    with pytest.raises(dist.DistNetworkError):
        store.add("counter", 1)
    assert broken.broken == 1
    assert store.add("counter", 0) == 1
