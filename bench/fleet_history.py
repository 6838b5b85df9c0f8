"""Hours of history before the run, so the dashboard's range queries read a full default range.

A run lasts minutes; the fleet dashboard opens on its last 6 hours. For the panels' range queries
to read what they would read on a fleet Prometheus that has been up that long, the series the
panels read (the exporter's families and the recorded ones) get the hours before the run filled
in: each series' own samples from the run, repeated back in time at the scrape interval. They are
written as OpenMetrics, turned into TSDB blocks by ``promtool tsdb create-blocks-from
openmetrics``, and moved into the running Prometheus's data folder, which loads new blocks once a
minute. Only the families the panels name are filled in: the head, and every figure measured
before, are those of the live fleet.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# promtool writes blocks of 2 hours (tsdb.DefaultBlockDuration), aligned to multiples of it.
BLOCK_SECONDS = 2 * 3600

Series = tuple[dict[str, str], list[float]]  # labels (with __name__), the run's values in order


def fill(
    query: Callable[[str], list[dict[str, Any]]],
    names: list[str],
    *,
    start: float,
    seconds: int,
    step: int,
    promtool: str,
    folder: Path,
    data: Path,
) -> int:
    """Write ``seconds`` of history before ``start`` into ``data``; return the blocks moved in.

    ``query`` is an instant query returning the API's result list; each name is read as
    ``name[...]`` over the run, so the history repeats each series' real values.
    """
    series = [s for name in names for s in _run_series(query, name, start)]
    first = start - seconds
    stamps = [first + step * index for index in range(seconds // step)]
    made = folder / "blocks"
    made.mkdir(exist_ok=True)
    for low in range(_floor(first), math.ceil(start), BLOCK_SECONDS):
        chunk = [t for t in stamps if low <= t < low + BLOCK_SECONDS]
        if not chunk:
            continue
        text = folder / "history.om.txt"
        with text.open("w", encoding="utf-8") as output:
            output.writelines(_openmetrics(series, chunk, stamps.index(chunk[0])))
        subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--quiet",
                str(text),
                str(made),
            ],
            check=True,
            capture_output=True,
        )
        text.unlink()
    blocks = [block for block in made.iterdir() if (block / "meta.json").exists()]
    for block in blocks:
        block.rename(data / block.name)
    return len(blocks)


def wait_loaded(loaded: Callable[[], bool], blocks: int, timeout: float = 150.0) -> None:
    """Wait until ``loaded()`` says Prometheus has read the new blocks (it looks once a minute)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if loaded():
            return
        time.sleep(2)
    raise RuntimeError(f"Prometheus did not load the {blocks} history blocks in {timeout:.0f} s")


def _run_series(
    query: Callable[[str], list[dict[str, Any]]], name: str, start: float
) -> list[Series]:
    window = max(1, math.ceil(time.time() - start))
    found = []
    for result in query(f"{name}[{window}s]"):
        values = [float(value) for _, value in result["values"]]
        if values:
            found.append((result["metric"], values))
    return found


def _openmetrics(series: list[Series], stamps: list[float], offset: int) -> Iterator[str]:
    """One family after the other, each series' samples in time order; ``# EOF`` at the end."""
    for labels, values in series:
        head = _selector(labels)
        for index, stamp in enumerate(stamps, start=offset):
            yield f"{head} {values[index % len(values)]!r} {stamp:.3f}\n"
    yield "# EOF\n"


def _selector(labels: dict[str, str]) -> str:
    pairs = ",".join(
        f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()) if key != "__name__"
    )
    return f"{labels['__name__']}{{{pairs}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _floor(seconds: float) -> int:
    return int(seconds // BLOCK_SECONDS * BLOCK_SECONDS)
