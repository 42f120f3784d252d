"""Observe network faults from outside: TCP reachability and UDP loss between
two containers, measured with the nodes' own python3 (no extra tools needed).
Test-only: it lives beside the tests that use it, not in the package."""

from __future__ import annotations

import json
import threading
import time

from sim.engines.cluster import Cluster

PROBE_PORT = 39999

_TCP_SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', {PROBE_PORT})); s.listen(64)
while True:
    c, _ = s.accept(); c.sendall(b'ok'); c.close()
"""

_TCP_CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print('ok' if c.recv(2) == b'ok' else 'bad')
except OSError as e:
    print('fail', type(e).__name__)
"""

_UDP_SINK = """
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', int(sys.argv[1])))
s.settimeout(float(sys.argv[2])); got = set()
try:
    while True:
        got.add(int(s.recv(64)))
except socket.timeout:
    pass
print(json.dumps(sorted(got)))
"""

_UDP_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(str(i).encode(), (sys.argv[1], int(sys.argv[2]))); time.sleep(0.002)
"""


def start_tcp_server(cluster: Cluster, node: str) -> None:
    cluster.docker.exec(cluster.container(node).id, ["python3", "-c", _TCP_SERVER], detach=True)


def tcp_connects(cluster: Cluster, src: str, dst: str, timeout: float = 2.0) -> bool:
    result = cluster.exec(src, "python3", "-c", _TCP_CLIENT, dst, str(PROBE_PORT), str(timeout), timeout=timeout + 20)
    return result.stdout.strip() == "ok"


def udp_delivery(cluster: Cluster, src: str, dst: str, count: int = 500, port: int = PROBE_PORT + 1) -> float:
    """Fraction of `count` datagrams from src that dst received."""
    got: dict = {}
    # The sink runs while the sender sends: its exec waits in a thread.
    sink = threading.Thread(
        target=lambda: got.update(result=cluster.exec(dst, "python3", "-c", _UDP_SINK, str(port), "3", timeout=60)),
        daemon=True,
    )
    sink.start()
    time.sleep(1.0)  # the sink binds before the first datagram leaves
    cluster.exec(src, "python3", "-c", _UDP_SEND, dst, str(port), str(count), timeout=60)
    sink.join(timeout=60)
    received = json.loads(got["result"].stdout.strip() or "[]") if "result" in got else []
    return len(received) / count
