"""Requests per second of `blink serve` on loopback: /health (the HTTP floor), a cached
/predict (the same request again: an LRU hit), and uncached /predicts (a new batch size each
time: a dry run and a prediction on the one worker thread).

    .venv/bin/python benchmarks/service_load.py [--model torchvision:resnet18] [--clients 4]
        [--cached-count 2000] [--uncached-count 12] [--seconds 20]

Bounded in count and time: each phase stops at its request count or after --seconds, whichever
comes first. Traffic goes only to 127.0.0.1, to a server this script starts and stops.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log_dir: str) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    log = open(os.path.join(log_dir, "serve.log"), "w")  # noqa: SIM115 - lives with the server
    proc = subprocess.Popen([sys.executable, "-m", "blink", "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--history", "", "--max-queue", "64"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=log_dir, env=env)
    end = time.monotonic() + 120
    while time.monotonic() < end and proc.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"server did not start; see {log_dir}/serve.log")


def run_phase(port: int, make_request, count: int, clients: int, seconds: float) -> dict:
    """`count` requests from `clients` threads (keep-alive connections), or until `seconds`."""
    lock = threading.Lock()
    issued = [0]
    lat: list[float] = []
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                if issued[0] >= count or time.monotonic() > deadline:
                    return
                i = issued[0]
                issued[0] += 1
            method, path, body = make_request(i)
            t0 = time.perf_counter()
            conn.request(method, path, body=body,
                         headers={"Content-Type": "application/json"} if body else {})
            r = conn.getresponse()
            r.read()
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                statuses[r.status] = statuses.get(r.status, 0) + 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {"requests": len(lat), "seconds": wall, "rps": len(lat) / wall if wall else 0.0,
            "p50_ms": 1e3 * statistics.median(lat) if lat else 0.0,
            "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
            "statuses": statuses}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="torchvision:resnet18")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--cached-count", type=int, default=2000)
    ap.add_argument("--uncached-count", type=int, default=12)
    ap.add_argument("--seconds", type=float, default=20.0, help="time bound of each phase")
    a = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(port, tmp)
        try:
            def body(batch: int) -> bytes:
                return json.dumps({"model": a.model, "batch_size": batch, "gpu": a.gpu}).encode()

            warm = run_phase(port, lambda i: ("POST", "/predict", body(1)), 1, 1, 300)
            health = run_phase(port, lambda i: ("GET", "/health", None), a.cached_count,
                               a.clients, a.seconds)
            cached = run_phase(port, lambda i: ("POST", "/predict", body(1)), a.cached_count,
                               a.clients, a.seconds)
            # distinct batch sizes: every request is a cache miss (one client: one worker)
            uncached = run_phase(port, lambda i: ("POST", "/predict", body(2 + i)),
                                 a.uncached_count, 1, a.seconds)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"blink serve on 127.0.0.1, {a.model} on {a.gpu}; first (cold) predict "
          f"{warm['p50_ms']:.0f} ms")
    print(f"{'phase':<22} {'clients':>7} {'requests':>8} {'s':>6} {'req/s':>9} {'p50 ms':>8} "
          f"{'p99 ms':>8}  statuses")
    for name, r, c in [("GET /health", health, a.clients),
                       ("POST /predict cached", cached, a.clients),
                       ("POST /predict uncached", uncached, 1)]:
        print(f"{name:<22} {c:>7} {r['requests']:>8} {r['seconds']:>6.1f} {r['rps']:>9.1f} "
              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}  {r['statuses']}")
    if uncached["rps"]:
        print(f"cached / uncached: {cached['rps'] / uncached['rps']:.0f}x")


if __name__ == "__main__":
    main()
