"""Local alerting: the shared vectors agree between promtool and the local evaluator.

Local alerts carry the rules' names, labels and annotations and go out through the relay's queue.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import wait_until

from exporter import config
from exporter.alerting import templates, thresholds
from exporter.alerting.evaluator import Alert, Evaluator, local_rules, not_local
from exporter.alerting.history import Sample
from exporter.alerting.local import LocalAlerting
from exporter.alerting.notify import Notifier
from tools import RULES_DIR, vectors

VECTOR_FILES = vectors.vector_files()
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")


class Receiver:
    """A real HTTP webhook receiver on 127.0.0.1 collecting JSON bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                bodies.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict[str, Any]]:
        return [alert for body in self.bodies for alert in body["alerts"]]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@needs_promtool
@pytest.mark.differential
@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda path: path.name)
def test_vectors_give_the_same_alerts_in_promtool_and_the_local_evaluator(
    path: Path, tmp_path: Path
) -> None:
    loaded = thresholds.load()
    cases = vectors.load_file(path)
    test_file = tmp_path / path.name.replace(".yml", ".test.yml")
    test_file.write_text(yaml.safe_dump(vectors.to_promtool(cases, loaded), sort_keys=False))
    result = subprocess.run(
        ["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    problems = [problem for case in cases for problem in vectors.run_local(case, loaded)]
    assert problems == []


def test_every_locally_evaluable_alert_has_a_vector() -> None:
    covered = {
        name for path in VECTOR_FILES for case in vectors.load_file(path) for name in case.alerts
    }
    elsewhere = set(not_local(thresholds.load()))
    assert covered | elsewhere == set(thresholds.PARAMETERS)
    assert not covered & elsewhere


def test_local_rules_take_for_labels_and_annotations_from_the_rendered_rules() -> None:
    document = yaml.safe_load((RULES_DIR / "gpuload-alerts.rules.yml").read_text())
    shipped = {
        rule["alert"]: rule
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    for rule in local_rules(thresholds.load()):
        assert rule.labels == shipped[rule.name]["labels"]
        assert rule.annotations == shipped[rule.name]["annotations"]
        assert rule.for_seconds == thresholds.duration_seconds(shipped[rule.name].get("for", "0s"))


@pytest.mark.parametrize(
    ("template", "value", "expected"),
    [
        ("{{ $value | humanizePercentage }}", 0.2545454545, "25.45%"),
        ("{{ $value | humanize }}", 86.0, "86"),
        ("{{ $value | humanize }}", 1234567.0, "1.235M"),
        ("{{ $value | humanize }}", 0.0123, "12.3m"),
        ('{{ $value | printf "%.0f" }}', 1.1666, "1"),
        ("{{ $value | humanizeDuration }}", 3725.0, "1h 2m 5s"),
        ("{{ $value | humanizeDuration }}", 42.5, "42.5s"),
        ("a{{ with $labels.node }} (node {{ . }}){{ end }}", 0, "a (node n7)"),
        ("{{ if $labels.gpu }}gpu{{ else }}node{{ end }}", 0, "node"),
    ],
)
def test_templates_render_like_prometheus(template: str, value: float, expected: str) -> None:
    assert templates.render(template, {"node": "n7"}, value) == expected


def test_every_annotation_of_every_rule_renders() -> None:
    labels = {"gpu": "0", "uuid": "GPU-0", "instance": "n1:19400", "job": "gpuload", "xid": "79"}
    for rule in local_rules(thresholds.load()):
        for text in rule.annotations.values():
            assert "{{" not in templates.render(text, labels, 0.5)


def _gpu_up(value: float) -> list[Sample]:
    return [Sample("gpu_up", (("gpu", "3"), ("uuid", "GPU-3")), value)]


def test_an_alert_is_pending_then_firing_then_resolved_through_the_relay_queue(
    tmp_path: Path, receiver: Receiver
) -> None:
    settings = _delivering(tmp_path, receiver)
    assert settings.alerting.delivery is not None
    notifier = Notifier(settings.alerting.delivery, "http://n1:19400/")
    notifier.start()
    evaluator = Evaluator(thresholds.load(), instance="n1:19400")
    try:
        sent = [notifier.send(evaluator.observe(_gpu_up(0), t)) for t in (0, 30)]
        assert sent == [0, 0]
        assert [a.state for a in evaluator.alerts()] == ["pending"]
        assert notifier.send(evaluator.observe(_gpu_up(0), 60)) == 1
        # Back at 90 s: GPUFellOffBus keeps firing for its keep_firing_for (15m), then resolves.
        assert notifier.send(evaluator.observe(_gpu_up(1), 90)) == 0
        assert [a.state for a in evaluator.alerts()] == ["firing"]
        assert notifier.send(evaluator.observe(_gpu_up(1), 989)) == 0
        assert notifier.send(evaluator.observe(_gpu_up(1), 990)) == 1
        wait_until(lambda: len(receiver.bodies) == 2, what="two notifications")
    finally:
        notifier.stop()
    firing, resolved = receiver.bodies
    assert firing["version"] == "4" and firing["status"] == "firing"
    assert resolved["status"] == "resolved"
    alert = firing["alerts"][0]
    assert alert["labels"] == {
        "alertname": "GPUFellOffBus",
        "severity": "critical",
        "gpu": "3",
        "instance": "n1:19400",
        "job": "gpuload",
    }
    assert alert["annotations"]["runbook_url"].endswith("runbooks.md#gpufelloffbus")
    assert alert["annotations"]["description"].startswith("GPU 3 on n1:19400 no longer")
    assert resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    with sqlite3.connect(tmp_path / "alerts.db") as db:
        states = [row[0] for row in db.execute("SELECT state FROM notifications")]
    assert states == ["delivered", "delivered"]


def test_rules_are_evaluated_once_per_evaluation_interval_on_every_cycle_s_history() -> None:
    # GPUFellOffBus holds for 1m; cycles come every 5 s, evaluations every 15 s. Without its
    # keep_firing_for here, so that it resolves at the first evaluation that sees the GPU back.
    loaded = thresholds.load()
    fell_off = replace(loaded.alert("GPUFellOffBus"), keep_firing_for="0s")
    loaded = replace(loaded, alerts={**loaded.alerts, "GPUFellOffBus": fell_off})
    evaluator = Evaluator(loaded, instance="n1:19400", interval=15)
    states = {}
    processes = Sample("gpu_processes", (("gpu", "3"), ("uuid", "GPU-3")), 1.0)
    for t in range(0, 80, 5):
        changed = evaluator.observe([*_gpu_up(0 if t < 70 else 1), processes], t)
        states[t] = ([a.state for a in changed], [a.state for a in evaluator.alerts()])
    assert states[0] == ([], ["pending"])
    # 60 s held, but the next evaluation is at 60 only if one was at 45: 0, 15, 30, 45, 60.
    assert states[55] == ([], ["pending"])
    assert states[60] == (["firing"], ["firing"])
    # Up again at 70: still firing until the evaluation at 75 sees it.
    assert states[70] == ([], ["firing"])
    assert states[75] == (["resolved"], [])
    # Every cycle's samples are in the history (gpu_processes' horizon of minutes keeps every
    # 5 s cycle), not only the evaluated ones.
    (points,) = evaluator.history.points("gpu_processes", 20, 80).values()
    assert [t for t, _ in points] == list(range(20, 80, 5))


def test_an_evaluation_is_not_skipped_when_the_clock_goes_back() -> None:
    evaluator = Evaluator(thresholds.load(), instance="n1:19400", interval=15)
    evaluator.observe(_gpu_up(1), 1000)
    evaluator.observe(_gpu_up(0), 1005)
    assert evaluator.alerts() == []  # 1005 is inside the interval: not evaluated
    evaluator.observe(_gpu_up(0), 400)  # the wall clock was set back
    assert [a.state for a in evaluator.alerts()] == ["pending"]


def test_the_evaluation_interval_is_read_from_the_alerting_section(tmp_path: Path) -> None:
    path = tmp_path / "gpuload.yaml"
    assert config.load(file=None).alerting.evaluation_interval == 15
    path.write_text(yaml.safe_dump({"alerting": {"evaluation_interval": "500ms"}}))
    assert config.load(file=path).alerting.evaluation_interval == 0.5
    path.write_text(yaml.safe_dump({"alerting": {"evaluation_interval": "soon"}}))
    with pytest.raises(config.ConfigError, match=r"alerting\.evaluation_interval: 'soon'"):
        config.load(file=path)


def test_serve_delivers_a_critical_xid_from_its_own_samples(
    tmp_path: Path, receiver: Receiver, daemon_factory
) -> None:
    _delivery_file(tmp_path, receiver, evaluation_interval="200ms")
    # GPU 3 reports XID 79 two seconds in; GPUXidError has no `for:`. An event set sees the
    # events from the scenario's start, so the XID arrives however long the daemon took to start
    # (a GPU that also fell off the bus could not be registered once lost: not this test's point).
    scenario = tmp_path / "xid.yaml"
    scenario.write_text(
        "name: xid\n"
        'driver: {version: "550.90.07", cuda_version: 12040}\n'
        "gpus: [{model: h100-sxm, count: 4}]\n"
        "phases: [{duration: 1h, utilization: 0.9}]\n"
        "faults: [{kind: xid, gpu: 3, at: 2, code: 79}]\n"
    )
    daemon = daemon_factory(
        "--simulate",
        str(scenario),
        "--collect.interval",
        "200ms",
        "--config",
        str(tmp_path / "gpuload.yaml"),
    )
    wait_until(
        lambda: any(a["labels"]["alertname"] == "GPUXidError" for a in receiver.alerts()),
        timeout=20,
        what="GPUXidError delivered",
    )
    alert = next(a for a in receiver.alerts() if a["labels"]["alertname"] == "GPUXidError")
    port = daemon.url.rstrip("/").rsplit(":", 1)[1]
    assert alert["status"] == "firing"
    assert alert["labels"]["gpu"] == "3" and alert["labels"]["xid"] == "79"
    assert alert["labels"]["instance"] == f"127.0.0.1:{port}"
    assert alert["labels"]["severity"] == "critical"
    assert "reported XID 79 (1 in the last 1h)" in alert["annotations"]["description"]
    status = daemon.get("/api/v1/status").json()
    gpu3 = status["gpus"][3]
    assert any(a["alertname"] == "GPUXidError" and a["state"] == "firing" for a in gpu3["alerts"])
    assert "local alert GPUXidError firing" in daemon.log()


def test_alerting_config_errors_name_the_key_path(tmp_path: Path) -> None:
    path = tmp_path / "gpuload.yaml"
    path.write_text(yaml.safe_dump({"alerting": {"targets": {"ops": {"type": "slak"}}}}))
    with pytest.raises(config.ConfigError, match=r"config file alerting\.targets\.ops\.type"):
        config.load(file=path)
    path.write_text(yaml.safe_dump({"alerting": {"queue": {"pth": "x.db"}}}))
    with pytest.raises(config.ConfigError, match=r"config file alerting\.queue\.pth: unknown"):
        config.load(file=path)


def test_serve_refuses_an_alert_queue_it_cannot_open(tmp_path: Path) -> None:
    not_a_database = tmp_path / "alerts.db"
    not_a_database.write_bytes(b"this is not an SQLite database file, only text" * 100)
    (tmp_path / "gpuload.yaml").write_text(
        yaml.safe_dump(
            {
                "alerting": {
                    "targets": {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/"}},
                    "route": {"targets": ["hook"]},
                    "queue": {"path": str(not_a_database)},
                }
            }
        )
    )
    command = ["serve", "--web.listen-address", "127.0.0.1:0", "--simulate", "idle"]
    serve = subprocess.run(
        [sys.executable, "-m", "exporter", *command, "--config", str(tmp_path / "gpuload.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 1, serve.stderr
    assert (
        f"local alerting: alert queue {not_a_database}: the queue file {not_a_database} is "
        "not an SQLite database, and no queue was kept there"
    ) in serve.stderr
    assert not_a_database.read_bytes().startswith(b"this is not")  # left as it was


def _delivery_file(tmp_path: Path, receiver: Receiver, **alerting: object) -> Path:
    """A config file whose local alerts go to the receiver, queued in tmp_path."""
    path = tmp_path / "gpuload.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "alerting": {
                    "targets": {"hook": {"type": "webhook", "url": receiver.url}},
                    "route": {"targets": ["hook"]},
                    "queue": {"path": str(tmp_path / "alerts.db")},
                    **alerting,
                }
            }
        )
    )
    return path


def _delivering(tmp_path: Path, receiver: Receiver, **alerting: object) -> config.Config:
    return config.load(file=_delivery_file(tmp_path, receiver, **alerting))


def _local(settings: config.Config, loaded: thresholds.Thresholds, now: float) -> LocalAlerting:
    assert settings.alerting.delivery is not None
    notifier = Notifier(settings.alerting.delivery, "http://n1:19400/")
    local = LocalAlerting(
        loaded,
        instance="n1:19400",
        notifier=notifier,
        repeat_interval=settings.alerting.repeat_interval,
        now=now,
    )
    local.start()
    return local


def _lost(*gpus: str, up: float = 0) -> list[Sample]:
    return [Sample("gpu_up", (("gpu", gpu), ("uuid", f"GPU-{gpu}")), up) for gpu in gpus]


def _without_keep_firing(loaded: thresholds.Thresholds) -> thresholds.Thresholds:
    fell_off = replace(loaded.alert("GPUFellOffBus"), keep_firing_for="0s")
    return replace(loaded, alerts={**loaded.alerts, "GPUFellOffBus": fell_off})


def test_each_gpu_is_an_incident_of_its_own(tmp_path: Path, receiver: Receiver) -> None:
    """One GPU's resolve must not close the incident another GPU's alert still holds."""
    t0 = time.time() - 1500  # the queue sends and expires rows by the wall clock: all past
    local = _local(_delivering(tmp_path, receiver), _without_keep_firing(thresholds.load()), t0)
    try:
        for t in (0, 30, 60):
            local.observe_samples(_lost("3", "4"), t0 + t)
        wait_until(lambda: len(receiver.bodies) == 2, what="two firing notifications")
        local.observe_samples([*_lost("3"), *_lost("4", up=1)], t0 + 90)
        wait_until(lambda: len(receiver.bodies) == 3, what="GPU 4's resolve")
    finally:
        local.stop()
    firing = [body for body in receiver.bodies if body["status"] == "firing"]
    (resolved,) = [body for body in receiver.bodies if body["status"] == "resolved"]
    keys = {body["groupKey"] for body in firing}
    assert len(keys) == 2  # an incident (PagerDuty's dedup_key is its hash) per GPU
    assert resolved["groupKey"] in keys
    assert [alert["labels"]["gpu"] for alert in resolved["alerts"]] == ["4"]
    assert resolved["groupLabels"] == resolved["alerts"][0]["labels"]
    (gpu3,) = [body for body in firing if body["alerts"][0]["labels"]["gpu"] == "3"]
    assert gpu3["groupKey"] != resolved["groupKey"]


def test_a_restart_neither_fires_an_alert_again_nor_loses_its_resolve(
    tmp_path: Path, receiver: Receiver
) -> None:
    loaded = _without_keep_firing(thresholds.load())
    settings = _delivering(tmp_path, receiver)
    t0 = time.time() - 1500
    local = _local(settings, loaded, t0)
    try:
        for t in (0, 30, 60):
            local.observe_samples(_lost("3"), t0 + t)
        wait_until(lambda: len(receiver.bodies) == 1, what="the firing notification")
    finally:
        local.stop()
    # The exporter restarts at 100 s with an empty history; the GPU is still lost, then back.
    local = _local(settings, loaded, t0 + 100)
    try:
        assert [a.state for a in local.alerts()] == ["firing"]
        for t in range(115, 300, 15):
            local.observe_samples(_lost("3"), t0 + t)
        # Back at 300 s: the rules need a whole window of samples again before the restored
        # alert may resolve (5m + the evaluation interval after the restart), then it does.
        for t in range(300, 500, 15):
            local.observe_samples(_lost("3", up=1), t0 + t)
        wait_until(lambda: len(receiver.bodies) == 2, what="the resolve")
    finally:
        local.stop()
    assert [body["status"] for body in receiver.bodies] == ["firing", "resolved"]
    assert receiver.bodies[0]["groupKey"] == receiver.bodies[1]["groupKey"]


def _saturated(t: float, started: float) -> list[Sample]:
    """A GPU at 99% on 80% of its power, its exporter's counters counting from ``started``."""
    gpu = (("gpu", "0"), ("uuid", "GPU-0"))
    return [
        Sample("gpu_utilization_seconds_total", gpu, 0.99 * (t - started)),
        Sample("gpu_power_usage_watts", gpu, 560.0),
        Sample("gpu_power_limit_watts", gpu, 700.0),
        Sample("gpu_processes", gpu, 1.0),
        Sample("gpuload_last_collection_timestamp_seconds", (), t),
    ]


def test_a_restored_alert_is_held_until_every_window_it_reads_is_whole_again(
    tmp_path: Path, receiver: Receiver
) -> None:
    """GPUUtilizationHigh reads 5 minutes of 1-minute means: 6 minutes after a start."""
    settings = _delivering(tmp_path, receiver)
    t0 = time.time() - 3000
    local = _local(settings, thresholds.load(), t0)
    try:
        for t in range(0, 420, 15):
            local.observe_samples(_saturated(t0 + t, t0), t0 + t)
        wait_until(lambda: len(receiver.bodies) == 1, what="the firing notification")
    finally:
        local.stop()
    # The exporter restarts at 430 s: an empty history, counters from 0, the GPU still busy. Its
    # first cycle comes a second later.
    local = _local(settings, thresholds.load(), t0 + 430)
    try:
        for t in range(431, 431 + 900, 15):
            local.observe_samples(_saturated(t0 + t, t0 + 430), t0 + t)
            assert [a.state for a in local.alerts()] == ["firing"], t
    finally:
        local.stop()
    assert [body["status"] for body in receiver.bodies] == ["firing"]


def test_a_firing_alert_is_notified_again_every_repeat_interval(
    tmp_path: Path, receiver: Receiver
) -> None:
    settings = _delivering(tmp_path, receiver, repeat_interval="10m")
    assert settings.alerting.repeat_interval == 600
    t0 = time.time() - 1500
    local = _local(settings, thresholds.load(), t0)
    # What goes to the queue, and when (the queue's own dedup is tested with the relay).
    handed = _handed(local, t0)
    try:
        for t in range(0, 60 + 1200 + 1, 30):
            local.observe_samples(_lost("3"), t0 + t)
        wait_until(lambda: len(receiver.bodies) == 1, what="the firing notification")
    finally:
        local.stop()
    fired = [("GPUFellOffBus", "3", "firing")]
    assert handed == [(60.0, fired), (660.0, fired), (1260.0, fired)]


def _handed(local: LocalAlerting, t0: float) -> list[tuple[float, list[tuple[str, str, str]]]]:
    """What ``local`` hands its notifier from now on: when (after t0), and which alerts.

    Each alert as (alertname, gpu, state), sorted. The notifier queues and delivers them as
    ever; the queue's own dedup works on the wall clock, which simulated evaluations run ahead of.
    """
    assert local.notifier is not None
    handed: list[tuple[float, list[tuple[str, str, str]]]] = []
    send = local.notifier.send

    def recording(alerts: Iterable[Alert], now: float | None = None) -> int:
        alerts = list(alerts)
        what = sorted((a.name, a.labels.get("gpu", ""), a.state) for a in alerts)
        handed.append((float(now or 0) - t0, what))
        return send(alerts, now)

    local.notifier.send = recording  # type: ignore[method-assign]
    return handed


def _xid(*gpus: str, code: str = "62") -> list[Sample]:
    """One XID ``code`` on each GPU, counted since the exporter started.

    XID 62 is no fold's (health.FOLDS): it raises GPUXidError on a lost GPU too, so that the
    inhibition below has an alert to mute.
    """
    return [
        Sample("gpu_xid_errors_total", (("gpu", gpu), ("uuid", f"GPU-{gpu}"), ("xid", code)), 1)
        for gpu in gpus
    ]


def _short_xid_window(loaded: thresholds.Thresholds) -> thresholds.Thresholds:
    """GPUXidError over 10 minutes, not an hour: an XID's alert resolves 10 minutes after it."""
    xid = loaded.alert("GPUXidError")
    xid = replace(xid, parameters={**xid.parameters, "window": "10m"})
    return replace(loaded, alerts={**loaded.alerts, "GPUXidError": xid})


def _xid_inhibited(loaded: thresholds.Thresholds) -> thresholds.Thresholds:
    """With an inhibit rule of the kind a user adds: GPUFellOffBus mutes GPUXidError."""
    document = yaml.safe_load(thresholds.DEFAULT_PATH.read_text(encoding="utf-8"))
    document["inhibit_rules"] = [
        {
            "source_matchers": ['alertname="GPUFellOffBus"'],
            "target_matchers": ['alertname="GPUXidError"'],
            "equal": ["instance", "gpu"],
        }
    ]
    return replace(loaded, inhibit_rules=thresholds.parse(document).inhibit_rules)


def test_a_lost_gpu_pages_once_its_xid_inhibited_while_another_gpu_s_xid_pages(
    tmp_path: Path, receiver: Receiver
) -> None:
    """An inhibit rule: GPUFellOffBus mutes GPUXidError on the same GPU only."""
    settings = _delivering(tmp_path, receiver, repeat_interval="10m")
    t0 = time.time() - 1500
    local = _local(settings, _xid_inhibited(thresholds.load()), t0)
    handed = _handed(local, t0)
    try:
        # GPU 3 is lost from 0 s (GPUFellOffBus fires at 60 s); at 90 s it and GPU 5 report
        # XID 62. Past a repeat interval, so that a muted repeat would show.
        for t in range(0, 700, 30):
            local.observe_samples([*_lost("3"), *(_xid("3", "5") if t >= 90 else [])], t0 + t)
        firing = {(a.name, a.labels["gpu"]) for a in local.alerts() if a.state == "firing"}
        wait_until(lambda: len(receiver.bodies) == 2, what="two firing notifications")
    finally:
        local.stop()
    # Inhibited, GPU 3's XID alert still fires (the status page shows it); only its
    # notifications are muted, the first and the repeats alike.
    assert firing == {("GPUFellOffBus", "3"), ("GPUXidError", "3"), ("GPUXidError", "5")}
    assert handed == [
        (60.0, [("GPUFellOffBus", "3", "firing")]),
        (90.0, [("GPUXidError", "5", "firing")]),
        (660.0, [("GPUFellOffBus", "3", "firing")]),
        (690.0, [("GPUXidError", "5", "firing")]),
    ]
    delivered = {(a["labels"]["alertname"], a["labels"]["gpu"]) for a in receiver.alerts()}
    assert delivered == {("GPUFellOffBus", "3"), ("GPUXidError", "5")}


def test_an_inhibited_alert_sends_no_resolve_and_pages_once_its_source_resolves(
    tmp_path: Path, receiver: Receiver
) -> None:
    """GPU 3 comes back while its XID alert fires: that XID pages; GPU 4's never does."""
    loaded = _xid_inhibited(_short_xid_window(_without_keep_firing(thresholds.load())))
    t0 = time.time() - 1500
    local = _local(_delivering(tmp_path, receiver), loaded, t0)
    handed = _handed(local, t0)
    try:
        for t in range(0, 900, 30):
            gpus = [*_lost("3", up=1 if t >= 300 else 0), *_lost("4")]
            local.observe_samples([*gpus, *(_xid("3", "4") if t >= 90 else [])], t0 + t)
    finally:
        local.stop()
    assert handed == [
        (60.0, [("GPUFellOffBus", "3", "firing"), ("GPUFellOffBus", "4", "firing")]),
        # GPU 3 back: its GPUFellOffBus resolves, and its XID alert, muted since it fired at
        # 90 s, is no longer inhibited.
        (300.0, [("GPUFellOffBus", "3", "resolved"), ("GPUXidError", "3", "firing")]),
        # Both XID alerts resolve 10 minutes after the XID; GPU 4's was never notified.
        (690.0, [("GPUXidError", "3", "resolved")]),
    ]


def test_an_xid_paged_before_its_gpu_fell_off_is_not_taken_back_and_still_resolves(
    tmp_path: Path, receiver: Receiver
) -> None:
    """As Alertmanager, only a firing source inhibits: GPUFellOffBus waits its `for:` (1m)."""
    loaded = _xid_inhibited(_short_xid_window(thresholds.load()))
    t0 = time.time() - 1500
    local = _local(_delivering(tmp_path, receiver), loaded, t0)
    handed = _handed(local, t0)
    try:
        for t in range(0, 700, 30):
            local.observe_samples([*_lost("3"), *_xid("3")], t0 + t)
    finally:
        local.stop()
    assert handed == [
        (0.0, [("GPUXidError", "3", "firing")]),
        (60.0, [("GPUFellOffBus", "3", "firing")]),
        # Resolved while GPUFellOffBus fires: the resolve closes the incident the page opened.
        (600.0, [("GPUXidError", "3", "resolved")]),
    ]


def test_an_inhibited_alert_is_taken_back_as_never_notified_after_a_restart(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Kept with no notification time, it pages once its source resolves after the restart."""
    loaded = _xid_inhibited(_without_keep_firing(thresholds.load()))
    settings = _delivering(tmp_path, receiver)
    t0 = time.time() - 1500
    local = _local(settings, loaded, t0)
    try:
        for t in range(0, 150, 30):
            local.observe_samples([*_lost("3"), *(_xid("3") if t >= 90 else [])], t0 + t)
    finally:
        local.stop()
    # The exporter restarts at 160 s, GPU 3 still lost (the taken-back GPUFellOffBus is seen
    # again, no longer held), and is back at 400 s.
    local = _local(settings, loaded, t0 + 160)
    handed = _handed(local, t0)
    try:
        states = {(a.name, a.state) for a in local.alerts()}
        for t in range(175, 700, 15):
            local.observe_samples([*_lost("3", up=1 if t >= 400 else 0), *_xid("3")], t0 + t)
    finally:
        local.stop()
    assert states == {("GPUFellOffBus", "firing"), ("GPUXidError", "firing")}
    assert handed == [
        (400.0, [("GPUFellOffBus", "3", "resolved"), ("GPUXidError", "3", "firing")]),
    ]


def _working(t: float, started: float, **gpus: tuple[float, float]) -> list[Sample]:
    """GPUs in use since ``started``, each at (utilization, fully idle fraction), at ``t``."""
    samples = [Sample("gpuload_last_collection_timestamp_seconds", (), t)]
    for gpu, (utilization, idle) in gpus.items():
        labels = (("gpu", gpu), ("uuid", f"GPU-{gpu}"))
        samples += [
            Sample("gpu_utilization_seconds_total", labels, utilization * (t - started)),
            Sample("gpu_idle_seconds_total", labels, idle * (t - started)),
            Sample("gpu_processes", labels, 1.0),
        ]
    return samples


def test_a_starved_input_pipeline_inhibits_utilization_low_on_its_gpu_only(
    tmp_path: Path, receiver: Receiver
) -> None:
    """GPU 0 runs 25% in bursts, idle 70%: starved. GPU 1 runs a steady 25%: only low."""
    t0 = time.time() - 1500
    local = _local(_delivering(tmp_path, receiver), thresholds.load(), t0)
    handed = _handed(local, t0)
    try:
        for t in range(0, 600, 15):
            local.observe_samples(
                _working(t0 + t, t0, **{"0": (0.25, 0.7), "1": (0.25, 0.0)}), t0 + t
            )
        firing = {(a.name, a.labels["gpu"]) for a in local.alerts() if a.state == "firing"}
    finally:
        local.stop()
    assert firing == {
        ("GPUDataLoaderStarved", "0"),
        ("GPUUtilizationLow", "0"),
        ("GPUUtilizationLow", "1"),
    }
    assert [what for _t, what in handed] == [
        [
            ("GPUDataLoaderStarved", "0", "firing"),
            ("GPUUtilizationLow", "1", "firing"),
        ]
    ]
