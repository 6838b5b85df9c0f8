"""One page per fault: what a person on call receives from each shipped scenario, and when.

Built-in alerting runs each scenario on the scenario's clock (tests/simnode.py) and delivers
through the relay's queue to a real webhook receiver on 127.0.0.1: every alert sends one firing
message and one resolved message, the alerts about one fault of one GPU are folded into one
(exporter/alerting/health.py's FOLDS), and the first page of a lost GPU leaves within 90 s of the
fault. promtool checks the same for the shipped rules where a GPU vanishes from its exporter's
scrapes, and where the exporter itself is missing.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_timelines import (
    Expect,
    Exporter,
    alert_labels,
    alerts,
    at_every_evaluation,
    constant,
    fires_between,
    last_fired,
    run_promtool,
)
from helpers import wait_until
from simnode import SimulatedNode

from exporter import config
from exporter.alerting import thresholds
from exporter.alerting.history import Sample
from exporter.alerting.local import LocalAlerting
from exporter.alerting.notify import Notifier
from exporter.sim.scenario import scenario_names

SCENARIOS = scenario_names()
# Scenario seconds each node runs: past every early fault and the first heat of thermal-throttle.
RUN = 6 * 60
INSTANCE = "node:19400"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")


class Receiver:
    """A real HTTP webhook receiver on 127.0.0.1 keeping each notification's alerts."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        alerts = self.alerts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                alerts.extend(body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def messages(scenario: str, tmp_path: Path, receiver: Receiver) -> tuple[float, list[dict]]:
    """The scenario's start, and every alert the receiver got from its first RUN seconds."""
    # The queue sends and expires its rows by the wall clock: the whole run lies in the past.
    start = float(int(time.time()) - RUN - 120)
    document = {
        "alerting": {
            "targets": {"hook": {"type": "webhook", "url": receiver.url}},
            "route": {"targets": ["hook"]},
            "queue": {"path": str(tmp_path / "alerts.db")},
        }
    }
    path = tmp_path / "gpuload.yaml"
    path.write_text(yaml.safe_dump(document))
    delivery = config.load(file=path).alerting.delivery
    assert delivery is not None
    node = SimulatedNode(scenario, start=start, seed=1, instance=INSTANCE)
    notifier = Notifier(delivery, f"http://{INSTANCE}/")
    local = LocalAlerting(
        node.thresholds, instance=INSTANCE, notifier=notifier, evaluation_interval=15, now=start
    )
    local.start()
    try:
        while node.snapshot is None or node.snapshot.completed_at < start + RUN:
            node.snapshot = node.collection.run_cycle()
            local.observe(node.snapshot)
            node.clock.sleep(node.interval)
        wait_until(
            lambda: (
                notifier.queue.states().get("hook", None) is None
                or notifier.queue.states()["hook"].queued == 0
            ),
            what="every message delivered",
        )
    finally:
        local.stop()
        node.close()
    return start, list(receiver.alerts)


def _key(alert: dict[str, Any]) -> str:
    return json.dumps(sorted(alert["labels"].items()))


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# The pages of the scenarios with a fault, by GPU: one per fault, by the alert that says it best.
PAGES = {
    # GPU 3 falls off the bus at 60 s, with XID 79: GPUFellOffBus, not the XID.
    "fell-off-bus": {"3": ["GPUFellOffBus"]},
    # GPU 1's uncorrectable error waits for a reset (XIDs 94, 63); GPU 2's repair failed
    # (XIDs 95, 64): the worst alert of each memory fault.
    "ecc-remap": {"1": ["GPUECCUncorrectable"], "2": ["GPURowRemapFailed"]},
}
# Alerts a scenario's fault never sends: the same fault, folded into another alert.
FOLDED = {
    # Every GPU heats up past its slowdown margin, its memory hot with it: the GPU's own
    # temperature and throttling alerts tell it.
    "thermal-throttle": {"GPUMemoryTemperatureHigh"},
    "fell-off-bus": {"GPUXidError"},
    "ecc-remap": {"GPUXidError", "GPURowRemapPending"},
}
# When each scenario's first fault happens, and the longest its first page may take.
FAULTS = {"fell-off-bus": 60.0, "ecc-remap": 30.0}
FIRST_PAGE = 90.0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_alert_sends_one_firing_and_one_resolved_and_a_gpu_pages_once_per_fault(
    scenario: str, tmp_path: Path, receiver: Receiver
) -> None:
    start, received = messages(scenario, tmp_path, receiver)
    by_alert: dict[str, list[str]] = {}
    for alert in received:
        by_alert.setdefault(_key(alert), []).append(alert["status"])
    for key, statuses in by_alert.items():
        assert statuses in (["firing"], ["firing", "resolved"]), (key, statuses)
    # One page per fault: never two critical alerts of one GPU firing at once.
    pages: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    for alert in received:
        labels = alert["labels"]
        if alert["status"] != "firing" or labels.get("severity") != "critical":
            continue
        ends = [_at(a["endsAt"]) for a in received if _key(a) == _key(alert) and a is not alert]
        span = (_at(alert["startsAt"]), min(ends, default=float("inf")), labels["alertname"])
        pages.setdefault((labels["instance"], labels.get("gpu", "")), []).append(span)
    for gpu, spans in pages.items():
        spans.sort()
        for (_, end, name), (begin, _, other) in itertools.pairwise(spans):
            assert begin >= end, f"{gpu}: {name} and {other} page at once"
    sent = {alert["labels"]["alertname"] for alert in received}
    assert not sent & FOLDED.get(scenario, set())
    if scenario in PAGES:
        firing: dict[str, list[str]] = {}
        for alert in received:
            if alert["status"] == "firing":
                gpu = alert["labels"].get("gpu", "")
                firing.setdefault(gpu, []).append(alert["labels"]["alertname"])
        assert firing == PAGES[scenario]
        first = min(_at(alert["startsAt"]) for alert in received)
        assert first - (start + FAULTS[scenario]) <= FIRST_PAGE


# GPU 0 of each exporter runs at 25% with a job on it, so GPUUtilizationLow fires within 8
# minutes; at VANISHES one exporter stops listing it, the other cannot be scraped for 2 minutes.
VANISHES = 900


@needs_promtool
@pytest.mark.parametrize("interval", [15, 30])
def test_a_vanished_gpu_stops_being_judged_and_a_missing_exporter_does_not(
    tmp_path: Path, interval: int
) -> None:
    gone = Exporter("gone", constant(0.25), vanishes=VANISHES)
    busy = Exporter("busy", constant(0.99), vanishes=VANISHES)
    down = Exporter("down", constant(0.25), down=[(VANISHES, VANISHES + 120)])
    for exporter in (gone, busy, down):
        exporter.gauges = {exporter.gpu("gpu_up"): constant(1.0)}
    gone_low = alert_labels("GPUUtilizationLow", gone)
    last = last_fired("GPUUtilizationLow", gone, interval)
    last_high = last_fired("GPUUtilizationHigh", busy, interval)
    expects = [
        fires_between("GPUUtilizationHigh", busy, 0, VANISHES - interval, interval),
        Expect(
            "GPUUtilizationHigh on busy last fires before the GPU vanished",
            f"{last_high} < bool {VANISHES}",
            (alert_labels("GPUUtilizationHigh", busy),),
        ),
        fires_between("GPUUtilizationLow", gone, 0, VANISHES - interval, interval),
        # The first scrape without the GPU is at VANISHES: the evaluation there no longer fires.
        Expect(
            "GPUUtilizationLow on gone last fires before the GPU vanished",
            f"{last} < bool {VANISHES}",
            (gone_low,),
        ),
        fires_between("GPUVanished", gone, VANISHES, VANISHES + interval, interval),
        fires_between("GPUUtilizationLow", down, 0, VANISHES - interval, interval),
        at_every_evaluation(
            "GPUUtilizationLow on down fires through its exporter's 2 minutes down",
            f"count({alerts('GPUUtilizationLow', down)})",
            VANISHES - interval,
            interval,
        ),
    ]
    run_promtool(tmp_path, [gone, busy, down], expects, interval)


def _busy(t: float, gpus: tuple[str, ...]) -> list[Sample]:
    """GPUs at 25% with a job since 0, at ``t``, and the exporter's collection time."""
    samples = [Sample("gpuload_last_collection_timestamp_seconds", (), t)]
    for gpu in gpus:
        labels = (("gpu", gpu), ("uuid", f"GPU-{gpu}"))
        samples += [
            Sample("gpu_up", labels, 1.0),
            Sample("gpu_utilization_seconds_total", labels, 0.25 * t),
            Sample("gpu_processes", labels, 1.0),
        ]
    return samples


def test_built_in_alerting_stops_judging_a_vanished_gpu_at_the_next_evaluation() -> None:
    local = LocalAlerting(thresholds.load(), instance=INSTANCE, evaluation_interval=15, now=0.0)
    for t in range(0, 900, 15):
        local.observe_samples(_busy(float(t), ("0", "1")), float(t))
    firing = {a.labels["gpu"] for a in local.alerts() if a.name == "GPUUtilizationLow"}
    assert firing == {"0", "1"}
    # GPU 1 is no longer listed; the exporter answers as before.
    changed = local.observe_samples(_busy(900.0, ("0",)), 900.0)
    assert [(a.name, a.labels["gpu"], a.state) for a in changed] == [
        ("GPUUtilizationLow", "1", "resolved")
    ]
