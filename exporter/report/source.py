"""A Prometheus-compatible query API: Prometheus, VictoriaMetrics, Thanos, Mimir.

Only ``GET /api/v1/query`` is used (https://prometheus.io/docs/prometheus/latest/querying/api/,
"Instant queries"; VictoriaMetrics serves the same path and answer,
https://docs.victoriametrics.com/victoriametrics/url-examples/#apiv1query). Anything but a
``"status": "success"`` vector answer is a :class:`SourceError` in one line that names the URL
and what was wrong with it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

# One series of an instant vector: its labels and value.
Sample = tuple[dict[str, str], float]


class SourceError(RuntimeError):
    """The query API could not be reached or did not answer like one."""


@dataclass(frozen=True)
class Source:
    """The query API at ``url`` (``http://prometheus:9090``, a path prefix allowed)."""

    url: str
    timeout: float = 60.0

    def query(self, expr: str, at: float) -> list[Sample]:
        """The instant vector ``expr`` evaluates to at Unix time ``at``."""
        address = self.url.rstrip("/") + "/api/v1/query"
        body = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(
            address,
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise SourceError(
                f"{self.url}: the query API answered HTTP {error.code}: {_reason(error.read())}"
            ) from error
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise SourceError(f"cannot reach a Prometheus at {self.url}: {reason}") from error
        return self._vector(raw)

    def _vector(self, raw: bytes) -> list[Sample]:
        try:
            answer = json.loads(raw)
            if answer.get("status") != "success":
                raise SourceError(f"{self.url}: the query failed: {answer.get('error', answer)}")
            data = answer["data"]
            if data["resultType"] != "vector":
                raise SourceError(
                    f"{self.url}: expected a vector answer, got {data['resultType']!r}"
                )
            return [(dict(item["metric"]), float(item["value"][1])) for item in data["result"]]
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
            raise SourceError(
                f"{self.url} does not answer like a Prometheus query API "
                f"(expected /api/v1/query's JSON): {raw[:80]!r}"
            ) from error


def _reason(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("error") or raw[:120].decode(errors="replace"))
    except (ValueError, AttributeError):
        return raw[:120].decode(errors="replace").strip() or "no body"
