"""``--rdzv-endpoint`` / ``--rdzv-conf`` parsing: good values, and one clear line for each bad one."""

import pytest

from rendezvous_etcd_v3.config import ConfigError, Endpoint, EtcdConfig


def test_defaults_follow_etcd_v2():
    config = EtcdConfig.from_rdzv("etcd", {})
    assert config.endpoints == (Endpoint("etcd", 2379),)
    assert (config.protocol, config.read_timeout_s, config.ttl_s) == ("http", 60.0, 7200)
    assert config.rendezvous_prefix == b"/torch/elastic/rendezvous/"
    assert config.store_prefix == b"/torch/elastic/store/"


def test_several_endpoints_schemes_and_ipv6():
    config = EtcdConfig.from_rdzv("https://a:1, https://[::1]:2 ,b", {})
    assert config.protocol == "https"
    assert config.endpoints == (Endpoint("a", 1), Endpoint("::1", 2), Endpoint("b", 2379))


def test_conf_keys(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    config = EtcdConfig.from_rdzv(
        "h:1",
        {
            "read_timeout": "2.5",
            "connect_timeout": "1",
            "key_prefix": "/jobs/a",
            "ttl": "30",
            "user": "u",
            "password_file": str(secret),
            "allow_plain_password": "1",  # h is no loopback host: a password over http only when asked
            "join_timeout": "ignored: the handler's key",
        },
    )
    assert (config.read_timeout_s, config.connect_timeout_s, config.ttl_s) == (2.5, 1.0, 30)
    assert config.rendezvous_prefix == b"/jobs/a/rendezvous/"
    assert (config.user, config.password) == ("u", "s3cret")
    assert "s3cret" not in repr(config)


@pytest.mark.parametrize(
    ("endpoint", "conf", "names"),
    [
        ("", {}, "rdzv-endpoint"),
        ("h:port", {}, "bad port"),
        ("h:70000", {}, "bad port"),
        ("http://a:1,https://b:2", {}, "mixes"),
        ("h", {"protocol": "grpc"}, "protocol='grpc'"),
        ("h", {"read_timeout": "soon"}, "read_timeout='soon'"),
        ("h", {"connect_timeout": "-1"}, "connect_timeout"),
        ("h", {"ttl": "1.5"}, "ttl='1.5'"),
        ("h", {"ttl": "1"}, "ttl=1"),
        ("h", {"key_prefix": "jobs"}, "key_prefix='jobs'"),
        ("h", {"key_prefix": "/jobs/"}, "key_prefix='/jobs/'"),
        ("h", {"ca_cert": "/nonexistent.pem"}, "ca_cert=/nonexistent.pem"),
        ("h", {"user": "u"}, "user and password"),
        ("h", {"password_file": "/nonexistent"}, "password_file=/nonexistent"),
        ("h", {"ca_cert": __file__}, "ca_cert is set but protocol=http"),
        ("h", {"ssl_cert": __file__, "ssl_cert_key": __file__}, "ssl_cert is set but protocol=http"),
        ("h", {"user": "u", "password": "p"}, "password over protocol=http to h:2379 would cross the network"),
    ],
)
def test_bad_values_raise_one_line_naming_the_key(endpoint, conf, names):
    with pytest.raises(ConfigError) as caught:
        EtcdConfig.from_rdzv(endpoint, conf)
    message = str(caught.value)
    assert names in message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError)


def test_a_password_over_http_only_to_loopback_or_when_allowed():
    assert EtcdConfig.from_rdzv("127.0.0.1:2379", {"user": "u", "password": "p"}).password == "p"
    assert EtcdConfig.from_rdzv("https://h:2379", {"user": "u", "password": "p"}).password == "p"
    allowed = EtcdConfig.from_rdzv("h:2379", {"user": "u", "password": "p", "allow_plain_password": "1"})
    assert allowed.password == "p"


def test_password_from_the_environment(monkeypatch):
    """password_env: the password never on the command line (every process can read /proc/PID/cmdline)
    nor in torch's INFO line that prints the rdzv conf."""
    monkeypatch.setenv("RDZV_PW_TEST", "s3cret-from-env")
    config = EtcdConfig.from_rdzv("127.0.0.1", {"user": "u", "password_env": "RDZV_PW_TEST"})
    assert (config.user, config.password) == ("u", "s3cret-from-env")
    assert "s3cret" not in repr(config)
    monkeypatch.delenv("RDZV_PW_TEST")
    with pytest.raises(ConfigError, match="password_env=RDZV_PW_TEST: no such environment variable"):
        EtcdConfig.from_rdzv("127.0.0.1", {"user": "u", "password_env": "RDZV_PW_TEST"})
    with pytest.raises(ConfigError, match="both password and password_env"):
        EtcdConfig.from_rdzv("127.0.0.1", {"user": "u", "password": "a", "password_env": "RDZV_PW_TEST"})
