"""Start and stop a real `blink serve` on 127.0.0.1 for the service and dashboard tests."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self) -> bool:
        return self.proc.poll() is None


def request(url: str, method: str = "GET", body: bytes | dict | None = None,
            headers: dict[str, str] | None = None,
            timeout: float = 120.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one HTTP request; HTTP errors are answers, not exceptions."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h = {"Content-Type": "application/json"} if data is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def start(tmp_dir: str, *args: str, wait_s: float = 120.0) -> Served:
    """`python -m blink serve` on a free loopback port, history under tmp_dir; waits for
    /health."""
    port = free_port()
    log_path = os.path.join(tmp_dir, f"serve-{port}.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["XDG_CACHE_HOME"] = os.path.join(tmp_dir, "cache")
    cmd = [sys.executable, "-m", "blink", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--history", os.path.join(tmp_dir, f"history-{port}.json"), *args]
    log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_dir, env=env)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            break
        try:
            status, _, _ = request(url + "/health", timeout=2)
            if status == 200:
                return Served(url, proc, log_path)
        except OSError:
            pass
        time.sleep(0.3)
    stop(Served(url, proc, log_path))
    with open(log_path, encoding="utf-8") as f:
        raise RuntimeError(f"blink serve did not come up on {url}:\n{f.read()}")


def stop(s: Served) -> None:
    if s.proc.poll() is None:
        s.proc.terminate()
        try:
            s.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(timeout=10)
