"""Live: an exporter restarted in the middle of a low stretch fires its alerts with its twin.

Two simulated `data-starved` nodes in the same phase (the same scenario epoch), scraped every
15 s by a real Prometheus 2.42 with the shipped rule files as they are (5-minute `for:`). One is
killed a minute and a half into the stretch and started again 20 s later: its series go stale, its
counters start again at 0. Its GPUUtilizationLow and GPUDataLoaderStarved must fire no later than
the undisturbed node's plus one scrape interval plus 60 s (the previous rules restarted the wait
twice and fired minutes later). It runs in real minutes, so scripts/test runs it as a step of its
own, beside the other steps (marker `real_time`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from helpers import Daemon, free_port, run_prometheus

from tools import RULES_DIR

pytestmark = [
    pytest.mark.real_time,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus"),
]

SCRAPE = 15
ALERTS = ("GPUUtilizationLow", "GPUDataLoaderStarved")
KILLED_AT = 90.0  # seconds after the first scrape
DOWN_FOR = 20.0
LATE = SCRAPE + 60


def firing_since(prometheus: str) -> dict[tuple[str, str, str], float]:
    """(alert, scenario node, gpu) -> when Prometheus first saw it firing (time.time())."""
    alerts = requests.get(prometheus + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return {
        (a["labels"]["alertname"], a["labels"]["node"], a["labels"]["gpu"]): time.time()
        for a in alerts
        if a["state"] == "firing" and a["labels"]["alertname"] in ALERTS
    }


def test_a_restarted_exporter_fires_with_its_twin(
    tmp_path: Path,
    daemon_factory: Callable[..., Daemon],
    processes: Callable[..., object],
) -> None:
    epoch = str(time.time())
    addresses = {node: f"127.0.0.1:{free_port()}" for node in ("steady", "restarted")}

    def start(node: str) -> Daemon:
        return daemon_factory(
            "--simulate",
            "data-starved",
            "--sim.epoch",
            epoch,
            "--web.listen-address",
            addresses[node],
        )

    daemons = {node: start(node) for node in addresses}
    rule_files = [str(RULES_DIR / f) for f in ("gpuload-recording.rules.yml",)]
    rule_files.append(str(RULES_DIR / "gpuload-alerts.rules.yml"))
    prometheus = run_prometheus(
        processes,  # type: ignore[arg-type]
        tmp_path,
        {
            "global": {"scrape_interval": f"{SCRAPE}s", "evaluation_interval": f"{SCRAPE}s"},
            "rule_files": rule_files,
            "scrape_configs": [
                {
                    "job_name": "gpuload",
                    "static_configs": [
                        {"targets": [address], "labels": {"node": node}}
                        for node, address in addresses.items()
                    ],
                }
            ],
        },
    )
    started = time.time()
    first: dict[tuple[str, str, str], float] = {}
    restarted = False
    deadline = started + 12 * 60
    while time.time() < deadline:
        now = time.time()
        if not restarted and now - started >= KILLED_AT:
            daemons["restarted"].process.kill()
            daemons["restarted"].process.wait()
            time.sleep(DOWN_FOR)
            daemons["restarted"] = start("restarted")
            restarted = True
        for key, seen in firing_since(prometheus).items():
            first.setdefault(key, seen)
        steady = {k: t for k, t in first.items() if k[1] == "steady"}
        if len(steady) == 16 and time.time() > max(steady.values()) + LATE + 5:
            break
        time.sleep(1)
    steady = {(name, gpu): t for (name, node, gpu), t in first.items() if node == "steady"}
    late = {(name, gpu): t for (name, node, gpu), t in first.items() if node == "restarted"}
    assert len(steady) == 2 * 8, f"the undisturbed node fired only {sorted(steady)}"
    assert restarted
    for key, when in sorted(steady.items()):
        assert key in late, f"{key} never fired on the restarted node"
        assert late[key] <= when + LATE, (
            f"{key}: the restarted node fired {late[key] - when:.0f} s after its twin"
        )
