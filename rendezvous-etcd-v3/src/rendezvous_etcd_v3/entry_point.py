"""The ``torchrun.handlers`` entry point. It imports nothing at load time, on purpose.

torch loads the entry point while ``torch.distributed.elastic.rendezvous`` itself is being imported;
when that import was started by this package (``import rendezvous_etcd_v3`` first), importing our
backend here would be circular and torch would skip the registration with a warning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters


def handler_factory() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """torch's registry calls this with no arguments and registers what it returns under ``etcd-v3``."""
    return _create_rdzv_handler


def _create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    from .handler import create_rdzv_handler

    return create_rdzv_handler(params)
