"""TLS (server and client certificates) and etcd's user/password auth, through ``--rdzv-conf``."""

import time

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from rendezvous_etcd_v3 import EtcdClient, EtcdConfig, EtcdV3RendezvousBackend


def _backend(server, **conf):
    return EtcdV3RendezvousBackend(EtcdClient(EtcdConfig.from_rdzv(server.endpoint, conf)), "secure")


def _enable_root_auth(server, password):
    admin = EtcdClient(EtcdConfig.from_rdzv(server.endpoint, {}))
    admin.call("/v3/auth/user/add", {"name": "root", "password": password})
    admin.call("/v3/auth/role/add", {"name": "root"})
    admin.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
    admin.call("/v3/auth/enable", {})


def test_user_and_password(start_etcd):
    server = start_etcd()
    _enable_root_auth(server, "s3cret")
    with pytest.raises(RendezvousConnectionError, match="user name is empty|permission|auth"):
        _backend(server).get_state()  # anonymous: refused
    with pytest.raises(RendezvousConnectionError, match="authentication failed"):
        _backend(server, user="root", password="wrong").get_state()
    backend = _backend(server, user="root", password="s3cret")
    assert backend.set_state(b"v1")[2] is True


def test_password_from_the_environment_authenticates(start_etcd, monkeypatch):
    """password_env: what `sim` uses, so the password is on no command line and in no INFO line of the conf."""
    server = start_etcd()
    _enable_root_auth(server, "s3cret-env")
    monkeypatch.setenv("RDZV_TEST_PASSWORD", "s3cret-env")
    backend = _backend(server, user="root", password_env="RDZV_TEST_PASSWORD")
    assert backend.set_state(b"v1")[2] is True
    monkeypatch.setenv("RDZV_TEST_PASSWORD", "wrong")
    with pytest.raises(RendezvousConnectionError, match="authentication failed"):
        _backend(server, user="root", password_env="RDZV_TEST_PASSWORD").get_state()


def test_expired_auth_token_is_renewed(start_etcd, monkeypatch):
    server = start_etcd("--auth-token-ttl", "1")
    _enable_root_auth(server, "pw")
    logins = []
    authenticate = EtcdClient._authenticate
    monkeypatch.setattr(EtcdClient, "_authenticate", lambda self: logins.append(1) or authenticate(self))
    backend = _backend(server, user="root", password="pw")
    _, token, _ = backend.set_state(b"v1")
    time.sleep(2.5)  # the simple token expires after 1 s idle
    assert backend.set_state(b"v2", token)[2] is True
    assert len(logins) == 2


def test_tls_with_client_certificate(start_etcd, tls_files):
    tls = tls_files
    server = start_etcd(tls=tls)
    conf = {"protocol": "https", "ca_cert": str(tls.ca)}
    with pytest.raises(RendezvousConnectionError):
        _backend(server, **conf).get_state()  # no client certificate: the handshake is refused
    backend = _backend(server, **conf, ssl_cert=str(tls.client_cert), ssl_cert_key=str(tls.client_key))
    assert backend.set_state(b"v1")[2] is True
    assert backend.get_state()[0] == b"v1"
