"""/metrics's per-snapshot cache and its priming by the collection thread."""

from __future__ import annotations

import gzip
import threading
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from exporter.collection import Snapshot
from exporter.server.http import MetricsEndpoint

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _snapshot(value: float) -> Snapshot:
    family = GaugeMetricFamily("gpu_test_value", "A test value.", labels=["gpu"])
    family.add_metric(["0"], value)
    return Snapshot(gpus=(), nvml_up=True, completed_at=0.0, other_families=(family,))


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Node:
    """An endpoint over a snapshot that a collection cycle replaces, on a manual clock."""

    def __init__(self) -> None:
        self.clock = _Clock()
        self.snapshot = _snapshot(0)
        self.endpoint = MetricsEndpoint(lambda: self.snapshot, clock=self.clock)
        self.cycles = 0

    def cycle(self) -> list[tuple[str, bool]]:
        """One collection cycle, one second after the last: a new snapshot, then priming."""
        self.clock.now += 1.0
        self.cycles += 1
        self.snapshot = _snapshot(self.cycles)
        return self.endpoint.prime(self.snapshot)

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


def test_nothing_is_primed_before_a_format_is_asked_for() -> None:
    node = _Node()
    assert [node.cycle() for _ in range(3)] == [[], [], []]


def test_primed_answer_is_the_new_snapshot_in_the_asked_format() -> None:
    node = _Node()
    node.scrape(OPENMETRICS)
    node.cycle()
    node.scrape(OPENMETRICS)  # a second request: every cycle apart
    primed = node.cycle()
    assert [(content_type.split(";")[0], zipped) for content_type, zipped in primed] == [
        ("application/openmetrics-text", True)
    ]
    body = node.scrape(OPENMETRICS)
    assert b'gpu_test_value{gpu="0"} 2.0' in body  # the second cycle's snapshot
    assert body.rstrip().endswith(b"# EOF")


def test_format_is_primed_only_shortly_before_its_next_scrape() -> None:
    # Prometheus every 15 s, collection every second: encode near each scrape, not each cycle.
    node = _Node()
    primed_cycles = []
    for second in range(1, 61):
        if node.cycle():
            primed_cycles.append(second)
        if second % 15 == 0:
            node.scrape()
    # Until the second scrape the interval is unknown and nothing is primed; then only the
    # cycles just before each expected scrape.
    assert primed_cycles == [44, 45, 59, 60]


def test_a_single_request_primes_nothing() -> None:
    node = _Node()
    node.scrape()
    assert [node.cycle() for _ in range(70)] == [[]] * 70


def test_a_scraper_that_stops_stops_the_priming() -> None:
    node = _Node()
    for second in range(1, 121):
        node.cycle()
        if second in (10, 20):
            node.scrape("")
    assert node.cycle() == []


class _BlockingSamples(list):
    """A family's samples that hold whoever encodes them until `release` is set."""

    def __init__(self, samples: list, release: threading.Event, reached: threading.Event) -> None:
        super().__init__(samples)
        self._release, self._reached = release, reached

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._reached.set()
        assert self._release.wait(30)
        return super().__iter__()


def test_a_scrape_during_priming_gets_the_previous_snapshot_without_waiting() -> None:
    node = _Node()
    for _ in range(2):  # two requests a cycle apart: the format is primed from now on
        node.scrape(OPENMETRICS)
        node.cycle()
    release, reached = threading.Event(), threading.Event()
    slow = _snapshot(99)
    family = slow.families[0]
    family.samples = _BlockingSamples(family.samples, release, reached)
    node.clock.now += 1.0
    node.snapshot = slow
    priming = threading.Thread(target=node.endpoint.prime, args=(slow,))
    priming.start()
    try:
        assert reached.wait(30), "the collection thread never started encoding"
        # The encoding is stuck: the scrape is answered from the previous snapshot.
        answers: list[bytes] = []
        scrape = threading.Thread(target=lambda: answers.append(node.scrape(OPENMETRICS)))
        scrape.start()
        scrape.join(10)
        assert not scrape.is_alive(), "the scrape waited for the new snapshot's encoding"
        assert b'gpu_test_value{gpu="0"} 2.0' in answers[0]
    finally:
        release.set()
        priming.join(30)
    assert b'gpu_test_value{gpu="0"} 99.0' in node.scrape(OPENMETRICS)


def test_encoded_answers_are_handed_to_the_front_and_its_requests_count() -> None:
    node = _Node()
    handed: list[tuple[int, dict[tuple[str, bool], bytes]]] = []
    node.endpoint.publish = lambda generation, answers: handed.append((generation, answers))
    node.scrape(OPENMETRICS)  # a scrape the daemon answers: its encoding goes to the front
    assert len(handed) == 1
    ((_, answers),) = handed
    (key,) = answers
    assert key[0].startswith("application/openmetrics-text") and key[1]
    node.cycle()  # nothing due yet; the new snapshot still reaches the front, without answers
    assert handed[-1][1] == {}
    # The front answered the next request itself, and said so.
    node.endpoint.asked(key, handed[-1][0], node.clock.now)
    assert node.cycle() == [key]
    assert b'gpu_test_value{gpu="0"} 2.0' in gzip.decompress(handed[-1][1][key])
