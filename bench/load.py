"""Scrapers, the profiler and the arithmetic the benchmark reports."""

from __future__ import annotations

import collections
import gzip
import math
import multiprocessing
import random
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# What Prometheus 2.x sends: OpenMetrics preferred, the text format accepted, gzip asked.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Accept-Encoding": "gzip",
}
PLAIN_HEADERS = {"Accept": "text/plain;version=0.0.4"}


def scrape(port: int, headers: dict[str, str], path: str = "/metrics") -> tuple[float, bytes]:
    """One scrape on a fresh connection, as Prometheus's first scrape does; (seconds, body)."""
    return request(port, "GET", path, headers)


def request(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[float, bytes]:
    """One HTTP/1.1 request on a fresh connection; (seconds, body), an error unless 200.

    A plain socket client: Prometheus's and Alertmanager's Go clients spend microseconds on a
    request, while http.client's request building and header parsing took half of the
    measured scrape latency with 10 concurrent scrapers on 2 cores (bench/OPTIMIZATIONS.md,
    item 21).
    """
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    message = ("\r\n".join([*lines, "Connection: close", "", ""])).encode("ascii") + body
    chunks = []
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(message)
        while chunk := connection.recv(1 << 18):
            chunks.append(chunk)
    seconds = time.perf_counter() - started
    return seconds, _body(b"".join(chunks))


def _body(answer: bytes) -> bytes:
    """The body of a whole HTTP/1.x answer read to the end; an error unless 200 and complete."""
    head, separator, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    if not separator or status_line.split(" ")[1:2] != ["200"]:
        raise RuntimeError(f"answered {status_line!r}")
    headers = dict(line.lower().split(":", 1) for line in header_lines if ":" in line)
    if "chunked" in headers.get("transfer-encoding", ""):
        # gunicorn's answer to an application that gives no Content-Length (bench/servers.py).
        return _unchunked(body)
    length = headers.get("content-length")
    if length is not None and int(length) != len(body):
        raise RuntimeError(f"answered {len(body)} of {int(length)} bytes")
    return body


def _unchunked(body: bytes) -> bytes:
    """A chunked body's data; an error unless it ends with its last (empty) chunk."""
    data: list[bytes] = []
    at = 0
    while True:
        line_end = body.find(b"\r\n", at)
        if line_end < 0:
            raise RuntimeError("answered a chunked body cut short")
        size = int(body[at:line_end].split(b";", 1)[0], 16)
        if size == 0:
            return b"".join(data)
        start = line_end + 2
        if len(body) < start + size + 2:
            raise RuntimeError("answered a chunked body cut short")
        data.append(body[start : start + size])
        at = start + size + 2


def scrape_latencies(port: int, scrapers: int, per_scraper: int) -> list[float]:
    """Latency of every scrape when `scrapers` processes scrape back to back at the same time.

    Processes, as concurrent scrapers are separate Prometheus servers: threads of this one
    process would wait for each other's GIL, and that wait would count as the exporter's.
    """
    if scrapers == 1:
        return _scrape_back_to_back(port, per_scraper)
    latencies, _wall = in_processes(_scrape_back_to_back, [(port, per_scraper)] * scrapers)
    return latencies


def in_processes(
    work: Callable[..., list[float]], arguments: list[tuple[Any, ...]]
) -> tuple[list[float], float]:
    """`work(*args)` in a forked process for each args, all started at once.

    Returns their results joined, and the wall seconds from the start until the last ended.
    """
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(len(arguments) + 1), context.SimpleQueue()
    processes = [
        context.Process(target=_after, args=(start, results, work, args)) for args in arguments
    ]
    for process in processes:
        process.start()
    start.wait()
    started = time.perf_counter()
    runs = [results.get() for _ in processes]
    wall = time.perf_counter() - started
    for process in processes:
        process.join()
    return [value for run in runs for value in run], wall


def _after(
    start: Any, results: Any, work: Callable[..., list[float]], args: tuple[Any, ...]
) -> None:
    start.wait()
    results.put(work(*args))


def _scrape_back_to_back(port: int, count: int) -> list[float]:
    return [scrape(port, PROMETHEUS_HEADERS)[0] for _ in range(count)]


def spread_latencies(port: int, count: int, seed: int = 1) -> list[float]:
    """Latency of `count` scrapes 0-30 ms apart at random, over several collection cycles.

    Each lands at a random moment of its cycle, as a scraper that does not know the exporter's
    schedule does.
    """
    pause = random.Random(seed)
    results = []
    for _ in range(count):
        time.sleep(pause.uniform(0, 0.03))
        seconds, _body = scrape(port, PROMETHEUS_HEADERS)
        results.append(seconds)
    return results


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(0, math.ceil(fraction * len(ordered)) - 1)
    return ordered[rank]


def median(values: list[float]) -> float:
    """The median, nan for none."""
    return percentile(values, 0.5)


def exposition(port: int) -> tuple[str, int]:
    """The plain text format (decoded) and the size of the same scrape gzip-compressed."""
    _seconds, body = scrape(port, PLAIN_HEADERS)
    _seconds, compressed = scrape(port, {**PLAIN_HEADERS, "Accept-Encoding": "gzip"})
    if compressed[:2] != b"\x1f\x8b":
        compressed = gzip.compress(compressed)
    return body.decode(), len(compressed)


def series(text: str) -> int:
    """Samples in an exposition: the lines that are not comments."""
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def values_of(text: str, name: str) -> list[float]:
    """Every sample value of the metric `name` in a text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return [float(match.group(1)) for match in pattern.finditer(text)]


def sleep_cost(seconds: float, repeat: int = 200) -> float:
    """How long ``time.sleep(seconds)`` really takes here (the simulator's latency is a sleep)."""
    if seconds <= 0:
        return 0.0
    taken = []
    for _ in range(min(repeat, max(5, int(0.5 / seconds)))):
        started = time.perf_counter()
        time.sleep(seconds)
        taken.append(time.perf_counter() - started)
    return median(taken)


def profile_share(py_spy: Path, pid: int, seconds: float) -> float | None:
    """Fraction of the daemon's GIL-holding samples spent in the simulated NVML (py-spy --gil).

    Only the thread holding the GIL is sampled, so the samples follow the Python CPU time; a
    stack with any frame in exporter/sim/ is the simulator's cost, which a real (C) libnvidia-ml
    would replace with its own.
    """
    with tempfile.TemporaryDirectory() as workdir:
        raw = Path(workdir) / "profile.txt"
        done = subprocess.run(
            [
                str(py_spy),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                "200",
                "--gil",
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(raw),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not raw.exists():
            return None
        counts: collections.Counter[bool] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if count.isdigit():
                counts["exporter/sim/" in stack] += int(count)
    total = counts[True] + counts[False]
    return counts[True] / total if total else None
