"""Delivery through a relay in this process to fake targets that are real HTTP servers."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import parse_metrics, value_of, wait_until
from relay_helpers import (
    FakeTarget,
    Received,
    alert,
    fast_delivery,
    notification,
    post,
    running_relay,
    write_config,
)

from exporter.relay import config as relay_config
from exporter.relay import targets
from exporter.relay.delivery import YIELD_SECONDS, Worker
from exporter.relay.metrics import RelayMetrics
from exporter.relay.queue import DEAD, DELIVERED, Queue
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
        expected = hmac.new(b"s3cret", request.body, hashlib.sha256).hexdigest()
        assert request.headers["X-Gpuload-Signature"] == f"sha256={expected}"
        assert request.headers["X-Gpuload-Timestamp"].isdigit()
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
        gaps = [b.at - a.at for a, b in itertools.pairwise(flaky.requests)]
        # Backoff with half jitter: attempt n waits at least half of 50ms * 2**(n-1).
        assert all(gap >= 0.02 for gap in gaps)
        samples = metrics(relay)
        assert (
            value_of(samples, "gpuload_relay_deliveries_total", target="hook", outcome="failed")
            == 3
        )


def test_429_retry_after_pauses_the_target(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    slack = fake(fakes, answers((429, {"Retry-After": "1"}, b"rate_limited")))
    config = {
        "targets": {"slack": {"type": "slack", "url": slack.url, "min_interval": 0}},
        "route": {"targets": ["slack"]},
        "delivery": fast_delivery(storm_threshold=100),
    }
    with running_relay(tmp_path, config) as relay:
        assert post(relay.url, notification(alert(), group="one")).status_code == 200
        wait_until(lambda: slack.requests, what="the first attempt")
        assert post(relay.url, notification(alert(), group="two")).status_code == 200
        wait_until(lambda: len(slack.requests) == 3, what="both delivered")
        # Neither the retry nor the other notification went out before Retry-After passed.
        assert slack.requests[1].at - slack.requests[0].at >= 0.95
        assert slack.requests[2].at - slack.requests[0].at >= 0.95


def test_rate_limit_spaces_messages_to_one_target(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    slack = fake(fakes)
    config = {
        "targets": {"slack": {"type": "slack", "url": slack.url, "min_interval": "300ms"}},
        "route": {"targets": ["slack"]},
        "delivery": fast_delivery(storm_threshold=100),
    }
    with running_relay(tmp_path, config) as relay:
        for group in ("a", "b", "c"):
            assert post(relay.url, notification(alert(), group=group)).status_code == 200
        wait_until(lambda: len(slack.requests) == 3, what="three messages")
        times = [request.at for request in slack.requests]
        assert all(later - earlier >= 0.29 for earlier, later in itertools.pairwise(times))


def test_undeliverable_notifications_become_dead_letters(
    tmp_path: Path, fakes: list[FakeTarget]
) -> None:
    down = fake(fakes, lambda _request: (503, {}, b"down"))
    gone = fake(fakes, lambda _request: (404, {}, b"no_service"))
    config = {
        "targets": {
            "down": {"type": "webhook", "url": down.url},
            "gone": {"type": "slack", "url": gone.url},
        },
        "route": {"targets": ["down", "gone"]},
        "queue": {"path": str(tmp_path / "relay.db"), "max_age": "600ms"},
        "delivery": fast_delivery(),
    }
    with running_relay(tmp_path, config) as relay:
        assert post(relay.url, notification(alert())).status_code == 200
        wait_until(lambda: len(relay.queue.entries(DEAD)) == 2, what="two dead letters")
        dead = {entry.target: entry for entry in relay.queue.entries(DEAD)}
        # A 404 is final: one attempt. A 503 is retried until queue.max_age.
        assert len(gone.requests) == 1
        assert "HTTP 404: no_service" in dead["gone"].last_error
        assert len(down.requests) > 1
        assert dead["down"].last_error.startswith("expired")
        assert "HTTP 503" in dead["down"].last_error
        samples = metrics(relay)
        assert value_of(samples, "gpuload_relay_dead_letters", target="down") == 1
        assert (
            value_of(samples, "gpuload_relay_deliveries_total", target="gone", outcome="rejected")
            == 1
        )
        assert (
            value_of(samples, "gpuload_relay_deliveries_total", target="down", outcome="expired")
            == 1
        )


def test_hung_target_does_not_delay_another(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    hung = fake(fakes, lambda _request: None)
    healthy = fake(fakes)
    config = {
        "targets": {
            "hung": {"type": "slack", "url": hung.url, "timeout": "30s"},
            "healthy": {"type": "slack", "url": healthy.url, "min_interval": 0},
        },
        "route": {"targets": ["hung", "healthy"]},
        "delivery": fast_delivery(storm_threshold=100),
    }
    with running_relay(tmp_path, config) as relay:
        for group in ("a", "b", "c"):
            assert post(relay.url, notification(alert(), group=group)).status_code == 200
        wait_until(lambda: len(healthy.requests) == 3, what="the healthy target's messages")
        # All three reached the healthy target while the hung one still holds its first request.
        assert len(hung.requests) == 1
        assert not hung.release.is_set()
        samples = metrics(relay)
        assert value_of(samples, "gpuload_relay_queue_depth", target="hung") == 3
        assert value_of(samples, "gpuload_relay_queue_depth", target="healthy") == 0
        hung.release.set()


def test_storm_is_coalesced_into_digests(tmp_path: Path, fakes: list[FakeTarget]) -> None:
    slack = fake(fakes)
    config = {
        "targets": {"slack": {"type": "slack", "url": slack.url, "min_interval": "1s"}},
        "route": {"targets": ["slack"]},
        "delivery": fast_delivery(storm_threshold=3, digest_max=20),
    }
    with running_relay(tmp_path, config) as relay:
        for i in range(30):
            document = notification(alert(instance=f"node-{i}:19400"), group=f"g{i}")
            assert post(relay.url, document).status_code == 200
        wait_until(
            lambda: value_of(metrics(relay), "gpuload_relay_queue_depth", target="slack") == 0,
            what="an empty queue",
        )
        messages = [request.json() for request in slack.requests]
        # 30 notifications at one message a second: a few messages, not 30.
        assert len(messages) <= 6
        digests = [m for m in messages if m["text"].startswith("Alert digest")]
        assert digests
        shown = "".join(json.dumps(m) for m in messages)
        assert all(f"node-{i}:19400" in shown for i in range(30))
        for message in messages:
            assert len(message["blocks"]) <= 50
            assert all(len(b["text"]["text"]) <= 3000 for b in message["blocks"])
        samples = metrics(relay)
        assert value_of(samples, "gpuload_relay_digests_total", target="slack") == len(digests)
        assert (
            value_of(samples, "gpuload_relay_deliveries_total", target="slack", outcome="delivered")
            == 30
        )


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
