"""Call Blink's REST service: start `blink serve` on a free loopback port (or use --url), then
POST /predict, /optimize-batch and /compare with only the standard library.

    python examples/call_service.py              # starts and stops its own server
    python examples/call_service.py --url http://127.0.0.1:8765
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def call(url: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # 4xx answers say what is wrong
        return {"status": e.code, **json.loads(e.read())}


def start() -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "blink", "serve", "--port", str(port),
                             "--history", ""], env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            call(url, "/health")
            return url, proc
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise SystemExit("blink serve did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=None)
    a = ap.parse_args()
    url, proc = (a.url, None) if a.url else start()
    try:
        print("health:", call(url, "/health")["status"])
        p = call(url, "/predict", {"model": "torchvision:resnet18", "batch_size": 16,
                                   "gpu": "H200", "dtype": "bf16"})
        print(f"predict: {p['time_ms']:.3f} ms, peak reserved "
              f"{p['peak_reserved_bytes'] / 2**20:.0f} MiB, fits={p['fits']}")
        cfg = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4,
               "vocab_size": 5000, "n_positions": 512, "bos_token_id": 0, "eos_token_id": 0}
        p = call(url, "/predict", {"model": cfg, "batch_size": 4, "seq_len": 256,
                                   "mode": "train"})
        print(f"predict (a config sent as JSON): {p['model']} {p['time_ms']:.3f} ms")
        s = call(url, "/optimize-batch", {"model": "torchvision:resnet18", "gpu": "T4",
                                          "memory_budget": "4GiB", "max_batch": 1024})
        print(f"optimize-batch: largest {s['max_batch_size']}, best {s['best']['batch_size']} "
              f"at {s['best']['throughput']:.0f} samples/s")
        c = call(url, "/compare", {"models": ["torchvision:resnet18"], "gpus": ["H200", "T4"],
                                   "batch_size": 8})
        for r in c["rows"]:
            print(f"compare: {r['gpu']:<8} {r['time_ms']:.3f} ms ({r['relative']:.2f}x)")
        bad = call(url, "/predict", {"model": "__import__('os')", "batch_size": 1})
        print("a code string as model:", bad["status"], bad["error"])
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
