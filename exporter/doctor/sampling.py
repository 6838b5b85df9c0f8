"""Gathering the doctor's window: from NVML or the simulator, or from Prometheus.

Locally the doctor runs the exporter's own collection cycle (every collector, GPUs in parallel)
at the collection interval for the window's length; nothing is served. From Prometheus it reads
the raw samples of the window that ends now for one ``instance`` in a single range query.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable

from exporter.alerting.history import History, labels_of, snapshot_samples
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.doctor.verdicts import Window


class SamplingError(RuntimeError):
    """Nothing could be measured; the message says why and what to do."""


# Called after each collection with (seconds elapsed, seconds in all, GPUs seen).
Progress = Callable[[float, float, int], None]


def sample_local(
    duration: float, interval: float, progress: Progress | None = None
) -> tuple[Window, int]:
    """Collect for ``duration`` seconds; return the window and how many GPUs NVML reported.

    Raises:
        SamplingError: NVML could not be initialised.
    """
    collection = Collection(
        {name: spec.enabled_by_default for name, spec in REGISTRY.items()},
        timeout=max(0.1, interval * 0.8),
        options={name: dict(spec.options) for name, spec in REGISTRY.items()},
    )
    history = History(lambda _name: duration * 2 + 10)
    started = time.monotonic()
    gpus = 0
    try:
        while True:
            snapshot = collection.run_cycle()
            if not snapshot.nvml_up:
                raise SamplingError(
                    "NVML is not available: install the NVIDIA driver (libnvidia-ml.so.1), "
                    "or try gpuload doctor --simulate SCENARIO"
                )
            gpus = len(snapshot.gpus)
            history.add(snapshot_samples(snapshot), snapshot.completed_at)
            elapsed = time.monotonic() - started
            if progress is not None:
                progress(min(elapsed, duration), duration, gpus)
            if elapsed >= duration:
                break
            time.sleep(max(0.0, interval - (time.monotonic() - started) % interval))
    finally:
        collection.close()
    return window_of(history, duration), gpus


def window_of(history: History, duration: float) -> Window:
    """The last ``duration`` seconds of a history as a window."""
    end = history.now or time.time()
    start = end - duration
    series = {name: history.points(name, start, end) for name in history.names()}
    found = {name: points for name, points in series.items() if points}
    return Window(found, start, end, history.keep)


def sample_prometheus(url: str, instance: str, duration: float, timeout: float = 10.0) -> Window:
    """The raw samples of ``instance`` over the last ``duration`` seconds, from Prometheus.

    Raises:
        SamplingError: Prometheus cannot be reached, refuses the query or has no such instance.
    """
    # Imported here: `gpuload serve` imports this module for its status page, never queries.
    import requests

    seconds = max(1, round(duration))
    query = f'{{__name__=~"gpu_.*|gpuload_.*",instance="{instance}"}}[{seconds}s]'
    end = time.time()
    try:
        response = requests.get(
            url.rstrip("/") + "/api/v1/query",
            params={"query": query, "time": f"{end:.3f}"},
            timeout=timeout,
        )
        answer = response.json()
    except requests.Timeout:
        raise SamplingError(
            f"cannot reach Prometheus at {url}: no answer within {timeout:g} s"
        ) from None
    except requests.ConnectionError as error:
        raise SamplingError(f"cannot reach Prometheus at {url}: {_reason(error)}") from None
    except requests.RequestException as error:
        raise SamplingError(f"cannot query Prometheus at {url}: {error}") from None
    except ValueError:
        raise SamplingError(
            f"cannot query Prometheus at {url}: its answer is not JSON (HTTP "
            f"{response.status_code}): is it the Prometheus server's URL?"
        ) from None
    if answer.get("status") != "success":
        raise SamplingError(f"Prometheus refused the query: {answer.get('error', answer)}")
    series: dict[str, dict] = {}
    for item in answer["data"]["result"]:
        metric = dict(item["metric"])
        name = metric.pop("__name__")
        points = [(float(t), float(v)) for t, v in item["values"]]
        series.setdefault(name, {})[labels_of(metric)] = points
    if not series:
        raise SamplingError(
            f'Prometheus at {url} has no gpuload samples of instance="{instance}" in the last '
            f"{seconds}s: check the instance label (host:port of the scrape target)"
        )
    return Window(series, end - seconds, end)


def _causes(error: BaseException) -> list[BaseException]:
    """The error and what caused it, outermost first (requests wraps urllib3 wraps socket)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        reason = getattr(current, "reason", None)
        wrapped = current.args[0] if current.args else None
        if isinstance(reason, BaseException):
            current = reason
        elif isinstance(wrapped, BaseException):
            current = wrapped
        else:
            current = current.__cause__ or current.__context__
    return chain


def _reason(error: BaseException) -> str:
    """Why a connection failed, in a few plain words rather than urllib3's retry message."""
    chain = _causes(error)
    plain: list[tuple[type[BaseException], str]] = [
        (ConnectionRefusedError, "connection refused"),
        (socket.gaierror, "unknown host name"),
        (ConnectionResetError, "connection reset"),
        (TimeoutError, "connection timed out"),
        (ssl.SSLError, "TLS handshake failed"),
    ]
    for kind, words in plain:
        if any(isinstance(cause, kind) for cause in chain):
            return words
    innermost = chain[-1]
    if isinstance(innermost, OSError) and innermost.strerror:
        return innermost.strerror.lower()
    return "connection failed"
