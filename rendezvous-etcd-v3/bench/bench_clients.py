"""Import time and round-trip latency of etcd v3 client candidates, against a real etcd.

    python bench/bench_clients.py --endpoint 127.0.0.1:2379 [--ops 300] [--imports 3]

Each candidate runs in fresh subprocesses (its import is cold, its environment its own). Measured:
- import: seconds to import the client module (median of --imports runs);
- get: one range of an existing key; txn: the backend's compare-and-set shape (compare, put) in one
  transaction. Latency in ms: median and p99 over --ops calls after 20 warm-up calls.
Candidates that are not installed are reported as such. Install the others into the same venv:
``pip install etcd3gw etcd3 etcd-sdk-python etcd-client-py``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _ours(host: str, port: int):
    from rendezvous_etcd_v3.client import EtcdClient, put_op
    from rendezvous_etcd_v3.config import EtcdConfig

    client = EtcdClient(EtcdConfig.from_rdzv(f"{host}:{port}", {}))

    def txn(key: bytes, old: bytes, new: bytes) -> bool:
        compare = [{"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(old)}]
        return client.txn(compare, [put_op(key, new)], []).succeeded

    return client.put, lambda key: client.get(key).value, txn


def _etcd3gw(host: str, port: int):
    import etcd3gw

    client = etcd3gw.client(host=host, port=port)

    def txn(key: bytes, old: bytes, new: bytes) -> bool:
        compare = [{"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(old)}]
        answer = client.transaction(
            {"compare": compare, "success": [{"request_put": {"key": _b64(key), "value": _b64(new)}}]}
        )
        return bool(answer.get("succeeded"))

    return client.put, lambda key: client.get(key)[0], txn


def _grpc_style(module_name: str):
    def make(host: str, port: int):
        module = importlib.import_module(module_name)
        client = module.client(host=host, port=port)

        def txn(key: bytes, old: bytes, new: bytes) -> bool:
            t = client.transactions
            succeeded, _ = client.transaction(compare=[t.value(key) == old], success=[t.put(key, new)], failure=[])
            return succeeded

        return client.put, lambda key: client.get(key)[0], txn

    return make


def _etcd_client_py(host: str, port: int):
    import etcd_client

    loop = asyncio.new_event_loop()

    async def connect():
        # The client must be made inside a running event loop.
        return await etcd_client.Client([f"http://{host}:{port}"]).connect().__aenter__()

    communicator = loop.run_until_complete(connect())

    async def call(method, *args):
        return await method(*args)  # its futures, too, must be made inside the running loop

    def put(key: bytes, value: bytes):
        return loop.run_until_complete(call(communicator.put, key, value))

    def get(key: bytes):
        return loop.run_until_complete(call(communicator.get, key))

    return put, get, None  # its Txn API is not covered here: import and get only


CANDIDATES = {
    "stdlib over v3 JSON gateway (this package)": ("rendezvous_etcd_v3.client", _ours, {}),
    "etcd3gw (requests, v3 JSON gateway)": ("etcd3gw", _etcd3gw, {}),
    "etcd3 0.12 (grpc)": ("etcd3", _grpc_style("etcd3"), {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}),
    "etcd-sdk-python / pyetcd (grpc)": ("pyetcd", _grpc_style("pyetcd"), {}),
    "etcd-client-py (Rust, asyncio)": ("etcd_client", _etcd_client_py, {}),
}


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
    }


def _timed(call, ops: int) -> list[float]:
    for _ in range(20):
        call()
    samples = []
    for _ in range(ops):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def measure_one(name: str, endpoint: str, ops: int, latency: bool) -> dict:
    module_name, make, _env = CANDIDATES[name]
    started = time.perf_counter()
    try:
        importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - reported, not raised: a candidate may be missing or broken
        return {"error": f"import failed: {type(exc).__name__}: {exc}"[:200]}
    result: dict = {"import_s": round(time.perf_counter() - started, 3)}
    if not latency:
        return result
    host, port = endpoint.rsplit(":", 1)
    try:
        put, get, txn = make(host, int(port))
        key = f"/bench/{os.getpid()}".encode()
        put(key, b"x" * 100)
        result["get"] = _ms(_timed(lambda: get(key), ops))
        if txn is not None:
            state = {"value": b"x" * 100, "n": 0}

            def cas():
                new = b"%d" % state["n"]
                assert txn(key, state["value"], new)
                state["value"], state["n"] = new, state["n"] + 1

            result["txn"] = _ms(_timed(cas, ops))
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return result


def _child(name: str, endpoint: str, ops: int, latency: bool) -> dict:
    pythonpath = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **CANDIDATES[name][2], "PYTHONPATH": pythonpath}
    argv = [sys.executable, __file__, "--child", name, "--endpoint", endpoint, "--ops", str(ops)]
    if not latency:
        argv.append("--import-only")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", default="127.0.0.1:2379")
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--imports", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--import-only", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_one(args.child, args.endpoint, args.ops, not args.import_only)))
        return
    print(f"python {sys.version.split()[0]}, etcd at {args.endpoint}, {args.ops} ops per figure")
    print(f"{'client':45} {'import s':>9} {'get p50/p99 ms':>16} {'txn p50/p99 ms':>16}")
    for name in CANDIDATES:
        result = _child(name, args.endpoint, args.ops, latency=True)
        imports = [result.get("import_s")] + [
            _child(name, args.endpoint, args.ops, latency=False).get("import_s") for _ in range(args.imports - 1)
        ]
        imports = [value for value in imports if value is not None]
        cells = [f"{statistics.median(imports):.3f}" if imports else "-"]
        for op in ("get", "txn"):
            figures = result.get(op)
            cells.append(f"{figures['median_ms']:.2f}/{figures['p99_ms']:.2f}" if figures else "-")
        print(
            f"{name:45} {cells[0]:>9} {cells[1]:>16} {cells[2]:>16}"
            + (f"  ({result['error']})" if "error" in result else "")
        )


if __name__ == "__main__":
    main()
