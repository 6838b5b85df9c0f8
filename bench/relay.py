"""The relay benchmark: durable accepts per second, accept latency, delivery throughput.

A real ``gpuload relay`` process with its SQLite queue in a temporary directory and one webhook
target (no minimum interval, no digests) pointing at a fast local receiver that answers 200 at
once. Each notification has its own group key, so none is a duplicate of another.
"""

from __future__ import annotations

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


def _sync_latency(directory: Path, count: int = 50) -> float:
    """Median seconds of one 4 KiB write + fsync in `directory`: what each durable accept waits."""
    taken = []
    fd = os.open(directory / "fsync-probe", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for index in range(count):
            os.pwrite(fd, b"\0" * 4096, index * 4096)
            started = time.perf_counter()
            os.fsync(fd)
            taken.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(directory / "fsync-probe")
    return load.median(taken)


def _post_each(port: int, bodies: list[bytes]) -> list[float]:
    headers = {"Content-Type": "application/json"}
    return [load.request(port, "POST", "/alerts", headers, body)[0] for body in bodies]


def _send(port: int, senders: int, each: int, first: int) -> tuple[list[float], float]:
    """`senders` processes post `each` notifications back to back; (latencies, wall seconds).

    Processes, as Alertmanager is: sender threads in this process would share its GIL with
    each other and with the receiver, and that wait would count as the relay's.
    """
    bodies = [[_notification(first + n * each + i) for i in range(each)] for n in range(senders)]
    return load.in_processes(_post_each, [(port, mine) for mine in bodies])


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
                sync = _sync_latency(Path(workdir))
                latencies, wall = _send(port, senders, each, sent)
                sent += senders * each
                rows.append(
                    {
                        "senders": str(senders),
                        "notifications": str(senders * each),
                        "accepted/s": f"{senders * each / wall:.0f}",
                        "p50 accept ms": f"{load.median(latencies) * 1000:.1f}",
                        "p99 accept ms": f"{load.percentile(latencies, 0.99) * 1000:.1f}",
                        "fsync ms": f"{sync * 1000:.2f}",
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
