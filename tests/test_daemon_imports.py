"""What `gpuload serve` imports: grpc and the alert delivery only where they are used.

grpc (with protobuf) and the relay's delivery (jinja2, requests) are the heaviest imports the
daemon has, ~18 MB of resident memory together. A node without the kubelet's pod-resources
socket and without alert targets needs neither; importing them at start put the daemon over
its 60 MB budget at 8 GPUs (bench/RESULTS.md). The relay's configuration (~1.6 MB) is not
loaded either: the command line takes the relay's arguments from `exporter.relay.arguments`.
Nor is prometheus_client (5.5 MB with the http.server, wsgiref, email and ssl it imports):
/metrics is written by `exporter.server.exposition`.
The daemon runs in a subprocess so that its sys.modules is its own, not pytest's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ROOT

from exporter.collectors import REGISTRY
from tools.kubelet import remove, short_socket_dir

# In the daemon's process: serve with every collector on, wait for the first snapshot (each
# collector has run once, the kubernetes one has looked for its socket), fetch the status page
# and /metrics, print the heavy modules that are loaded, stop with SIGTERM like a kubelet would.
_SCRIPT = """
import json, os, signal, sys, threading, time, urllib.request

from exporter.cli import main

HEAVY = (
    "grpc", "google.protobuf", "jinja2", "requests", "exporter.relay.config", "sqlite3", "re2",
    "prometheus_client", "http.server", "wsgiref",
)
port, args = sys.argv[1], sys.argv[2:]


def get(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        return answer.status


def watch():
    for _ in range(300):
        try:
            if get("/readyz") == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    get("/")
    get("/metrics")
    print(json.dumps(sorted(name for name in HEAVY if name in sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=watch, daemon=True).start()
sys.exit(main(["serve", "--web.listen-address", f"127.0.0.1:{port}", *args]))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def heavy_modules_of_serve(kubelet_socket: Path) -> list[str]:
    """The heavy modules a simulated 8-GPU daemon has loaded once it serves its first snapshot."""
    collectors = [f"--collector.{name}" for name in sorted(REGISTRY)]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment["GPULOAD_COLLECTORS_KUBERNETES_SOCKET"] = str(kubelet_socket)
    scenario = ROOT / "bench" / "scenarios" / "h100x8.yaml"
    flags = ["--simulate", str(scenario), "--collect.interval", "200ms", "--log.level", "warning"]
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(_free_port()), *flags, *collectors],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    folder = short_socket_dir()
    yield folder
    remove(folder)


def test_serve_without_kubelet_socket_or_alert_targets_imports_no_grpc_or_delivery(
    socket_dir: Path,
) -> None:
    assert heavy_modules_of_serve(socket_dir / "kubelet.sock") == []


def test_serve_imports_grpc_once_the_kubelet_socket_exists(socket_dir: Path) -> None:
    # The same check where the socket is there (nothing answers on it): grpc is loaded, so the
    # test above sees a real difference, not a module list that is always empty.
    path = socket_dir / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        assert heavy_modules_of_serve(path) == ["google.protobuf", "grpc"]
