"""/metrics's per-snapshot cache: each snapshot encoded once per format, however many scrape."""

from __future__ import annotations

import gzip
import threading
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from exporter.collection import Snapshot
from exporter.server.http import MetricsEndpoint

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


class _CountedSamples(list):
    """A family's samples that count how often they are encoded (read whole)."""

    def __init__(self, samples: list, hold: threading.Event | None = None) -> None:
        super().__init__(samples)
        self.reads = 0
        self._hold = hold
        self.reached = threading.Event()

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        self.reached.set()
        if self._hold is not None:
            assert self._hold.wait(30)
        return super().__iter__()


def _snapshot(value: float, hold: threading.Event | None = None) -> Snapshot:
    family = GaugeMetricFamily("gpu_test_value", "A test value.", labels=["gpu"])
    family.add_metric(["0"], value)
    family.samples = _CountedSamples(family.samples, hold)
    return Snapshot(gpus=(), nvml_up=True, completed_at=0.0, other_families=(family,))


def _reads(snapshot: Snapshot) -> int:
    samples = snapshot.families[0].samples
    assert isinstance(samples, _CountedSamples)
    return samples.reads


class _Node:
    """An endpoint over a snapshot that a collection cycle replaces."""

    def __init__(self) -> None:
        self.snapshot = _snapshot(0)
        self.endpoint = MetricsEndpoint(lambda: self.snapshot)

    def scrape(self, accept: str = "", encoding: str = "gzip") -> bytes:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/metrics",
            "HTTP_ACCEPT": accept,
            "HTTP_ACCEPT_ENCODING": encoding,
        }
        status: list[Any] = []
        body = b"".join(self.endpoint(environ, lambda *args: status.append(args)))
        return gzip.decompress(body) if encoding == "gzip" else body


def test_a_snapshot_is_encoded_once_per_format_however_many_scrape() -> None:
    node = _Node()
    answers = {node.scrape(OPENMETRICS) for _ in range(5)}
    assert len(answers) == 1 and _reads(node.snapshot) == 1
    (body,) = answers
    assert b'gpu_test_value{gpu="0"} 0.0' in body and body.rstrip().endswith(b"# EOF")
    # Another format is its own encoding, once too.
    plain = {node.scrape("", encoding="") for _ in range(3)}
    assert _reads(node.snapshot) == 2 and len(plain) == 1
    assert b'gpu_test_value{gpu="0"} 0.0' in next(iter(plain))


def test_a_new_snapshot_is_served_from_its_first_scrape() -> None:
    node = _Node()
    node.scrape(OPENMETRICS)
    node.snapshot = _snapshot(7)
    assert b'gpu_test_value{gpu="0"} 7.0' in node.scrape(OPENMETRICS)
    assert _reads(node.snapshot) == 1


def test_concurrent_first_scrapes_wait_for_one_encoding() -> None:
    node = _Node()
    hold = threading.Event()
    node.snapshot = _snapshot(3, hold)
    answers: list[bytes] = []
    scrapes = [
        threading.Thread(target=lambda: answers.append(node.scrape(OPENMETRICS))) for _ in range(4)
    ]
    for scrape in scrapes:
        scrape.start()
    samples = node.snapshot.families[0].samples
    assert isinstance(samples, _CountedSamples)
    assert samples.reached.wait(30), "no scrape started encoding"
    hold.set()
    for scrape in scrapes:
        scrape.join(30)
    assert len(answers) == 4 and len(set(answers)) == 1
    assert _reads(node.snapshot) == 1
