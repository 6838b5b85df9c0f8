"""End to end: real gpuload, Prometheus and Alertmanager on 127.0.0.1 deliver the shipped alerts.

Six simulated nodes are scraped by one Prometheus every second: `data-starved` must raise
GPUUtilizationLow and GPUDataLoaderStarved on every GPU, `saturated` GPUUtilizationHigh,
`hung-collective` GPUJobHung (and not GPUUtilizationHigh), `fell-off-bus` GPUFellOffBus alone
(its XID 79 folded into it), which stays the same firing alert across a restart of that node's
exporter, `ecc-remap` one alert per memory fault, and the healthy `training` node nothing at
all. Prometheus loads a test copy of the rule files rendered from the shipped thresholds with
these changes: both averaging windows are 30s instead of 5m and 1m (the rules record a window's
rate once a node has been scraped for a whole window), and the `for:` durations
(GPUUtilizationHigh's window, which GPUJobHung shares, too) are divided by 30 (5m -> 10s), and the
gap tolerance is 1m; the test proves the copy differs in nothing else. Alertmanager loads the
inhibit rules of alert_rules/thresholds.yaml as written there (the block docs/runbooks.md
documents: tests/test_alert_rules.py keeps the two equal), and the test proves each suppresses what
it claims; it routes the alerts to a webhook receiver running in this test.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import (
    Daemon,
    answers,
    free_port,
    parse_metrics,
    run_prometheus,
    series,
    wait_until,
)

from exporter.alerting import rules, thresholds
from exporter.alerting.thresholds import duration_seconds
from tools import RULES_DIR

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.skipif(
        not (PROMETHEUS and ALERTMANAGER),
        reason="needs Debian's prometheus and prometheus-alertmanager (scripts/test installs them)",
    ),
    pytest.mark.engines,
]

# `for:` durations in the test copy are the shipped ones divided by this.
SPEEDUP = 30
# The averaging window of the test copy: one period of `training`'s saw, a tenth of the shipped.
WINDOW = "30s"
SHIPPED = thresholds.load()
# GPUUtilizationHigh and GPUJobHung judge their `for:` as a window inside the expression: it is
# shortened through the thresholds.
_HIGH = SHIPPED.alert("GPUUtilizationHigh")
TEST_THRESHOLDS = replace(
    SHIPPED,
    window=WINDOW,
    short_window=WINDOW,
    # Longer than the window, as the thresholds require: the first sample after a gap is
    # measured over it.
    gap_tolerance="1m",
    alerts={
        **SHIPPED.alerts,
        **{
            name: replace(SHIPPED.alert(name), for_=f"{duration_seconds(_HIGH.for_) // SPEEDUP}s")
            for name in ("GPUUtilizationHigh", "GPUJobHung")
        },
    },
)
AVERAGE = rules.recording_names(TEST_THRESHOLDS)["avg"]
# The healthy `training` scenario saws with a 30 s period: 27 s near 96%, then a 3 s dip to 72%
# (93.6% on average). A window that holds less than one period can read above 95%, which a 5 m
# window never does. So Prometheus is given the node (file_sd, applied as the file changes) a few
# seconds before a dip: its first scrape comes before the dip ends, and from the dip on every
# partial window holds one; the seconds before it are shorter than the shortened 10 s `for:`.
# The node is already up then, so how long a busy machine takes to start it does not matter.
TRAINING_PERIOD = 30.0
TRAINING_DIP_STARTS = 27.0
TRAINING_LEAD = 4.0
UTILIZATION_ALERTS = {
    "GPUUtilizationLow",
    "GPUUtilizationHigh",
    "GPUJobHung",
    "GPUDataLoaderStarved",
}
# `fell-off-bus` loses GPU 3 (XID 79) 60 s into its scenario: started this far into it.
FELL_OFF_BUS_START = 52.0


def shortened(rule_file: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of a rule file with every `for:` divided by SPEEDUP, nothing else changed."""
    result = copy.deepcopy(rule_file)
    for group in result["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{duration_seconds(rule['for']) * 1000 // SPEEDUP}ms"
    return result


def without_for(rule_file: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(rule_file)
    for group in result["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    return result


@dataclass
class Receiver:
    """A webhook receiver: every notification Alertmanager posts, as parsed JSON."""

    url: str
    notifications: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [alert for note in self.notifications for alert in note["alerts"]]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with holder[0].lock:
                holder[0].notifications.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Keep the test output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}/"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    server.shutdown()
    server.server_close()


def write_rules(folder: Path) -> list[Path]:
    """Write the test copy of the shipped rule files; prove it differs only in window and `for:`."""
    folder.mkdir()
    written = []
    copies = rules.rule_files(TEST_THRESHOLDS)
    for shipped in sorted(RULES_DIR.glob("*.rules.yml")):
        original = yaml.safe_load(shipped.read_text(encoding="utf-8"))
        # The shipped file is what its thresholds render: the copy is rendered the same way.
        assert original == rules.rule_files(thresholds.load())[shipped.name]
        fast = shortened(copies[shipped.name])
        assert without_for(fast) == without_for(copies[shipped.name])
        assert fast != original or "alerts" not in shipped.name
        target = folder / shipped.name
        target.write_text(yaml.safe_dump(fast, sort_keys=False), encoding="utf-8")
        written.append(target)
    return written


def shipped_inhibit_rules() -> list[dict[str, Any]]:
    """The inhibit rules of alert_rules/thresholds.yaml, in Alertmanager's syntax as written."""
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = document["inhibit_rules"]
    return found


def start_alertmanager(
    tmp_path: Path, receiver: Receiver, start: Callable[..., subprocess.Popen[str]]
) -> str:
    port = free_port()
    config = {
        "inhibit_rules": shipped_inhibit_rules(),
        "route": {
            "receiver": "test",
            "group_by": ["alertname", "instance"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "test", "webhook_configs": [{"url": receiver.url, "send_resolved": False}]}
        ],
    }
    config_file = tmp_path / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    assert ALERTMANAGER is not None
    process = start(
        ALERTMANAGER,
        f"--config.file={config_file}",
        f"--storage.path={tmp_path / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        log=tmp_path / "alertmanager.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: answers(url + "/-/ready") or process.poll() is not None, what="alertmanager")
    assert process.poll() is None, (tmp_path / "alertmanager.log").read_text()
    return url


def start_prometheus(
    tmp_path: Path,
    targets: dict[str, str],
    alertmanager: str,
    start: Callable[..., subprocess.Popen[str]],
    later: Path | None = None,
) -> str:
    """Start Prometheus scraping `targets` now, and what `later` (a file_sd file) will list."""
    rule_files = write_rules(tmp_path / "rules")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [alertmanager.removeprefix("http://")]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": "gpuload",
                "static_configs": [
                    {"targets": [address], "labels": {"scenario": scenario}}
                    for scenario, address in targets.items()
                ],
                **({"file_sd_configs": [{"files": [str(later)]}]} if later else {}),
            }
        ],
    }
    return run_prometheus(start, tmp_path, config)


def gpu_uuids(daemon: Daemon) -> dict[str, str]:
    """GPU index -> UUID as the daemon itself reports them in gpu_info."""
    info = series(parse_metrics(daemon.get("/metrics").text), "gpu_info")
    return {dict(labels)["gpu"]: dict(labels)["uuid"] for labels in info}


def check_alert(
    alert: dict[str, Any],
    *,
    severity: str,
    scenario: str,
    instance: str,
    uuids: dict[str, str] | None,
    summary: str,
    description: str,
) -> float:
    """Assert an alert's exact labels and annotations (Alertmanager's API form); return its value.

    ``uuids`` None: the alert carries no UUID (GPUFellOffBus). The `value` annotation, which the
    relay's messages show, must be the value the description quotes.
    """
    labels = alert["labels"]
    gpu = labels["gpu"]
    expected = {
        "alertname": labels["alertname"],
        "severity": severity,
        "instance": instance,
        "job": "gpuload",
        "scenario": scenario,
        "gpu": gpu,
    }
    if uuids is not None:
        expected["uuid"] = uuids[gpu]
    assert labels == expected
    annotations = alert["annotations"]
    assert annotations["summary"] == summary
    assert annotations["runbook_url"] == thresholds.load().runbook_url(labels["alertname"])
    where = f"GPU {gpu} ({uuids[gpu]}) on {instance}" if uuids else f"GPU {gpu} on {instance}"
    pattern = description.format(where=re.escape(where), value=r"([0-9.]+)%")
    match = re.fullmatch(pattern, annotations["description"])
    assert match, annotations["description"]
    if match.groups():
        assert annotations["value"].startswith(f"{match.group(1)}%"), annotations
        return float(match.group(1))
    return math.nan


def prometheus_alerts(prometheus: str) -> list[dict[str, Any]]:
    """Prometheus's pending and firing alerts (/api/v1/alerts)."""
    response = requests.get(prometheus + "/api/v1/alerts", timeout=5).json()
    found: list[dict[str, Any]] = response["data"]["alerts"]
    return found


def alertmanager_alerts(alertmanager: str) -> list[dict[str, Any]]:
    """Alertmanager's alerts, suppressed ones included, with their state (/api/v2/alerts)."""
    found: list[dict[str, Any]] = requests.get(alertmanager + "/api/v2/alerts", timeout=5).json()
    return found


def of(alerts: list[dict[str, Any]], alertname: str, scenario: str) -> list[dict[str, Any]]:
    return [
        alert
        for alert in alerts
        if alert["labels"]["alertname"] == alertname and alert["labels"].get("scenario") == scenario
    ]


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    response = requests.get(prometheus + "/api/v1/query", params={"query": expr}, timeout=5)
    found: list[dict[str, Any]] = response.json()["data"]["result"]
    return found


# (alertname, scenario, how many): every alert the nodes must raise, all GPUs of a node alike.
EXPECTED = (
    ("GPUUtilizationLow", "data-starved", 8),
    ("GPUDataLoaderStarved", "data-starved", 8),
    ("GPUUtilizationHigh", "saturated", 8),
    ("GPUJobHung", "hung-collective", 8),
    ("GPUFellOffBus", "fell-off-bus", 1),
    ("GPUECCUncorrectable", "ecc-remap", 1),
    ("GPURowRemapFailed", "ecc-remap", 1),
)
# What Alertmanager notifies of the faulty nodes: one alert per fault, each GPU's once.
PAGED = {
    "fell-off-bus": [("GPUFellOffBus", "3")],
    "ecc-remap": [("GPUECCUncorrectable", "1"), ("GPURowRemapFailed", "2")],
}


def test_each_node_raises_its_alerts_inhibitions_hold_and_healthy_training_stays_quiet(
    tmp_path: Path,
    daemon_factory: Callable[..., Daemon],
    receiver: Receiver,
    processes: Callable[..., subprocess.Popen[str]],
) -> None:
    interval = ("--collect.interval", "1s")
    starved = daemon_factory("--simulate", "data-starved", *interval)
    saturated = daemon_factory("--simulate", "saturated", *interval)
    hung = daemon_factory("--simulate", "hung-collective", *interval)
    fell_epoch = str(time.time() - FELL_OFF_BUS_START)
    fell = daemon_factory("--simulate", "fell-off-bus", *interval, "--sim.epoch", fell_epoch)
    # Past both of its memory faults (30 s and 90 s).
    ecc_epoch = str(time.time() - 100)
    ecc = daemon_factory("--simulate", "ecc-remap", *interval, "--sim.epoch", ecc_epoch)
    # Its scenario starts 15 s back, so that its next dip usually comes soon after the others.
    epoch = time.time() - 15
    training = daemon_factory("--simulate", "training", *interval, "--sim.epoch", str(epoch))
    targets = {
        name: daemon.url.removeprefix("http://").rstrip("/")
        for name, daemon in (
            ("data-starved", starved),
            ("saturated", saturated),
            ("hung-collective", hung),
            ("fell-off-bus", fell),
            ("ecc-remap", ecc),
        )
    }
    training_address = training.url.removeprefix("http://").rstrip("/")
    later = tmp_path / "later.json"
    later.write_text("[]", encoding="utf-8")
    alertmanager = start_alertmanager(tmp_path, receiver, processes)
    prometheus = start_prometheus(tmp_path, targets, alertmanager, processes, later=later)
    # `training` is scraped from a few seconds before its next dip (see TRAINING_LEAD).
    elapsed = time.time() - epoch
    next_dip = TRAINING_DIP_STARTS + TRAINING_PERIOD * math.ceil(
        (elapsed + TRAINING_LEAD - TRAINING_DIP_STARTS) / TRAINING_PERIOD
    )
    time.sleep(max(0.0, next_dip - TRAINING_LEAD - (time.time() - epoch)))
    entry = [{"targets": [training_address], "labels": {"scenario": "training"}}]
    written = tmp_path / "later.json.new"
    written.write_text(json.dumps(entry), encoding="utf-8")
    written.replace(later)  # whole, as Prometheus may read it at any moment
    targets["training"] = training_address

    def arrived() -> bool:
        firing = [
            a for a in alertmanager_alerts(alertmanager) if a["status"]["state"] != "unprocessed"
        ]
        return all(len(of(firing, name, node)) == count for name, node, count in EXPECTED)

    # The window rates are recorded once a node has been scraped for a whole window (30 s), and
    # the shortened `for:` is 10 s.
    wait_until(arrived, timeout=150, what="every expected alert at Alertmanager")
    at_manager = alertmanager_alerts(alertmanager)

    low = thresholds.load().alert("GPUUtilizationLow").number("below") * 100
    high = thresholds.load().alert("GPUUtilizationHigh").number("above") * 100
    starved_uuids = gpu_uuids(starved)
    held = f"for 5m \\(the mean of every {WINDOW} window\\)"
    # GPUUtilizationHigh's window, shortened through the thresholds.
    high_window = TEST_THRESHOLDS.alert("GPUUtilizationHigh").for_
    held_high = f"for {high_window} \\(the mean of every {WINDOW} window\\)"
    for alert in of(at_manager, "GPUUtilizationLow", "data-starved"):
        value = check_alert(
            alert,
            severity="warning",
            scenario="data-starved",
            instance=targets["data-starved"],
            uuids=starved_uuids,
            summary="A GPU in use is mostly idle",
            description=(
                rf"{{where}} has work on it but its utilization stayed below 30% {held};"
                r" {value} over the last one: it waits on something other than its own compute\."
            ),
        )
        assert 0 < value < low
        # Documented inhibition: the more specific GPUDataLoaderStarved on the same GPU.
        assert alert["status"]["state"] == "suppressed", alert["status"]
        assert alert["status"]["inhibitedBy"], alert["status"]
    starved_alerts = of(at_manager, "GPUDataLoaderStarved", "data-starved")
    for alert in starved_alerts:
        check_alert(
            alert,
            severity="warning",
            scenario="data-starved",
            instance=targets["data-starved"],
            uuids=starved_uuids,
            summary="A GPU keeps waiting for its input",
            description=(
                r"{where} stayed below 60% utilization and sat fully idle, no kernel running, more"
                rf" than 20% of the time {held}; {{value}} utilization over the last one: it"
                r" finishes each batch and waits for the next one, the input pipeline does not"
                r" keep up\."
            ),
        )
        assert alert["status"]["state"] == "active"
    inhibitors = {alert["fingerprint"] for alert in starved_alerts}
    for alert in of(at_manager, "GPUUtilizationLow", "data-starved"):
        assert set(alert["status"]["inhibitedBy"]) <= inhibitors

    saturated_uuids = gpu_uuids(saturated)
    for alert in of(at_manager, "GPUUtilizationHigh", "saturated"):
        value = check_alert(
            alert,
            severity="info",
            scenario="saturated",
            instance=targets["saturated"],
            uuids=saturated_uuids,
            summary="A GPU runs at full load, with no headroom left",
            description=(
                rf"{{where}} kept its utilization above 95% {held_high} and drew the power of real"
                r" work; {value} in its least busy window: it has no headroom left\."
            ),
        )
        assert high < value <= 100

    hung_uuids = gpu_uuids(hung)
    for alert in of(at_manager, "GPUJobHung", "hung-collective"):
        value = check_alert(
            alert,
            severity="warning",
            scenario="hung-collective",
            instance=targets["hung-collective"],
            uuids=hung_uuids,
            summary="A GPU looks busy but does no work",
            description=(
                rf"{{where}} has run kernels all the time {held_high} while drawing at most"
                r" {value} of its power limit \(below 25%\): kernels wait without computing, the"
                r" sign of a hung collective \(NCCL\) or a deadlock\."
            ),
        )
        assert 0 < value < 25
    # A hung GPU is never "saturated", not even pending, at any evaluation of the run.
    assert (
        query(prometheus, 'ALERTS{alertname="GPUUtilizationHigh",scenario="hung-collective"}[5m]')
        == []
    )

    (lost,) = of(at_manager, "GPUFellOffBus", "fell-off-bus")
    check_alert(
        lost,
        severity="critical",
        scenario="fell-off-bus",
        instance=targets["fell-off-bus"],
        uuids=None,
        summary="A GPU has fallen off the bus",
        description=r"{where} no longer answers NVML \(GPU is lost\): it has fallen off the bus\.",
    )
    assert lost["labels"]["gpu"] == "3" and lost["status"]["state"] == "active"
    # One page per fault: the XID 79 of the lost GPU, the memory errors' XIDs and the pending
    # remap are folded in the rules, so Prometheus never raised them, and the receiver got one
    # alert per fault.
    for scenario, paged in PAGED.items():
        folded = f'ALERTS{{scenario="{scenario}",alertname=~"GPUXidError|GPURowRemapPending"}}'
        assert query(prometheus, f"{folded}[5m]") == []
        # As a set: Alertmanager may notify a group again (a scrape that failed under load
        # resolves an alert for a second); what matters is which alerts page.
        got = {
            (alert["labels"]["alertname"], alert["labels"]["gpu"])
            for alert in receiver.alerts()
            if alert["labels"].get("scenario") == scenario
        }
        assert sorted(got) == paged

    # The exporter of `fell-off-bus` restarts: its series go stale for a few scrapes, and the
    # restarted exporter cannot read the lost GPU's UUID. GPUFellOffBus stays the same alert,
    # firing since the same moment (a resolved alert that fires again starts anew).
    (before,) = of(prometheus_alerts(prometheus), "GPUFellOffBus", "fell-off-bus")
    assert before["state"] == "firing"
    assert fell.stop() == 0
    wait_until(
        lambda: query(prometheus, 'up{scenario="fell-off-bus"} == 0') != [],
        what="Prometheus to see the exporter gone",
    )
    daemon_factory(
        "--simulate",
        "fell-off-bus",
        *interval,
        "--sim.epoch",
        fell_epoch,
        "--web.listen-address",
        targets["fell-off-bus"],
    )
    wait_until(
        lambda: query(prometheus, 'gpu_up{scenario="fell-off-bus",gpu="3",uuid=""} == 0') != [],
        what="the restarted exporter's lost GPU, without its UUID",
    )
    time.sleep(3)  # a few more evaluations
    (after,) = of(prometheus_alerts(prometheus), "GPUFellOffBus", "fell-off-bus")
    assert after["state"] == "firing"
    assert after["activeAt"] == before["activeAt"]
    assert after["labels"] == before["labels"]

    # Give `training` at least as long as the slowest shortened utilization alert needs, counted
    # in evaluations of its recording rule, then a little more.
    longest = max(
        duration_seconds(thresholds.load().alert(name).for_) / SPEEDUP
        for name in (*UTILIZATION_ALERTS, "GPULoadImbalance")
    )

    def evaluations() -> list[float]:
        result = requests.get(
            prometheus + "/api/v1/query",
            params={"query": f'count_over_time({AVERAGE}{{scenario="training"}}[5m])'},
            timeout=5,
        ).json()["data"]["result"]
        return [float(sample["value"][1]) for sample in result]

    wait_until(
        lambda: len(evaluations()) == 8 and min(evaluations()) >= longest + 3,
        timeout=60,
        what="the training node's evaluations",
    )
    assert training.process.poll() is None
    assert not [
        alert for alert in receiver.alerts() if alert["labels"]["instance"] == training_address
    ]
    # Nothing fired for `training` at any evaluation of the whole run, not only at the end.
    history = requests.get(
        prometheus + "/api/v1/query",
        params={"query": 'ALERTS{scenario="training", alertstate="firing"}[5m]'},
        timeout=5,
    ).json()
    assert history["status"] == "success"
    assert history["data"]["result"] == []
    # ...and it went through a dip of its healthy saw, as it would in any 5 m window.
    dips = requests.get(
        prometheus + "/api/v1/query",
        params={"query": 'min_over_time(gpu_utilization_ratio{scenario="training"}[5m]) < 0.9'},
        timeout=5,
    ).json()["data"]["result"]
    assert len(dips) == 8
