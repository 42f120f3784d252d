import re
import signal

import pytest

from sim.core.errors import UsageError
from sim.core.parse import (
    check_node_names,
    parse_duration,
    parse_percent,
    parse_rate,
    parse_signal,
)

NODES = ("node0", "node1", "node2", "node3")


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("2m", 120),
        ("1m30s", 90),
        ("1h", 3600),
        ("1h2m3s", 3723),
        ("2.5", 2.5),
        ("0", 0),
        ("1.5s", 1.5),
        ("2m500ms", 120.5),
        (" 10S ", 10),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "3x", "-5s", "-1", "s", "ms", "1.5.3s", "30s1m", "1m1m", "inf", "nan", "1e3"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError, match=re.escape(f"duration '{text}':")):
        parse_duration(text)


@pytest.mark.parametrize(
    "text, sig",
    [
        ("KILL", signal.SIGKILL),
        ("SIGKILL", signal.SIGKILL),
        ("kill", signal.SIGKILL),
        ("9", signal.SIGKILL),
        ("TERM", signal.SIGTERM),
        ("SEGV", signal.SIGSEGV),
        ("int", signal.SIGINT),
        ("STOP", signal.SIGSTOP),
    ],
)
def test_parse_signal(text, sig):
    assert parse_signal(text) is sig


@pytest.mark.parametrize("text", ["FOO", "SIG", "0", "999", "-9", "", "SIG_DFL"])
def test_parse_signal_rejects_and_lists_valid_ones(text):
    with pytest.raises(UsageError, match=re.escape(f"signal '{text}': not a signal;") + ".*KILL, TERM"):
        parse_signal(text)


@pytest.mark.parametrize(
    "text, bps",
    [
        ("1mbit", 1_000_000),
        ("500kbit", 500_000),
        ("10Mbit", 10_000_000),
        ("1gbit", 10**9),
        ("100kbps", 800_000),
        ("1.5mbit", 1_500_000),
        ("64bit", 64),
        ("2mbps", 16_000_000),
    ],
)
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text", ["", "1000", "1 parsec", "mbit", "-1mbit", "0kbit", "0.0001bit"])
def test_parse_rate_rejects(text):
    with pytest.raises(UsageError, match=re.escape(f"rate '{text}':")):
        parse_rate(text)


@pytest.mark.parametrize("text, pct", [("30%", 30), ("30", 30), ("0.5%", 0.5), ("0", 0), ("100%", 100)])
def test_parse_percent(text, pct):
    assert parse_percent(text) == pct


@pytest.mark.parametrize("text", ["", "%", "abc", "101%", "-1%", "1e2"])
def test_parse_percent_rejects(text):
    with pytest.raises(UsageError, match=re.escape(f"percentage '{text}':")):
        parse_percent(text)


def test_check_node_names_without_known_skips_the_membership_check():
    assert check_node_names(["anything"], None, "here") == ("anything",)


def test_check_node_names_refuses_a_bare_string():
    with pytest.raises(TypeError, match="not the string 'node0'"):
        check_node_names("node0", NODES, "here")
