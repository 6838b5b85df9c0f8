"""Delivery through a relay in this process to fake targets that are real HTTP servers."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Clock, parse_metrics, value_of, wait_until
from relay_helpers import (
    FakeTarget,
    Received,
    StreamingTarget,
    alert,
    fast_delivery,
    fill,
    in_thread,
    notification,
    pagerduty_accepted,
    post,
    running_relay,
    small_disk,
    write_config,
)

from exporter.relay import config as relay_config
from exporter.relay import targets
from exporter.relay.delivery import YIELD_SECONDS, Worker
from exporter.relay.metrics import RelayMetrics
from exporter.relay.queue import DEAD, DELIVERED, QUEUED, Queue
from exporter.relay.templates import MessageSettings


@pytest.fixture
def fakes() -> Iterator[list[FakeTarget]]:
    started: list[FakeTarget] = []
    yield started
    for fake in started:
        fake.close()


def fake(fakes: list[FakeTarget], answer: Any = None) -> FakeTarget:
    target = FakeTarget(answer)
    fakes.append(target)
    return target


def answers(*sequence: tuple[int, dict[str, str], bytes]) -> Any:
    """Answer with each of `sequence` in turn, then 200."""
    pending = list(sequence)
    return lambda _request: pending.pop(0) if pending else (200, {}, b"ok")


def metrics(relay: Any) -> dict:
    return parse_metrics(post_get(relay.url + "metrics"))


def post_get(url: str) -> str:
    import requests

    return requests.get(url, timeout=5).text


NOW = 1_767_322_800.0


class Node:
    """A queue and a worker per target on the test's clock, stepped by hand: no thread."""

    def __init__(self, directory: Path, document: dict[str, Any]) -> None:
        self.clock = Clock(NOW)
        self.config = relay_config.load(file=write_config(directory, document), environ={})
        self.queue = Queue(self.config.queue.path)
        self.metrics = RelayMetrics(self.queue, list(self.config.targets), clock=self.clock)
        self.workers = {
            name: Worker(
                targets.build(target, MessageSettings()),
                self.queue,
                self.config.delivery,
                self.metrics,
                clock=self.clock,
            )
            for name, target in self.config.targets.items()
        }

    def accept(self, target: str, group: str, status: str = "firing") -> None:
        """Queue a notification for `target` now, as the HTTP endpoint does."""
        body = json.dumps(notification(alert(status=status), group=group))
        key = f"key-{group}" if status == "firing" else f"key-{group}-{status}"
        self.queue.enqueue([(target, key, body)], self.clock(), self.config.queue.max_age)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def close(self) -> None:
        self.queue.close()


OpenNode = Callable[[Path, dict[str, Any]], Node]


@pytest.fixture
def nodes() -> Iterator[OpenNode]:
    opened: list[Node] = []

    def open_node(directory: Path, document: dict[str, Any]) -> Node:
        opened.append(Node(directory, document))
        return opened[-1]

    yield open_node
    for node in opened:
        node.close()


def test_notification_reaches_the_webhook_signed(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    receiver = fake(fakes)
    (tmp_path / "secret").write_text("s3cret\n")
    config = {
        "targets": {"hook": {"type": "webhook", "url": receiver.url, "secret_file": "secret"}},
        "route": {"targets": ["hook"]},
    }
    with running_relay(tmp_path, config) as relay:
        document = notification(alert())
        assert post(relay.url, document).status_code == 200
        wait_until(lambda: receiver.requests, what="the delivery")
        request = receiver.requests[0]
        assert request.json() == document
        stamp = request.headers["X-Gpuload-Timestamp"]
        assert stamp.isdigit()
        expected = hmac.new(b"s3cret", stamp.encode() + b"." + request.body, hashlib.sha256)
        assert request.headers["X-Gpuload-Signature"] == f"t={stamp},v1={expected.hexdigest()}"
        wait_until(
            lambda: (
                value_of(
                    metrics(relay),
                    "gpuload_relay_deliveries_total",
                    target="hook",
                    outcome="delivered",
                )
                == 1
            ),
            what="the delivered counter",
        )
        samples = metrics(relay)
        assert value_of(samples, "gpuload_relay_notifications_received_total") == 1
        assert value_of(samples, "gpuload_relay_queue_depth", target="hook") == 0


def test_resends_are_delivered_once_per_target(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    first, second = fake(fakes), fake(fakes)
    config = {
        "targets": {
            "a": {"type": "webhook", "url": first.url},
            "b": {"type": "webhook", "url": second.url},
        },
        "route": {"targets": ["a", "b"]},
    }
    with running_relay(tmp_path, config) as relay:
        firing = notification(alert())
        for _ in range(3):
            assert post(relay.url, firing).status_code == 200
        wait_until(lambda: len(first.requests) == 1 and len(second.requests) == 1, what="delivery")
        # Alertmanager's re-send after delivery is still the same notification.
        assert post(relay.url, firing).status_code == 200
        resolved = notification(alert(status="resolved"))
        assert post(relay.url, resolved).status_code == 200
        wait_until(lambda: len(first.requests) == 2 and len(second.requests) == 2, what="resolve")
        assert [r.json()["status"] for r in first.requests] == ["firing", "resolved"]
        samples = metrics(relay)
        assert value_of(samples, "gpuload_relay_duplicates_total", target="a") == 3
        assert value_of(samples, "gpuload_relay_notifications_received_total") == 5


def test_server_errors_are_retried_with_backoff(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    flaky = fake(fakes, answers((500, {}, b"oops"), (502, {}, b""), (503, {}, b"")))
    config = {
        "targets": {"hook": {"type": "webhook", "url": flaky.url}},
        "route": {"targets": ["hook"]},
        "delivery": fast_delivery(),
    }
    with running_relay(tmp_path, config) as relay:
        assert post(relay.url, notification(alert())).status_code == 200
        wait_until(lambda: len(flaky.requests) == 4, what="three retries")
        wait_until(lambda: relay.queue.entries(DELIVERED), what="the delivered row")
        assert relay.queue.entries(DELIVERED)[0].attempts == 4
        samples = metrics(relay)
        assert (
            value_of(samples, "gpuload_relay_deliveries_total", target="hook", outcome="failed")
            == 3
        )


def test_each_retry_waits_out_its_backoff(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    flaky = fake(fakes, answers((500, {}, b"oops"), (502, {}, b""), (503, {}, b"")))
    node = nodes(
        tmp_path,
        {
            "targets": {"hook": {"type": "webhook", "url": flaky.url}},
            "route": {"targets": ["hook"]},
            "delivery": fast_delivery(),
        },
    )
    worker = node.workers["hook"]
    node.accept("hook", "a")
    for attempt in (1, 2, 3):
        worker.step()
        assert len(flaky.requests) == attempt
        due = node.queue.next_attempt("hook")
        assert due is not None
        # Backoff with half jitter: attempt n waits between half and all of 50ms * 2**(n-1).
        ceiling = min(0.05 * 2 ** (attempt - 1), 0.2)
        assert ceiling / 2 <= due - node.clock.now <= ceiling
        node.clock.now = due - 0.001
        assert worker.step() > 0
        assert len(flaky.requests) == attempt, "retried before its backoff had passed"
        node.clock.now = due
    worker.step()
    assert len(flaky.requests) == 4
    (delivered,) = node.queue.entries(DELIVERED)
    assert delivered.attempts == 4
    assert node.sample("gpuload_relay_deliveries_total", target="hook", outcome="failed") == 3


def test_429_retry_after_pauses_the_target(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    slack = fake(fakes, answers((429, {"Retry-After": "1"}, b"rate_limited")))
    node = nodes(
        tmp_path,
        {
            "targets": {"slack": {"type": "slack", "url": slack.url, "min_interval": 0}},
            "route": {"targets": ["slack"]},
            "delivery": fast_delivery(storm_threshold=100),
        },
    )
    worker = node.workers["slack"]
    node.accept("slack", "one")
    worker.step()
    assert len(slack.requests) == 1
    node.accept("slack", "two")
    # Neither the retry nor the other notification goes out before Retry-After has passed...
    node.clock.now = NOW + 0.999
    assert worker.step() > 0
    assert len(slack.requests) == 1
    # ...and both do once it has.
    node.clock.now = NOW + 1.0
    worker.step()
    worker.step()
    assert len(slack.requests) == 3
    assert node.sample("gpuload_relay_deliveries_total", target="slack", outcome="delivered") == 2


def test_rate_limit_spaces_messages_to_one_target(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    slack = fake(fakes)
    node = nodes(
        tmp_path,
        {
            "targets": {"slack": {"type": "slack", "url": slack.url, "min_interval": "300ms"}},
            "route": {"targets": ["slack"]},
            "delivery": fast_delivery(storm_threshold=100),
        },
    )
    worker = node.workers["slack"]
    for group in ("a", "b", "c"):
        node.accept("slack", group)
    sent_at = []
    for step in range(15):  # a look every 70 ms, each sending at most one message
        node.clock.now = NOW + step * 0.07
        if worker.step() == 0.0:
            sent_at.append(round(node.clock.now - NOW, 3))
    # Each message at the first look at least 300 ms after the one before.
    assert sent_at == [0.0, 0.35, 0.7]
    assert [request.json()["text"] for request in slack.requests] == [
        "[FIRING:1] GPUTemperatureHigh (critical) · GPU 3 on node-7:19400"
    ] * 3


def test_undeliverable_notifications_become_dead_letters(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    down = fake(fakes, lambda _request: (503, {}, b"down"))
    gone = fake(fakes, lambda _request: (404, {}, b"no_service"))
    node = nodes(
        tmp_path,
        {
            "targets": {
                "down": {"type": "webhook", "url": down.url},
                "gone": {"type": "slack", "url": gone.url},
            },
            "route": {"targets": ["down", "gone"]},
            "queue": {"path": str(tmp_path / "relay.db"), "max_age": "600ms"},
            "delivery": fast_delivery(),
        },
    )
    node.accept("down", "a")
    node.accept("gone", "a")
    # A 404 is final: one attempt.
    node.workers["gone"].step()
    # A 503 is retried until queue.max_age.
    node.workers["down"].step()
    due = node.queue.next_attempt("down")
    assert due is not None and due < NOW + 0.6
    node.clock.now = due
    node.workers["down"].step()
    node.clock.now = NOW + 1.0  # past the max age, when the worker next looks for expired rows
    node.workers["down"].step()
    node.workers["gone"].step()

    dead = {entry.target: entry for entry in node.queue.entries(DEAD)}
    assert set(dead) == {"down", "gone"}
    assert len(gone.requests) == 1
    assert "HTTP 404: no_service" in dead["gone"].last_error
    assert len(down.requests) == 2
    assert dead["down"].last_error.startswith("expired")
    assert "HTTP 503" in dead["down"].last_error
    assert node.sample("gpuload_relay_dead_letters", target="down") == 1
    assert node.sample("gpuload_relay_deliveries_total", target="gone", outcome="rejected") == 1
    assert node.sample("gpuload_relay_deliveries_total", target="down", outcome="expired") == 1


def test_hung_target_does_not_delay_another(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    gate = threading.Event()

    def hang(_request: Received) -> tuple[int, dict[str, str], bytes]:
        gate.wait(120)  # answered only once the test is done with it
        return 200, {}, b"ok"

    hung = fake(fakes, hang)
    healthy = fake(fakes)
    config = {
        "targets": {
            "hung": {"type": "slack", "url": hung.url, "timeout": "120s"},
            "healthy": {"type": "slack", "url": healthy.url, "min_interval": 0},
        },
        "route": {"targets": ["hung", "healthy"]},
        "delivery": fast_delivery(storm_threshold=100),
    }
    try:
        with running_relay(tmp_path, config) as relay:
            for group in ("a", "b", "c"):
                assert post(relay.url, notification(alert(), group=group)).status_code == 200

            def healthy_done() -> bool:
                samples = metrics(relay)
                return (
                    len(hung.requests) == 1
                    and value_of(
                        samples,
                        "gpuload_relay_deliveries_total",
                        target="healthy",
                        outcome="delivered",
                    )
                    == 3
                    and value_of(samples, "gpuload_relay_queue_depth", target="healthy") == 0
                )

            wait_until(healthy_done, what="three deliveries, and the hung target's first request")
            # All three were delivered while the hung target holds its first request: it cannot
            # answer before the gate opens, below, nor its sender time out (120 s).
            assert len(hung.requests) == 1
            assert [r.json()["text"] for r in healthy.requests] == [
                "[FIRING:1] GPUTemperatureHigh (critical) · GPU 3 on node-7:19400"
            ] * 3
            assert value_of(metrics(relay), "gpuload_relay_queue_depth", target="hung") == 3
    finally:
        gate.set()


def test_storm_is_coalesced_into_digests(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    first_held, release = threading.Event(), threading.Event()

    def answer(_request: Received) -> tuple[int, dict[str, str], bytes]:
        if not first_held.is_set():
            # The first message is answered once the storm is queued, however long that takes.
            first_held.set()
            release.wait(120)
        return 200, {}, b"ok"

    slack = fake(fakes, answer)
    config = {
        "targets": {
            "slack": {"type": "slack", "url": slack.url, "min_interval": "500ms", "timeout": "120s"}
        },
        "route": {"targets": ["slack"]},
        "delivery": fast_delivery(storm_threshold=3, digest_max=20),
    }
    try:
        with running_relay(tmp_path, config) as relay:
            for i in range(30):
                document = notification(alert(instance=f"node-{i}:19400"), group=f"g{i}")
                assert post(relay.url, document).status_code == 200
                if i == 0:
                    wait_until(first_held.is_set, what="the first message")
            release.set()
            wait_until(
                lambda: value_of(metrics(relay), "gpuload_relay_queue_depth", target="slack") == 0,
                what="an empty queue",
            )
            messages = [request.json() for request in slack.requests]
            # The first alone, then the 29 that waited meanwhile: a digest of the most a digest
            # holds (20), and one of the 9 left.
            assert len(messages) == 3
            assert not messages[0]["text"].startswith("Alert digest")
            digests = [m for m in messages if m["text"].startswith("Alert digest")]
            assert len(digests) == 2
            shown = "".join(json.dumps(m) for m in messages)
            assert all(f"node-{i}:19400" in shown for i in range(30))
            for message in messages:
                assert len(message["blocks"]) <= 50
                assert all(len(b["text"]["text"]) <= 3000 for b in message["blocks"])
            samples = metrics(relay)
            assert value_of(samples, "gpuload_relay_digests_total", target="slack") == 2
            assert (
                value_of(
                    samples, "gpuload_relay_deliveries_total", target="slack", outcome="delivered"
                )
                == 30
            )
    finally:
        release.set()


def test_routes_send_each_alert_where_it_matches(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    pager, ml, ops = fake(fakes, lambda _r: (202, {}, b"{}")), fake(fakes), fake(fakes)
    config = {
        "targets": {
            "pager": {"type": "pagerduty", "url": pager.url, "routing_key_env": "PD_KEY"},
            "ml": {"type": "slack", "url": ml.url, "min_interval": 0},
            "ops": {"type": "slack", "url": ops.url, "min_interval": 0},
        },
        "route": {
            "targets": ["ops"],
            "routes": [
                {"matchers": ['severity="critical"'], "targets": ["pager"], "continue": True},
                {"matchers": ["team=~ml|ai"], "targets": ["ml"]},
            ],
        },
        "delivery": fast_delivery(storm_threshold=100),
    }
    with running_relay(tmp_path, config, environ={"PD_KEY": "routing-key-1"}) as relay:
        mixed = notification(
            alert("A", severity="critical", team="ml"),
            alert("B", severity="warning", team="ml"),
            alert("C", severity="warning", team="infra"),
        )
        assert post(relay.url, mixed).status_code == 200
        wait_until(lambda: pager.requests and ml.requests and ops.requests, what="three targets")

        def names(request: Received) -> str:
            return json.dumps(request.json(), ensure_ascii=False)

        assert pager.requests[0].json()["routing_key"] == "routing-key-1"
        assert '"A' in names(pager.requests[0]) and 'alert": "B' not in names(pager.requests[0])
        assert "· A*" in names(ml.requests[0]) and "· B*" in names(ml.requests[0])
        assert "· C*" in names(ops.requests[0]) and "· A*" not in names(ops.requests[0])


def test_deliveries_go_through_the_proxy_from_the_environment(
    tmp_path: Path, fakes: list[FakeTarget], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker reads the environment once per target origin instead of on every request.
    proxy = fake(fakes)
    for name in ("no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/hook"))
    # The test's own requests to the relay (and the fakes) go direct.
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    config = {
        "targets": {"hook": {"type": "webhook", "url": "http://hooks.example.invalid/hook"}},
        "route": {"targets": ["hook"]},
        "delivery": fast_delivery(),
    }
    with running_relay(tmp_path, config) as relay:
        for index in range(2):
            assert post(relay.url, notification(alert(instance=f"node-{index}"))).status_code == 200
        wait_until(lambda: len(proxy.requests) == 2, what="two deliveries through the proxy")
    assert [request.path for request in proxy.requests] == ["/hook", "/hook"]
    assert {request.headers["Host"] for request in proxy.requests} == {"hooks.example.invalid"}


def test_deliveries_go_on_while_notifications_keep_being_accepted(
    tmp_path: Path, fakes: list[FakeTarget]
) -> None:
    receiver = fake(fakes)
    document = {
        "targets": {"hook": {"type": "webhook", "url": receiver.url}},
        "route": {"targets": ["hook"]},
        "queue": {"path": str(tmp_path / "relay.db")},
    }
    config = relay_config.load(file=write_config(tmp_path, document), environ={})
    queue = Queue(config.queue.path)
    bodies = [json.dumps(notification(alert(instance=f"node-{i}"))) for i in range(3)]
    queue.enqueue([("hook", f"key-{i}", body) for i, body in enumerate(bodies)], time.time(), 600)
    waits: list[float] = []

    def never_quiet(timeout: float) -> bool:
        # As if a commit were always in progress: the worker waits its bound each time.
        waits.append(timeout)
        time.sleep(timeout)
        return False

    worker = Worker(
        targets.build(config.targets["hook"], MessageSettings()),
        queue,
        config.delivery,
        RelayMetrics(queue, ["hook"]),
        quiet=never_quiet,
    )
    worker.start()
    try:
        wait_until(lambda: len(receiver.requests) == 3, what="all three deliveries")
    finally:
        worker.stop()
        worker.join(5)
        queue.close()
    assert [request.json() for request in receiver.requests] == [json.loads(b) for b in bodies]
    assert waits[:2] == [YIELD_SECONDS, YIELD_SECONDS]


def pagerduty_node(nodes: OpenNode, directory: Path, url: str, **delivery: Any) -> Node:
    (directory / "routing-key").write_text("routing-key-1\n")
    return nodes(
        directory,
        {
            "targets": {
                "pager": {
                    "type": "pagerduty",
                    "url": url,
                    "routing_key_file": "routing-key",
                    "min_interval": 0,
                }
            },
            "route": {"targets": ["pager"]},
            "delivery": fast_delivery(**delivery),
        },
    )


def incident(group: str) -> str:
    """PagerDuty's dedup_key for the notifications of `group`: one incident per group."""
    return hashlib.sha256(f'{{}}:{{group="{group}"}}'.encode()).hexdigest()


def events(target: FakeTarget) -> list[tuple[str, str]]:
    """(event_action, group) of each request PagerDuty got, in order."""
    groups = {incident(group): group for group in ("db", "gpu")}
    return [
        (request.json()["event_action"], groups[request.json()["dedup_key"]])
        for request in target.requests
    ]


def test_a_resolve_waits_until_its_failed_trigger_is_delivered(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    first = threading.Event()

    def answer(request: Received) -> tuple[int, dict[str, str], bytes]:
        if not first.is_set():
            first.set()
            return 502, {}, b"bad gateway"
        return pagerduty_accepted(request)

    pager = fake(fakes, answer)
    node = pagerduty_node(nodes, tmp_path, pager.url)
    worker = node.workers["pager"]
    node.accept("pager", "db")
    worker.step()
    node.accept("pager", "db", "resolved")
    # The trigger waits out its backoff, and the resolve waits behind it: PagerDuty would take
    # a trigger after the resolve for a new incident, left open.
    assert worker.step() > 0
    assert events(pager) == [("trigger", "db")]
    due = node.queue.next_attempt("pager")
    assert due is not None
    node.clock.now = due
    worker.step()
    worker.step()
    assert events(pager) == [("trigger", "db"), ("trigger", "db"), ("resolve", "db")]
    assert node.queue.entries(QUEUED) == []
    assert len(node.queue.entries(DELIVERED)) == 2


def test_an_incident_in_backoff_does_not_delay_another(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    def answer(request: Received) -> tuple[int, dict[str, str], bytes]:
        if request.json()["dedup_key"] == incident("db"):
            return 502, {}, b"bad gateway"
        return pagerduty_accepted(request)

    pager = fake(fakes, answer)
    node = pagerduty_node(nodes, tmp_path, pager.url, backoff_initial="10s", backoff_max="10s")
    worker = node.workers["pager"]
    node.accept("pager", "db")
    node.accept("pager", "db", "resolved")
    node.accept("pager", "gpu")
    worker.step()
    worker.step()
    assert events(pager) == [("trigger", "db"), ("trigger", "gpu")]
    # Nothing else is due: db's resolve waits behind its trigger, in backoff.
    assert worker.step() > 0
    node.accept("pager", "gpu", "resolved")
    worker.step()
    assert events(pager)[-1] == ("resolve", "gpu")
    for _ in range(3):
        due = node.queue.next_attempt("pager")
        assert due is not None
        node.clock.now = due
        worker.step()
        assert events(pager)[-1] == ("trigger", "db")
    assert [action for action, group in events(pager) if group == "db"] == ["trigger"] * 4
    assert [entry.dedup_key for entry in node.queue.entries(QUEUED)] == [
        "key-db",
        "key-db-resolved",
    ]


def test_a_digest_holds_at_most_one_notification_per_group(
    tmp_path: Path, fakes: list[FakeTarget], nodes: OpenNode
) -> None:
    slack = fake(fakes)
    node = nodes(
        tmp_path,
        {
            "targets": {"slack": {"type": "slack", "url": slack.url, "min_interval": 0}},
            "route": {"targets": ["slack"]},
            "delivery": fast_delivery(storm_threshold=2, digest_max=20),
        },
    )
    for group in ("a", "b", "c"):
        node.accept("slack", group)
    for group in ("a", "b"):
        node.accept("slack", group, "resolved")
    worker = node.workers["slack"]
    worker.step()
    assert sorted(e.dedup_key for e in node.queue.entries(DELIVERED)) == ["key-a", "key-b", "key-c"]
    worker.step()
    assert node.queue.entries(QUEUED) == []
    assert len(slack.requests) == 2
    assert all(r.json()["text"].startswith("Alert digest") for r in slack.requests)


def test_a_delivery_whose_record_fails_on_a_full_disk_is_sent_once(
    tmp_path: Path,
    fakes: list[FakeTarget],
    nodes: OpenNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = fake(fakes)
    with small_disk(tmp_path / "disk") as disk:
        node = nodes(
            tmp_path,
            {
                "targets": {"hook": {"type": "webhook", "url": receiver.url}},
                "route": {"targets": ["hook"]},
                "queue": {"path": str(disk / "relay.db")},
                "delivery": fast_delivery(),
            },
        )
        worker = node.workers["hook"]
        node.accept("hook", "gpu")
        # The queue's reserve already given back (test_relay_queue.py tests how it is used).
        (disk / "relay.db-reserve").unlink()
        filler = fill(disk)
        caplog.set_level(logging.INFO, logger="exporter.relay")
        for _ in range(10):
            worker.step()
            node.clock.now += 60
        # Sent once; the queue could not record it, and the worker kept trying to record it,
        # not to send it again.
        assert len(receiver.requests) == 1
        (queued,) = node.queue.entries(QUEUED)
        assert queued.attempts == 0
        problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(problems) == 1, [r.getMessage() for r in problems]
        assert problems[0].exc_info is None
        assert "full" in problems[0].getMessage()
        filler.unlink()
        worker.step()
        assert len(receiver.requests) == 1
        (delivered,) = node.queue.entries(DELIVERED)
        assert delivered.attempts == 1
        assert node.sample("gpuload_relay_deliveries_total", target="hook", outcome="delivered")
        node.close()


def trickled(answer: bytes) -> Callable[[], Iterator[bytes]]:
    return lambda: (bytes([byte]) for byte in answer)


TRICKLING_ANSWERS = {
    "headers": trickled(b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 10_000 + b"\r\n\r\n"),
    "body": lambda: itertools.chain(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"], trickled(b"a" * 10_000)()
    ),
}


@pytest.mark.parametrize("part", sorted(TRICKLING_ANSWERS))
def test_a_trickling_answer_ends_the_attempt_at_the_timeout(
    tmp_path: Path, nodes: OpenNode, part: str
) -> None:
    # A byte every 20 ms: every read is answered well within the timeout, and the whole
    # answer would take 200 s.
    trickle = StreamingTarget(TRICKLING_ANSWERS[part], pause=0.02)
    try:
        node = nodes(
            tmp_path,
            {
                "targets": {"hook": {"type": "webhook", "url": trickle.url, "timeout": "1s"}},
                "route": {"targets": ["hook"]},
                "delivery": fast_delivery(),
            },
        )
        node.accept("hook", "gpu")
        in_thread(node.workers["hook"].step).result(timeout=60)
        (entry,) = node.queue.entries(QUEUED)
        assert entry.attempts == 1
        assert "timed out" in entry.last_error
        assert trickle.ended.wait(30), "the relay kept the connection open"
        assert node.sample("gpuload_relay_deliveries_total", target="hook", outcome="failed") == 1
    finally:
        trickle.close()


def test_a_huge_answer_is_read_only_up_to_the_bound(tmp_path: Path, nodes: OpenNode) -> None:
    size = 256 << 20
    chunk = b"x" * (64 << 10)

    def answer() -> Iterator[bytes]:
        yield f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode()
        for _ in range(size // len(chunk)):
            yield chunk

    huge = StreamingTarget(answer)
    try:
        node = nodes(
            tmp_path,
            {
                "targets": {"hook": {"type": "webhook", "url": huge.url}},
                "route": {"targets": ["hook"]},
                "delivery": fast_delivery(),
            },
        )
        node.accept("hook", "gpu")
        in_thread(node.workers["hook"].step).result(timeout=120)
        assert huge.ended.wait(30), "the relay kept the connection open"
        # What the relay took, and what the kernel's socket buffers held: megabytes at most.
        assert huge.written[0] < 32 << 20
        (entry,) = node.queue.entries(DELIVERED)
        assert entry.attempts == 1
    finally:
        huge.close()


def test_a_request_without_an_answer_says_why_in_words_never_the_url() -> None:
    """A refused connection reads "connection refused", not "ConnectionError (no answer)"."""
    import socket

    import requests

    from exporter.relay.delivery import _cause

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        requests.post(f"http://127.0.0.1:{port}/secret-token-path", timeout=5)
    except requests.RequestException as error:
        assert _cause(error) == "connection refused"
    else:
        raise AssertionError("nothing should answer on that port")
