"""Live: a real Prometheus scraping simulated nodes names the states and alerts their pages show.

Four `gpuload serve --simulate` nodes (a hung collective, a starved input pipeline, a GPU that
falls off the bus, MIG instances) are scraped every 15 s by a real Prometheus 2.42 with the
shipped rule files. Once both have their rules' windows whole, Prometheus's recorded
``gpu:gpu_state:5m`` and ``ALERTS`` must name, for every GPU and MIG instance, what each node's
``/api/v1/status`` shows and what ``gpuload doctor --prometheus`` reports from the same raw
samples. The two sample on their own beats (Prometheus every 15 s, the exporter every second), so
the test waits until they agree, within a deadline, rather than at one instant. It runs in real
minutes: scripts/test runs it in a step of its own, beside the others (marker ``real_time``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import ROOT, Daemon, free_port, run_prometheus

from exporter.alerting import thresholds
from exporter.alerting.evaluator import not_local, warm_up_seconds
from tools import RULES_DIR

pytestmark = [
    pytest.mark.real_time,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus"),
]

SCRAPE = 15
SCENARIOS = ("hung-collective", "data-starved", "fell-off-bus", "h100-mig")
# (gpu, alertname, state, MIG instance or None)
AlertKey = tuple[int, str, str, int | None]


def _query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    answer = requests.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=10)
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def prometheus_view(prometheus: str, address: str) -> tuple[dict[int, str], set[AlertKey]]:
    """One node's GPU states and local alerts as Prometheus recorded them."""
    states = {
        int(item["metric"]["gpu"]): item["metric"]["state"]
        for item in _query(prometheus, f'gpu:gpu_state:5m{{instance="{address}"}}')
    }
    elsewhere = "|".join(not_local(thresholds.load()))
    alerts = {
        (
            int(m["gpu"]),
            m["alertname"],
            m["alertstate"],
            int(m["mig_instance"]) if "mig_instance" in m else None,
        )
        for item in _query(
            prometheus, f'ALERTS{{instance="{address}",alertname!~"{elsewhere}",gpu!=""}}'
        )
        for m in (item["metric"],)
    }
    return states, alerts


def status_view(daemon: Daemon) -> tuple[dict[int, str], set[AlertKey]]:
    """The same as the node's own status page shows it."""
    document = daemon.get("/api/v1/status").json()
    states = {card["index"]: card["verdict"]["state"] for card in document["gpus"]}
    alerts = {
        (card["index"], a["alertname"], a["state"], a.get("mig_instance"))
        for card in document["gpus"]
        for a in card["alerts"]
    }
    return states, alerts


def doctor_view(prometheus: str, address: str) -> tuple[dict[int, str], set[AlertKey]]:
    """What `gpuload doctor` makes of Prometheus's raw samples of the node."""
    command = [sys.executable, "-m", "exporter", "doctor", "--prometheus", prometheus]
    command += ["--instance", address, "--json", "--duration", "10m"]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    report = json.loads(result.stdout)
    states = {gpu["gpu"]: gpu["state"] for gpu in report["gpus"]}
    alerts = {
        (gpu["gpu"], a["alertname"], a["state"], a.get("mig_instance"))
        for gpu in report["gpus"]
        for a in gpu["alerts"]
    }
    return states, alerts


def test_prometheus_the_status_page_and_the_doctor_agree_live(
    tmp_path: Path,
    daemon_factory: Callable[..., Daemon],
    processes: Callable[..., object],
) -> None:
    loaded = thresholds.load()
    epoch = str(time.time())
    addresses = {scenario: f"127.0.0.1:{free_port()}" for scenario in SCENARIOS}
    daemons = {
        scenario: daemon_factory(
            "--simulate", scenario, "--sim.epoch", epoch, "--web.listen-address", address
        )
        for scenario, address in addresses.items()
    }
    rule_files = [
        str(RULES_DIR / name)
        for name in ("gpuload-recording.rules.yml", "gpuload-alerts.rules.yml")
    ]
    prometheus = run_prometheus(
        processes,  # type: ignore[arg-type]
        tmp_path,
        {
            "global": {"scrape_interval": f"{SCRAPE}s", "evaluation_interval": f"{SCRAPE}s"},
            "rule_files": rule_files,
            "scrape_configs": [
                {"job_name": "gpuload", "static_configs": [{"targets": list(addresses.values())}]}
            ],
        },
    )
    # Both sides have their windows whole a warm-up and a scrape after the start; then they get
    # a few minutes to meet.
    settled = time.time() + warm_up_seconds(loaded) + 2 * SCRAPE
    deadline = settled + 4 * 60
    while time.time() < settled:
        time.sleep(5)
    pending = set(SCENARIOS)
    seen: dict[str, tuple[Any, Any]] = {}
    while pending and time.time() < deadline:
        for scenario in sorted(pending):
            address = addresses[scenario]
            recorded = prometheus_view(prometheus, address)
            shown = status_view(daemons[scenario])
            seen[scenario] = (recorded, shown)
            if recorded == shown and recorded[0]:
                pending.discard(scenario)
        time.sleep(SCRAPE / 3)
    assert not pending, {s: seen[s] for s in pending}
    # The doctor replays the same raw samples Prometheus evaluated: the same states; and the
    # alerts it evaluates itself from them, the same names and states.
    for scenario, address in addresses.items():
        recorded = prometheus_view(prometheus, address)
        assert doctor_view(prometheus, address)[0] == recorded[0], scenario
