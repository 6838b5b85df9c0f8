"""Test helpers: a real `gpuload serve` process on 127.0.0.1 and metric parsing."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.server.exposition import TEXT, Exposition, ProcessMetrics
from exporter.snapshot import Snapshot

ROOT = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"listening on (https?://\S+/)")


@dataclass
class Daemon:
    """A running gpuload subprocess (`serve` or `relay`) and what it has logged so far."""

    process: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)

    def get(self, path: str, **kwargs: object) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        return requests.get(self.url + path.lstrip("/"), **kwargs)  # type: ignore[arg-type]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Scrape /metrics into {(sample name, sorted labels): value}."""
        return parse_metrics(self.get("/metrics").text)

    def log(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send `sig`, wait for exit (30 s at most: a bound on a hang), return the exit code."""
        self.process.send_signal(sig)
        return self.process.wait(timeout=30)


def exposition_text(snapshot: Snapshot) -> str:
    """The snapshot as /metrics writes it in the text format, the process's own metrics after."""
    return Exposition(ProcessMetrics()).encode(snapshot, TEXT).decode()


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value_of(samples: dict, name: str, **labels: str) -> float | None:
    """The value of the sample with exactly these labels, or None if absent."""
    return samples.get((name, tuple(sorted(labels.items()))))


def series(samples: dict, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def gpuload(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a gpuload command to its end: its exit status, stdout and stderr.

    The timeout only bounds a regression (a read that blocks, a start that hangs).
    """
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def follow(process: subprocess.Popen[str], *, what: str, timeout: float) -> Daemon:
    """A started gpuload process as a Daemon: its stderr gathered, its URL once it listens."""
    daemon = Daemon(process)
    seen = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            daemon.lines.append(line)
            match = _LISTENING.search(line)
            if match:
                daemon.url = match.group(1)
                seen.set()
        seen.set()

    threading.Thread(target=drain, daemon=True).start()
    if not seen.wait(timeout=timeout) or not daemon.url:
        process.kill()
        raise AssertionError(f"{what} did not start:\n{daemon.log()}")
    return daemon


def start_daemon(*args: str, env: dict[str, str] | None = None, wait_ready: bool = True) -> Daemon:
    command = [
        sys.executable,
        "-m",
        "exporter",
        "serve",
        "--web.listen-address",
        "127.0.0.1:0",
        *args,
    ]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment.update(env or {})
    environment["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    daemon = follow(process, what="gpuload serve", timeout=30)
    if wait_ready:
        wait_until(lambda: daemon.get("/readyz").status_code == 200, what="readiness")
    return daemon


def wait_until(condition: Callable[[], object], *, timeout: float = 15, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or condition}")


class Clock:
    """A scenario clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def simulated_node(scenario: str | Path, clock: Clock, **settings: Any) -> Collection:
    """Every collector on the simulated NVML as root, on the scenario's clock, nothing slept.

    ``settings`` go to the Collection (``profile``, ``options``, ``wall_clock``); its slow values
    are read every 20 s. The caller closes the collection and uninstalls the simulator.
    """
    sim.install(scenario, clock=clock, epoch=0, caller="root", sleep=lambda _: None)
    return Collection(
        dict.fromkeys(REGISTRY, True), timeout=60, slow_interval=20, clock=clock, **settings
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answers(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 (a server's readiness)."""
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def run_prometheus(
    start: Callable[..., subprocess.Popen[str]], folder: Path, config: dict[str, Any]
) -> str:
    """Start Debian's Prometheus on a free port with ``config``; its URL once it is ready.

    ``start`` is the `processes` fixture's, which kills it at teardown.
    """
    binary = shutil.which("prometheus")
    assert binary is not None, "needs Debian's prometheus (scripts/test installs it)"
    port = free_port()
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    process = start(
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={folder / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        log=folder / "prometheus.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(url + "/-/ready") or process.poll() is not None, what="prometheus")
    assert process.poll() is None, (folder / "prometheus.log").read_text()
    return url


def promtool_test_rules(path: Path, document: dict[str, Any]) -> None:
    """Write a `promtool test rules` document to ``path`` and assert that promtool passes it."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "needs Debian's prometheus (scripts/test installs it)"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
