"""The rendezvous backend against a real etcd: CAS semantics, races, leases, restarts, data loss, a frozen server."""

import multiprocessing
import pickle
import threading
import time

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError

from rendezvous_etcd_v3 import EtcdClient, EtcdConfig, EtcdV3RendezvousBackend


@pytest.fixture
def backend(make_client):
    return EtcdV3RendezvousBackend(make_client(), "run1")


def test_name_and_key(backend, key_prefix):
    assert backend.name == "etcd-v3"
    assert backend.key == f"{key_prefix}/rendezvous/run1".encode()


def test_server_has_no_v2_api(etcd_server):
    assert etcd_server.v2_api_status() == 404


def test_get_state_of_a_new_run_is_none(backend):
    assert backend.get_state() is None


def test_set_without_token_creates_once(backend):
    state, token, has_set = backend.set_state(b"first")
    assert (state, has_set) == (b"first", True)
    assert isinstance(token, int) and token > 0
    assert backend.get_state() == (b"first", token)
    # The state exists now: a second token-less set loses and gets the current state.
    assert backend.set_state(b"second") == (b"first", token, False)


def test_set_with_current_token_wins_and_stale_token_loses(backend):
    _, token1, _ = backend.set_state(b"v1")
    state, token2, has_set = backend.set_state(b"v2", token1)
    assert (state, has_set) == (b"v2", True) and token2 > token1
    assert backend.set_state(b"v3", token1) == (b"v2", token2, False)
    assert backend.get_state() == (b"v2", token2)


def test_tokens_that_are_not_ours(backend):
    assert backend.set_state(b"x", "not-a-revision") is None  # nothing stored yet
    _, token, _ = backend.set_state(b"v1")
    assert backend.set_state(b"x", "not-a-revision") == (b"v1", token, False)
    assert backend.set_state(b"x", object()) == (b"v1", token, False)
    # A numeric string is a revision (etcd-v2 does the same with its index).
    assert backend.set_state(b"v2", str(token))[2] is True


def test_token_for_a_missing_state_returns_none(backend):
    assert backend.set_state(b"x", 12345) is None
    assert backend.get_state() is None


def test_corrupt_state_raises_state_error(backend, make_client):
    make_client().put(backend.key, b"%%% not base64 %%%")
    with pytest.raises(RendezvousStateError):
        backend.get_state()


def test_state_is_base64_text_with_a_lease(backend, make_client):
    backend.set_state(b"\x00\x01binary")
    kv = make_client().get(backend.key)
    assert kv.value == b"AAFiaW5hcnk="
    assert kv.lease != 0


def test_cas_race_between_threads_one_winner_per_round(make_client):
    clients = 8
    backends = [EtcdV3RendezvousBackend(make_client(), "race") for _ in range(clients)]
    _, token, _ = backends[0].set_state(b"round-0")
    barrier = threading.Barrier(clients)
    for round_no in range(1, 16):
        results = [None] * clients

        def contend(i, token=token, round_no=round_no, results=results):
            barrier.wait()
            results[i] = backends[i].set_state(f"round-{round_no}-by-{i}".encode(), token)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [i for i, (_, _, has_set) in enumerate(results) if has_set]
        assert len(winners) == 1, results
        winning_state, token = results[winners[0]][:2]
        # Every loser was told the winner's state and token.
        assert all(result[:2] == (winning_state, token) for result in results)


def _increment_many(endpoint, key_prefix, times, queue):
    backend = EtcdV3RendezvousBackend(EtcdClient(EtcdConfig.from_rdzv(endpoint, {"key_prefix": key_prefix})), "proc")
    wins = 0
    while wins < times:
        current = backend.get_state()
        value, token = (pickle.loads(current[0]), current[1]) if current else (0, None)
        _, _, has_set = backend.set_state(pickle.dumps(value + 1), token)
        wins += has_set
    queue.put(wins)


def test_cas_race_between_processes_loses_no_update(etcd_server, key_prefix, make_client):
    processes, times = 4, 40
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    workers = [
        context.Process(target=_increment_many, args=(etcd_server.endpoint, key_prefix, times, queue))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert sum(queue.get() for _ in workers) == processes * times
    state, _ = EtcdV3RendezvousBackend(make_client(), "proc").get_state()
    assert pickle.loads(state) == processes * times


def test_state_expires_ttl_after_the_last_write(make_client):
    backend = EtcdV3RendezvousBackend(make_client(ttl="3"), "short")
    backend.set_state(b"v1")
    time.sleep(4.5)
    assert backend.get_state() is None


def test_lost_lease_is_replaced(make_client):
    client = make_client()
    backend = EtcdV3RendezvousBackend(client, "leased")
    _, token, _ = backend.set_state(b"v1")
    lease = client.get(backend.key).lease
    client.call("/v3/lease/revoke", {"ID": str(lease)})  # etcd deletes the lease's keys
    assert backend.get_state() is None
    assert backend.set_state(b"v2", token) is None  # the token's key is gone
    state, _, has_set = backend.set_state(b"v2")
    assert (state, has_set) == (b"v2", True)
    assert client.get(backend.key).lease not in (0, lease)


def test_etcd_restart_maps_to_connection_error_then_resumes(own_etcd_server, make_client):
    conf = {"connect_timeout": "1", "reconnect_timeout": "0"}  # give up at once: etcd stays down here
    backend = EtcdV3RendezvousBackend(make_client(own_etcd_server, **conf), "restart")
    _, token, _ = backend.set_state(b"before")
    own_etcd_server.stop()
    with pytest.raises(RendezvousConnectionError):
        backend.get_state()
    with pytest.raises(RendezvousConnectionError):
        backend.set_state(b"during", token)
    own_etcd_server.start()
    assert backend.get_state() == (b"before", token)
    assert backend.set_state(b"after", token)[::2] == (b"after", True)


def test_a_call_while_etcd_restarts_waits_for_it(own_etcd_server, make_client):
    """etcd down for 2 s (a restart): the call connects once it is back, within reconnect_timeout."""
    backend = EtcdV3RendezvousBackend(make_client(own_etcd_server, reconnect_timeout="20"), "restarting")
    _, token, _ = backend.set_state(b"before")
    own_etcd_server.stop()
    backend._client.close()  # the pooled connection is gone with the server
    restarter = threading.Timer(2.0, own_etcd_server.start)
    restarter.start()
    try:
        started = time.monotonic()
        assert backend.get_state() == (b"before", token)
        assert time.monotonic() - started >= 1.5
    finally:
        restarter.join()


def test_etcd_restart_between_calls_needs_no_retry(own_etcd_server, make_client):
    """The pooled connection the old server closed is noticed before use: no error at all."""
    backend = EtcdV3RendezvousBackend(make_client(own_etcd_server), "pool")
    _, token, _ = backend.set_state(b"v1")
    own_etcd_server.restart()
    assert backend.set_state(b"v2", token)[2] is True


def test_etcd_data_loss_starts_a_fresh_state(own_etcd_server, make_client):
    backend = EtcdV3RendezvousBackend(make_client(own_etcd_server), "wiped")
    _, token, _ = backend.set_state(b"v1")
    own_etcd_server.wipe()
    assert backend.get_state() is None
    assert backend.set_state(b"v2", token) is None
    assert backend.set_state(b"v2")[::2] == (b"v2", True)  # the old lease is gone too: a new one is granted


def test_frozen_etcd_times_out_as_connection_error(own_etcd_server, make_client):
    backend = EtcdV3RendezvousBackend(make_client(own_etcd_server, read_timeout="1"), "frozen")
    backend.set_state(b"v1")
    own_etcd_server.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(RendezvousConnectionError):
            backend.get_state()
        assert time.monotonic() - started < 5
    finally:
        own_etcd_server.thaw()
    assert backend.get_state()[0] == b"v1"


def test_failover_to_the_next_endpoint(etcd_server, key_prefix, unused_endpoint):
    endpoints = f"{unused_endpoint},{etcd_server.endpoint}"
    client = EtcdClient(EtcdConfig.from_rdzv(endpoints, {"key_prefix": key_prefix}))
    backend = EtcdV3RendezvousBackend(client, "failover")
    assert backend.set_state(b"v1")[2] is True
