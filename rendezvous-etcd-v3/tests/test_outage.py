"""etcd unreachable: reconnect_timeout bounds the outage, not each call, so an etcd gone for good ends the
agent promptly while a restart shorter than reconnect_timeout is ridden out (a real etcd, stopped and started)."""

import threading
import time

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from rendezvous_etcd_v3 import EtcdV3RendezvousBackend

RECONNECT_S = 3.0


@pytest.fixture
def backend(own_etcd_server, make_client):
    client = make_client(own_etcd_server, connect_timeout="1", reconnect_timeout=str(RECONNECT_S))
    backend = EtcdV3RendezvousBackend(client, "outage")
    backend.set_state(b"v1")
    return backend


def _seconds_to_fail(call) -> float:
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError):
        call()
    return time.monotonic() - started


def _in_threads(call, count: int) -> list:
    """``call()`` in ``count`` threads at once; what each returned or raised."""
    results: list = [None] * count

    def run(index: int) -> None:
        try:
            results[index] = call()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def test_after_reconnect_timeout_every_call_fails_at_once(own_etcd_server, backend):
    own_etcd_server.stop()
    assert RECONNECT_S - 0.6 <= _seconds_to_fail(backend.get_state) < RECONNECT_S + 2
    # The outage has lasted reconnect_timeout: later calls, of any thread, try once and fail.
    assert _seconds_to_fail(backend.get_state) < 0.5
    assert _seconds_to_fail(lambda: backend.set_state(b"v2", 1)) < 0.5
    started = time.monotonic()
    results = _in_threads(backend.get_state, 3)
    assert all(isinstance(result, RendezvousConnectionError) for result in results)
    assert time.monotonic() - started < 1.0
    assert "reconnect_timeout=3" in str(results[0])


def test_etcd_back_ends_the_outage_and_the_next_one_gets_the_whole_wait(own_etcd_server, backend):
    own_etcd_server.stop()
    _seconds_to_fail(backend.get_state)
    own_etcd_server.start()
    assert backend.get_state()[0] == b"v1"
    own_etcd_server.stop()
    restarter = threading.Timer(RECONNECT_S / 2, own_etcd_server.start)
    restarter.start()
    try:
        started = time.monotonic()
        assert backend.get_state()[0] == b"v1"  # a fresh outage: waited for, not failed at once
        assert time.monotonic() - started >= RECONNECT_S / 2 - 0.5
    finally:
        restarter.join()


def test_calls_of_several_threads_ride_out_a_restart_shorter_than_reconnect_timeout(own_etcd_server, backend):
    own_etcd_server.stop()
    restarter = threading.Timer(RECONNECT_S / 2, own_etcd_server.start)
    restarter.start()
    try:
        results = _in_threads(backend.get_state, 3)
    finally:
        restarter.join()
    assert [result[0] for result in results] == [b"v1"] * 3


def test_handler_on_an_etcd_gone_for_good_fails_then_shuts_down_promptly(own_etcd_server, key_prefix, monkeypatch):
    """What a torchrun agent does when etcd dies for good: its keep-alive thread and its monitor call
    (num_nodes_waiting) fail once the outage has lasted reconnect_timeout, and the shutdown that follows
    (torch closes the rendezvous) fails at once instead of waiting reconnect_timeout again."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    params = RendezvousParameters(
        backend="etcd-v3", endpoint=own_etcd_server.endpoint, run_id="gone", min_nodes=1, max_nodes=1,
        key_prefix=key_prefix, last_call_timeout="1", join_timeout="30", keep_alive_interval="1",
        connect_timeout="1", reconnect_timeout=str(RECONNECT_S),
    )  # fmt: skip
    handler = get_rendezvous_handler(params)
    handler.next_rendezvous()  # starts the keep-alive thread
    try:
        assert handler.num_nodes_waiting() == 0
        own_etcd_server.stop()
        time.sleep(1.5)  # a keep-alive call now waits for etcd, holding torch's heartbeat lock
        started = time.monotonic()
        with pytest.raises(RendezvousConnectionError):
            handler.num_nodes_waiting()
        assert time.monotonic() - started < RECONNECT_S + 1
        started = time.monotonic()
        assert handler.shutdown() is False  # torch logs the failed close and the agent exits
        assert time.monotonic() - started < 1.0
    finally:
        handler.shutdown()
