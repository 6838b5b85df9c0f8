"""/metrics's per-snapshot cache: each snapshot encoded once per format, however many scrape."""

from __future__ import annotations

import gzip
import threading
from typing import Any

from exporter.collectors import CollectorSpec, Family, Sample
from exporter.server.http import MetricsEndpoint
from exporter.snapshot import CollectorRun, Layout, Snapshot

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
FAMILY = Family("gpu_test_value", "gauge", "A test value.")
LAYOUT = Layout([CollectorSpec(name="test", families=(FAMILY,), factory=object)])


class _CountedSamples(tuple):
    """A run's samples that count how often they are encoded (read whole)."""

    def __new__(cls, samples: tuple, hold: threading.Event | None = None) -> _CountedSamples:
        counted = super().__new__(cls, samples)
        counted.reads = 0
        counted.hold = hold
        counted.reached = threading.Event()
        return counted

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += 1
        self.reached.set()
        if self.hold is not None:
            assert self.hold.wait(30)
        return super().__iter__()


def _snapshot(value: float, hold: threading.Event | None = None) -> Snapshot:
    samples = _CountedSamples((Sample(FAMILY.name, value),), hold)
    run = CollectorRun(name="test", samples=samples, gpu=0, labels=("0", "GPU-a"))
    return Snapshot(gpus=(), nvml_up=True, completed_at=0.0, runs=(run,), layout=LAYOUT)


def _samples(snapshot: Snapshot) -> _CountedSamples:
    samples = snapshot.runs[0].samples
    assert isinstance(samples, _CountedSamples)
    return samples


def _reads(snapshot: Snapshot) -> int:
    return _samples(snapshot).reads


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
    assert b'gpu_test_value{gpu="0",uuid="GPU-a"} 0.0' in body and body.rstrip().endswith(b"# EOF")
    # Another format is its own encoding, once too.
    plain = {node.scrape("", encoding="") for _ in range(3)}
    assert _reads(node.snapshot) == 2 and len(plain) == 1
    assert b'gpu_test_value{gpu="0",uuid="GPU-a"} 0.0' in next(iter(plain))


def test_a_new_snapshot_is_served_from_its_first_scrape() -> None:
    node = _Node()
    node.scrape(OPENMETRICS)
    node.snapshot = _snapshot(7)
    assert b'gpu_test_value{gpu="0",uuid="GPU-a"} 7.0' in node.scrape(OPENMETRICS)
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
    assert _samples(node.snapshot).reached.wait(30), "no scrape started encoding"
    hold.set()
    for scrape in scrapes:
        scrape.join(30)
    assert len(answers) == 4 and len(set(answers)) == 1
    assert _reads(node.snapshot) == 1


def test_scrapes_during_a_new_snapshots_encoding_get_the_previous_answer() -> None:
    node = _Node()
    before = node.scrape(OPENMETRICS)
    hold = threading.Event()
    node.snapshot = _snapshot(5, hold)
    first: list[bytes] = []
    encoding = threading.Thread(target=lambda: first.append(node.scrape(OPENMETRICS)))
    encoding.start()
    try:
        assert _samples(node.snapshot).reached.wait(30), "no scrape started encoding"
        # Not held up by the encoding under way: the previous snapshot's bytes, at once.
        assert node.scrape(OPENMETRICS) == before
    finally:
        hold.set()
        encoding.join(30)
    assert b'gpu_test_value{gpu="0",uuid="GPU-a"} 5.0' in first[0]
    assert node.scrape(OPENMETRICS) == first[0] and _reads(node.snapshot) == 1
