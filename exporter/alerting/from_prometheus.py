"""A node's recent history from Prometheus, for the doctor and for a daemon's start.

What `gpuload doctor --prometheus` judges, and what `gpuload serve --history.prometheus` starts
from instead of an empty window.

The samples of one exporter instance over the last minutes, as Prometheus stored them, fed to an
`Evaluator` scrape by scrape (`replay`), so that the rules judge them as they judged live ones.
"""

from __future__ import annotations

import socket
import ssl
import time

from exporter.alerting.evaluator import Evaluator
from exporter.alerting.history import Labels, Sample, labels_of


class SamplingError(RuntimeError):
    """Nothing could be measured; the message says why and what to do."""


def replay(
    evaluator: Evaluator, series: dict[str, dict[Labels, list[tuple[float, float]]]]
) -> None:
    """Feed raw samples to ``evaluator`` scrape by scrape, as Prometheus stored them.

    The samples of one scrape share its timestamp; a series missing from a scrape goes stale in
    the evaluator as it did in Prometheus.
    """
    scrapes: dict[float, list[Sample]] = {}
    for name, family in series.items():
        for labels, points in family.items():
            for at, value in points:
                scrapes.setdefault(at, []).append(Sample(name, labels, value))
    for at in sorted(scrapes):
        evaluator.observe(scrapes[at], at)
    last = evaluator.evaluated
    if scrapes and (last is None or last.at < max(scrapes)):
        evaluator.evaluate(max(scrapes))


def sample_prometheus(
    url: str, instance: str, duration: float, timeout: float = 10.0
) -> dict[str, dict[Labels, list[tuple[float, float]]]]:
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
    series: dict[str, dict[Labels, list[tuple[float, float]]]] = {}
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
    return series


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
