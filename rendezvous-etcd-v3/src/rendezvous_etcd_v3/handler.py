"""``--rdzv-backend etcd-v3``: torch's dynamic rendezvous handler on the etcd v3 backend and store."""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from .backend import EtcdV3RendezvousBackend
from .client import EtcdClient
from .config import EtcdConfig
from .store import EtcdV3Store


def create_backend(params: RendezvousParameters) -> tuple[EtcdV3RendezvousBackend, EtcdV3Store]:
    """The backend and the store for ``params`` (torch's ``create_backend`` shape, as for c10d and etcd-v2)."""
    client = EtcdClient(EtcdConfig.from_rdzv(params.endpoint, params.config))
    return EtcdV3RendezvousBackend(client, params.run_id), EtcdV3Store(client)


def create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    backend, store = create_backend(params)
    return create_handler(store, backend, params)
