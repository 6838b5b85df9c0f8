"""Relay test helpers: fake target services, payloads, relays in-process and as processes."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import yaml
from helpers import ROOT, Daemon, follow, wait_until

from exporter.relay import config as relay_config
from exporter.relay.daemon import Relay
from exporter.relay.target_config import TargetConfig, declared_options
from exporter.relay.targets import KINDS

T = TypeVar("T")


@dataclass
class Received:
    """One request a fake target got."""

    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


# What a fake target answers: (status, headers, body), or None to hang until released.
Answer = tuple[int, dict[str, str], bytes] | None


class _LocalServer:
    """A target's HTTP server on 127.0.0.1, serving on a thread of its own; its URL is /hook."""

    _server: ThreadingHTTPServer

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def _stop_serving(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakeTarget(_LocalServer):
    """A real HTTP server on 127.0.0.1 standing in for Slack, PagerDuty, a robot or a webhook."""

    def __init__(self, answer: Callable[[Received], Answer] | None = None) -> None:
        self.requests: list[Received] = []
        self.answer = answer or (lambda _request: (200, {}, b"ok"))
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:
                    # The sender died mid-request (a kill -9 in the crash test): like a real
                    # service, drop it unanswered; the sender never saw a 2xx and retries.
                    self.close_connection = True
                    return
                parts = urlsplit(self.path)
                received = Received(
                    parts.path,
                    parse_qs(parts.query),
                    dict(self.headers.items()),
                    body,
                    time.monotonic(),
                )
                fake.requests.append(received)
                answer = fake.answer(received)
                if answer is None:
                    fake.release.wait(30)
                    answer = (200, {}, b"late")
                status, headers, body = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._serve(Handler)

    def bodies(self) -> list[Any]:
        return [request.json() for request in self.requests]

    def close(self) -> None:
        self.release.set()
        self._stop_serving()


def alert(
    name: str = "GPUTemperatureHigh",
    *,
    status: str = "firing",
    fingerprint: str | None = None,
    starts_at: str = "2026-01-02T03:04:05.123456789Z",
    **labels: str,
) -> dict[str, Any]:
    """An alert as Alertmanager sends it."""
    all_labels = {
        "alertname": name,
        "severity": "critical",
        "gpu": "3",
        "uuid": "GPU-0c1d",
        "instance": "node-7:19400",
        **labels,
    }
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {
            "summary": "A GPU is too hot",
            "description": "GPU 3 on node-7 is at 91 °C, above its slowdown threshold.",
            "runbook_url": "https://example.com/runbooks.md#gputemperaturehigh",
            "value": "91 °C",
        },
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-01-02T04:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=gpu_temperature_celsius",
        "fingerprint": fingerprint
        or hashlib.sha256(json.dumps(all_labels, sort_keys=True).encode()).hexdigest()[:16],
    }


def notification(
    *alerts: dict[str, Any], group: str = "gpu", status: str | None = None
) -> dict[str, Any]:
    """An Alertmanager webhook payload (version 4)."""
    alerts = alerts or (alert(),)
    if status is None:
        status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    common = dict(alerts[0]["labels"])
    for other in alerts[1:]:
        common = {k: v for k, v in common.items() if other["labels"].get(k) == v}
    return {
        "version": "4",
        "groupKey": f'{{}}:{{group="{group}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "relay",
        "groupLabels": {"alertname": common.get("alertname", "")},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def target_config(kind: str, **settings: Any) -> TargetConfig:
    """A configured target of `kind` named my-KIND: the kind's own options go to its options."""
    own = {setting.name for setting in declared_options(KINDS[kind].options_type)}
    options = KINDS[kind].options_type(**{k: v for k, v in settings.items() if k in own})
    shared = {k: v for k, v in settings.items() if k not in own}
    return TargetConfig(name=f"my-{kind}", kind=kind, options=options, **shared)


def write_config(directory: Path, document: dict[str, Any]) -> Path:
    document = {
        "web": {"listen_address": "127.0.0.1:0"},
        "queue": {"path": str(directory / "relay.db")},
        **document,
    }
    path = directory / "relay.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def fast_delivery(**overrides: Any) -> dict[str, Any]:
    """Delivery settings for tests: retries within a fraction of a second.

    The request timeout stays long: a local answer slowed down by a busy machine must not
    become a failed attempt, and an extra delivery, in a test that counts them.
    """
    return {"timeout": "30s", "backoff_initial": "50ms", "backoff_max": "200ms", **overrides}


@contextmanager
def running_relay(
    directory: Path, document: dict[str, Any], environ: dict[str, str] | None = None
) -> Iterator[Relay]:
    """A relay started in this process from a config written to `directory`."""
    path = write_config(directory, document)
    relay = Relay(relay_config.load(file=path, environ=environ or {}))
    relay.start()
    try:
        yield relay
    finally:
        relay.stop()


def post(relay_url: str, body: Any, *, path: str = "alerts", **kwargs: Any) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(relay_url + path, data=data, timeout=10, **kwargs)


def start_relay_process(config: Path, *args: str, env: dict[str, str] | None = None) -> Daemon:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment.update(env or {})
    environment["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "relay", "--config", str(config), *args],
        cwd=ROOT,
        env=environment,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    return follow(process, what="gpuload relay", timeout=20)


def assert_rendered_relay_starts(objects: list[dict[str, Any]], folder: Path) -> None:
    """The chart's relay container, its arguments and rendered config, ready under `gpuload relay`.

    Each Secret a target or the inbound token reads gets any value: enough to start. The queue
    goes in `folder`, the port is any free one: not the pod's volume or port.
    """
    (deployment,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("relay")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # What start_relay_process runs, with the config file at this test's path.
    assert container["args"][:2] == ["relay", "--config"], container["args"]
    (config_map,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("relay")
    ]
    config = folder / "relay.yaml"
    config.write_text(config_map["data"][Path(container["args"][2]).name])
    environment = {
        variable["name"]: variable.get("value") or "https://hooks.example/x"
        for variable in container.get("env", [])
    }
    environment["GPULOAD_RELAY_QUEUE_PATH"] = str(folder / "relay.db")
    relay = start_relay_process(config, "--web.listen-address", "127.0.0.1:0", env=environment)
    try:
        assert relay.get("/readyz").status_code == 200
    finally:
        assert relay.stop() == 0


def pagerduty_accepted(request: Received) -> tuple[int, dict[str, str], bytes]:
    """PagerDuty's Events API answer to an event it took: 202 with the event's dedup_key."""
    document = {
        "status": "success",
        "message": "Event processed",
        "dedup_key": request.json().get("dedup_key", ""),
    }
    return 202, {"Content-Type": "application/json"}, json.dumps(document).encode()


class StreamingTarget(_LocalServer):
    """A target writing its raw HTTP answer in pieces, a pause after each, until the client leaves.

    It counts the bytes each answer got into the connection: what the client could read.
    """

    def __init__(self, pieces: Callable[[], Iterator[bytes]], pause: float = 0.0) -> None:
        self.requests = 0
        self.written: list[int] = []
        self.ended = threading.Event()
        self.stop = threading.Event()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target.requests += 1
                index = len(target.written)
                target.written.append(0)
                try:
                    for piece in pieces():
                        if target.stop.is_set():
                            break
                        self.wfile.write(piece)
                        target.written[index] += len(piece)
                        if pause:
                            target.stop.wait(pause)
                except OSError:
                    pass  # the client closed the connection: what the test waits for
                finally:
                    self.close_connection = True
                    target.ended.set()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._serve(Handler)

    def close(self) -> None:
        self.stop.set()
        self._stop_serving()


@contextmanager
def small_disk(directory: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `directory`: a disk the test can fill; skips without root."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): no full disk to test with")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its file system is full; the file, to delete later."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


@contextmanager
def write_lock_held(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection's write transaction on the queue file, rolled back at the end."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def in_thread(function: Callable[..., T], *args: Any) -> Future[T]:
    """Call `function` on a daemon thread: a test that deadlocks fails on a timeout, not hangs."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the test through the future
            future.set_exception(error)

    threading.Thread(target=run, daemon=True).start()
    return future


__all__ = ["wait_until"]
