"""The etcd v3 store against a real etcd: what torch's agents call on it, and TCPStore's semantics where it has them."""

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.utils import store as store_util

from rendezvous_etcd_v3 import EtcdV3Store


@pytest.fixture
def store(make_client):
    return EtcdV3Store(make_client(), timeout=timedelta(seconds=5))


def _later(seconds, action):
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_set_get_bytes_and_str(store):
    store.set("a", b"\x00\xff")
    store.set(b"b", "text")
    assert store.get("a") == b"\x00\xff"
    assert store.get("b") == b"text"


def test_get_waits_for_a_key_set_later(store, make_client):
    other = EtcdV3Store(make_client())
    _later(0.5, lambda: other.set("late", b"here"))
    started = time.monotonic()
    assert store.get("late") == b"here"
    assert 0.4 < time.monotonic() - started < 3


def test_get_and_wait_time_out_with_dist_store_error(store):
    store.set_timeout(timedelta(seconds=0.5))
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="missing"):
        store.get("missing")
    assert 0.4 < time.monotonic() - started < 2
    store.set("present", b"1")
    with pytest.raises(dist.DistStoreError):
        store.wait(["present", "absent"], timedelta(seconds=0.2))


def test_wait_for_several_keys(store, make_client):
    other = EtcdV3Store(make_client())
    _later(0.2, lambda: other.set("k1", b"1"))
    _later(0.6, lambda: other.set("k2", b"2"))
    store.wait(["k1", "k2"])
    assert store.check(["k1", "k2"])


def test_check_does_not_wait(store):
    started = time.monotonic()
    assert store.check(["nothing"]) is False
    assert time.monotonic() - started < 0.5
    store.set("x", b"1")
    assert store.check(["x"]) and not store.check(["x", "nothing"])


def test_add_starts_at_zero_and_is_atomic_across_clients(make_client):
    stores = [EtcdV3Store(make_client()) for _ in range(6)]
    assert stores[0].add("solo", 5) == 5 and stores[0].add("solo", -2) == 3
    seen = []

    def bump(store):
        for _ in range(20):
            seen.append(store.add("counter", 1))

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == list(range(1, 121))  # every increment applied once, each result unique
    assert stores[0].get("counter") == b"120"


def test_compare_set_follows_tcp_store(store):
    tcp = dist.HashStore()  # the same semantics as TCPStore, in memory
    cases = [("k", "", "first"), ("k", "wrong", "x"), ("k", "first", "second"), ("absent", "nonempty", "x")]
    for key, expected, desired in cases:
        assert store.compare_set(key, expected, desired) == tcp.compare_set(key, expected, desired), (key, expected)
    assert store.get("k") == b"second"
    assert not store.check(["absent"])


def test_delete_key_and_num_keys(store):
    assert store.num_keys() == 0
    store.set("a", b"1")
    store.set("b", b"2")
    assert store.num_keys() == 2
    assert store.delete_key("a") is True and store.delete_key("a") is False
    assert store.num_keys() == 1


def test_prefix_store_as_torch_wraps_it(store):
    prefixed = dist.PrefixStore("torch.rendezvous.run.0", store)
    prefixed.multi_set(["x", "y"], [b"1", b"2"])
    assert prefixed.multi_get(["x", "y"]) == [b"1", b"2"]
    assert prefixed.add("n", 3) == 3
    assert store.get("torch.rendezvous.run.0/x") == b"1"


def test_torch_barrier_over_the_store(make_client):
    """The agents' exit barrier (torch.distributed.elastic.utils.store.barrier) on four stores."""
    world = 4
    stores = [EtcdV3Store(make_client()) for _ in range(world)]
    errors = []

    def member(rank):
        try:
            store_util.barrier(stores[rank], world, key_prefix="exit/", barrier_timeout=20, rank=rank)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_store_keys_carry_the_lease(store, make_client, key_prefix):
    store.set("leased", b"1")
    kv = make_client().get(f"{key_prefix}/store/leased".encode())
    assert kv.lease != 0


def test_etcd_down_raises_dist_network_error_then_resumes(own_etcd_server, make_client):
    store = EtcdV3Store(
        make_client(own_etcd_server, connect_timeout="1", reconnect_timeout="0"), timeout=timedelta(seconds=5)
    )
    store.set("k", b"v")
    own_etcd_server.stop()
    with pytest.raises(dist.DistNetworkError):
        store.get("k")
    with pytest.raises(dist.DistNetworkError):
        store.add("n", 1)
    own_etcd_server.start()
    assert store.get("k") == b"v"
    assert store.add("n", 1) == 1


def test_wait_across_a_restart_fails_fast_not_at_its_timeout(own_etcd_server, make_client):
    store = EtcdV3Store(
        make_client(own_etcd_server, connect_timeout="1", reconnect_timeout="0"), timeout=timedelta(seconds=60)
    )
    _later(0.5, own_etcd_server.stop)
    started = time.monotonic()
    with pytest.raises(dist.DistNetworkError):
        store.wait(["never"])
    assert time.monotonic() - started < 10


def test_a_compare_and_set_lost_every_time_fails_instead_of_retrying_forever(monkeypatch):
    """The compare-and-set retries are bounded: a key that another writer changes under every attempt."""
    from types import SimpleNamespace

    from rendezvous_etcd_v3 import store as store_mod
    from rendezvous_etcd_v3.config import Endpoint, EtcdConfig

    attempts = []

    class Contended:
        config = EtcdConfig(endpoints=(Endpoint("127.0.0.1", 2379),))

        def get(self, key):
            return SimpleNamespace(value=b"1", mod_revision=len(attempts) + 1)

        def txn(self, *args, **kwargs):
            attempts.append(1)
            return SimpleNamespace(succeeded=False)  # another writer got there first

    monkeypatch.setattr(store_mod, "MAX_CAS_ATTEMPTS", 5)
    monkeypatch.setattr(store_mod.time, "sleep", lambda s: None)
    with pytest.raises(dist.DistStoreError, match="changed under 5 compare-and-set attempts"):
        store_mod.EtcdV3Store(Contended()).add("n", 1)
    assert len(attempts) == 5
