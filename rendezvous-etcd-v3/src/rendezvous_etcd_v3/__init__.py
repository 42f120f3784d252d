"""An etcd v3 rendezvous backend for torchrun: ``--rdzv-backend etcd-v3 --rdzv-endpoint HOST:2379``.

The client and the config need only the standard library; the torch parts load on first use.
"""

from importlib import import_module
from typing import Any

from .client import EtcdClient, EtcdConnectionError, EtcdError, EtcdServerError
from .config import ConfigError, EtcdConfig
from .entry_point import handler_factory

_TORCH_PARTS = {
    "BACKEND_NAME": "backend",
    "EtcdV3RendezvousBackend": "backend",
    "EtcdV3Store": "store",
    "create_backend": "handler",
    "create_rdzv_handler": "handler",
}

__all__ = [
    "ConfigError",
    "EtcdClient",
    "EtcdConfig",
    "EtcdConnectionError",
    "EtcdError",
    "EtcdServerError",
    "handler_factory",
    *_TORCH_PARTS,
]


def __getattr__(name: str) -> Any:
    if name in _TORCH_PARTS:
        return getattr(import_module(f".{_TORCH_PARTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
