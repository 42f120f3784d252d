"""Registration through ``torchrun.handlers`` and a whole rendezvous of torch's dynamic handler on etcd v3."""

import threading
import time
from importlib.metadata import entry_points

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from rendezvous_etcd_v3 import ConfigError


def _params(endpoint, key_prefix, run_id="job", nodes=2, **conf):
    return RendezvousParameters(
        backend="etcd-v3", endpoint=endpoint, run_id=run_id, min_nodes=nodes, max_nodes=nodes,
        key_prefix=key_prefix, last_call_timeout="1", join_timeout="60", **conf,
    )  # fmt: skip


def test_entry_point_is_registered():
    names = [ep.name for ep in entry_points(group="torchrun.handlers")]
    assert "etcd-v3" in names


def test_registry_builds_a_dynamic_handler(etcd_server, key_prefix):
    handler = get_rendezvous_handler(_params(etcd_server.endpoint, key_prefix))
    assert isinstance(handler, DynamicRendezvousHandler)
    assert handler.get_backend() == "etcd-v3"


def test_bad_conf_is_one_clear_line(etcd_server, key_prefix):
    with pytest.raises(ConfigError, match=r"^rdzv-conf read_timeout='x' is not a number of seconds"):
        get_rendezvous_handler(_params(etcd_server.endpoint, key_prefix, read_timeout="x"))


@pytest.mark.parametrize("share_tcp_store", ["0", "1"])
def test_two_handlers_rendezvous_then_close(etcd_server, key_prefix, monkeypatch, share_tcp_store):
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1" if share_tcp_store == "0" else "0")
    handlers = [get_rendezvous_handler(_params(etcd_server.endpoint, key_prefix)) for _ in range(2)]
    infos, errors = [None, None], []

    def join(i):
        try:
            infos[i] = handlers[i].next_rendezvous()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert errors == []
    assert sorted(info.rank for info in infos) == [0, 1]
    assert {info.world_size for info in infos} == {2}
    # Both were told the same master address and port, through the etcd store.
    assert len({(info.bootstrap_store_info.master_addr, info.bootstrap_store_info.master_port) for info in infos}) == 1
    handlers[0].set_closed()
    # The other handler sees it once its cached state is older than torch's 1 s cache duration.
    deadline = time.monotonic() + 5
    while not handlers[1].is_closed() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert handlers[1].is_closed()
    for handler in handlers:
        handler.shutdown()
