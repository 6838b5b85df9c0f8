"""`serve --history.prometheus`: a start with no history file takes its history from Prometheus.

A real Prometheus scrapes one daemon for a few seconds; a second daemon of the same simulated
node starts with `--history.prometheus` and its rules judge, from its first cycle, the samples
Prometheus holds: their warm-up has already seen those seconds. A Prometheus that cannot answer
is a cold start and one log line, never a failed start.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from helpers import Daemon, run_prometheus, wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="needs Debian's prometheus"
)
# Seconds of samples Prometheus must hold before the second daemon starts.
HELD = 8


def seen_seconds(daemon: Daemon) -> float:
    return float(daemon.get("/api/v1/status").json()["rules"]["seen_seconds"])


def test_a_start_takes_its_history_from_prometheus(
    tmp_path: Path,
    daemon_factory: Callable[..., Daemon],
    processes: Callable[..., subprocess.Popen[str]],
) -> None:
    first = daemon_factory("--simulate", "training")
    address = first.url.removeprefix("http://").rstrip("/")
    job = {
        "job_name": "gpuload",
        "scrape_interval": "1s",
        "scrape_timeout": "900ms",
        "static_configs": [{"targets": [address]}],
    }
    prometheus = run_prometheus(processes, tmp_path, {"scrape_configs": [job]})

    def held() -> bool:
        answer = requests.get(
            prometheus + "/api/v1/query",
            params={"query": f'count_over_time(gpu_up{{gpu="0"}}[1m]) >= {HELD + 1}'},
            timeout=10,
        ).json()
        return bool(answer["data"]["result"])

    wait_until(held, timeout=60, what=f"{HELD} s of samples in Prometheus")
    second = daemon_factory(
        "--simulate", "training", "--history.prometheus", prometheus, "--history.instance", address
    )
    wait_until(lambda: "history taken from Prometheus" in second.log(), what="the history taken")
    # Its rules have seen what Prometheus held, not just its own first cycles.
    assert seen_seconds(second) >= HELD
    assert " 0 series" not in second.log()


def test_a_prometheus_that_cannot_answer_is_a_cold_start_said_once(
    daemon_factory: Callable[..., Daemon],
) -> None:
    daemon = daemon_factory(
        "--simulate",
        "training",
        "--history.prometheus",
        "http://127.0.0.1:9",
        "--history.instance",
        "x",
    )
    wait_until(lambda: "a cold start" in daemon.log(), what="the cold start's line")
    assert daemon.get("/readyz").status_code == 200
    assert daemon.log().count("history not taken from Prometheus") == 1
    assert "cannot reach Prometheus at http://127.0.0.1:9" in daemon.log()
