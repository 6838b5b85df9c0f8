"""The relay benchmark: durable accepts per second, accept latency, delivery throughput.

A real ``gpuload relay`` process with its SQLite queue in a temporary directory and one webhook
target (no minimum interval, no digests) pointing at a fast local receiver that answers 200 at
once. Each notification has its own group key, so none is a duplicate of another.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from bench import load
from bench.node import ROOT, free_port

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/")


class Receiver:
    """A webhook target that answers 200 at once and notes when each delivery arrived."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.arrivals.append(time.monotonic())
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


def _notification(index: int) -> bytes:
    labels = {
        "alertname": "GPUTemperatureHigh",
        "severity": "warning",
        "gpu": str(index % 8),
        "uuid": f"GPU-bench-{index}",
        "instance": f"node-{index}:19400",
    }
    body = {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="GPUTemperatureHigh",instance="node-{index}"}}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "relay",
        "groupLabels": {"alertname": "GPUTemperatureHigh"},
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": {"summary": "A GPU is too hot", "value": "91 °C"},
                "startsAt": "2026-01-02T03:04:05Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": f"{index:016x}",
            }
        ],
    }
    return json.dumps(body).encode()


def _post(port: int, body: bytes) -> float:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/alerts", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
    finally:
        connection.close()
    if answer.status != 200:
        raise RuntimeError(f"relay answered {answer.status}")
    return time.perf_counter() - started


def _send(port: int, senders: int, each: int, first: int) -> tuple[list[float], float]:
    """`senders` threads post `each` notifications back to back; (latencies, wall seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(senders + 1)

    def run(offset: int) -> None:
        bodies = [_notification(first + offset * each + i) for i in range(each)]
        mine = []
        barrier.wait()
        for body in bodies:
            mine.append(_post(port, body))
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(senders)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return latencies, time.perf_counter() - started


def _start(config: Path) -> tuple[subprocess.Popen[str], int]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "relay", "--config", str(config)],
        cwd=ROOT,
        env=environment,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        match = _LISTENING.search(line)
        if match:
            # Keep reading its log so that it never blocks on a full pipe.
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, int(match.group(1))
    raise RuntimeError("gpuload relay did not start")


def run(*, quick: bool = False) -> list[dict[str, str]]:
    """Run the relay benchmark; one row per sender count."""
    receiver = Receiver()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as workdir:
        config = Path(workdir) / "relay.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "web": {"listen_address": f"127.0.0.1:{free_port()}"},
                    "queue": {"path": str(Path(workdir) / "relay.db")},
                    "log": {"level": "info"},
                    "targets": {
                        "fast": {
                            "type": "webhook",
                            "url": f"http://127.0.0.1:{receiver.port}/hook",
                            "min_interval": "0s",
                        }
                    },
                    "route": {"targets": ["fast"]},
                }
            )
        )
        process, port = _start(config)
        try:
            sent = 0
            plan = ((1, 50 if quick else 200), (20, 10 if quick else 25))
            first_accept = time.monotonic()
            for senders, each in plan:
                latencies, wall = _send(port, senders, each, sent)
                sent += senders * each
                rows.append(
                    {
                        "senders": str(senders),
                        "notifications": str(senders * each),
                        "accepted/s": f"{senders * each / wall:.0f}",
                        "p50 accept ms": f"{load.median(latencies) * 1000:.1f}",
                        "p99 accept ms": f"{load.percentile(latencies, 0.99) * 1000:.1f}",
                    }
                )
            deadline = time.monotonic() + 120
            while len(receiver.arrivals) < sent and time.monotonic() < deadline:
                time.sleep(0.05)
            delivered = len(receiver.arrivals)
            span = (receiver.arrivals[-1] - first_accept) if delivered else float("nan")
            for row in rows:
                row["delivered/s (all, from first accept)"] = f"{delivered / span:.0f}"
                row["delivered"] = f"{delivered}/{sent}"
        finally:
            process.terminate()
            process.wait(timeout=10)
            receiver.close()
    return rows
