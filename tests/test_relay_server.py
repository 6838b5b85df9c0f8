"""The relay's HTTP endpoint and process: auth, limits, health, metrics, signals, queue commands."""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from helpers import ROOT, parse_metrics, value_of, wait_until
from prometheus_client.parser import text_string_to_metric_families
from relay_helpers import (
    FakeTarget,
    Received,
    alert,
    fast_delivery,
    in_thread,
    notification,
    post,
    running_relay,
    start_relay_process,
    write_config,
    write_lock_held,
)

from exporter.web.server import MAX_SPARE_THREADS

FAMILIES = {
    "gpuload_relay_notifications_received",
    "gpuload_relay_deliveries",
    "gpuload_relay_queue_depth",
    "gpuload_relay_oldest_queued_age_seconds",
    "gpuload_relay_delivery_duration_seconds",
    "gpuload_relay_dead_letters",
}


@pytest.fixture
def receiver() -> FakeTarget:
    fake = FakeTarget()
    yield fake
    fake.close()


def hook(receiver: FakeTarget) -> dict:
    return {
        "targets": {"hook": {"type": "webhook", "url": receiver.url}},
        "route": {"targets": ["hook"]},
    }


def test_bearer_token_is_required_when_configured(tmp_path: Path, receiver: FakeTarget) -> None:
    config = {
        **hook(receiver),
        "web": {"listen_address": "127.0.0.1:0", "auth": {"bearer_token_env": "TOKEN"}},
    }
    with running_relay(tmp_path, config, environ={"TOKEN": "s3cret-token"}) as relay:
        body = notification(alert())
        missing = post(relay.url, body)
        assert missing.status_code == 401
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert post(relay.url, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert (
            post(relay.url, body, headers={"Authorization": "Basic czNjcmV0LXRva2Vu"}).status_code
            == 401
        )
        ok = post(relay.url, body, headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        samples = parse_metrics(requests.get(relay.url + "metrics", timeout=5).text)
        assert (
            value_of(samples, "gpuload_relay_requests_rejected_total", reason="unauthorized") == 3
        )


def test_basic_auth_is_checked(tmp_path: Path, receiver: FakeTarget) -> None:
    (tmp_path / "password").write_text("pa:ss\n")
    config = {
        **hook(receiver),
        "web": {
            "listen_address": "127.0.0.1:0",
            "auth": {"basic_auth": {"username": "alertmanager", "password_file": "password"}},
        },
    }
    with running_relay(tmp_path, config) as relay:
        body = notification(alert())
        assert post(relay.url, body, auth=("alertmanager", "wrong")).status_code == 401
        assert post(relay.url, body, auth=("other", "pa:ss")).status_code == 401
        assert post(relay.url, body, auth=("alertmanager", "pa:ss")).status_code == 200
        garbage = {"Authorization": "Basic !!!" + base64.b64encode(b"x").decode()}
        assert post(relay.url, body, headers=garbage).status_code == 401


def test_oversized_bodies_get_413_and_bad_ones_400(tmp_path: Path, receiver: FakeTarget) -> None:
    config = {**hook(receiver), "web": {"listen_address": "127.0.0.1:0", "max_body_bytes": 4096}}
    with running_relay(tmp_path, config) as relay:
        big = notification(*[alert(gpu=str(i)) for i in range(40)])
        too_large = post(relay.url, big)
        assert too_large.status_code == 413
        assert "over the limit of 4096" in too_large.text
        # Alertmanager does not retry a 413: the answer says how to stay under the limit.
        assert "max_alerts" in too_large.text
        bad = post(relay.url, b'{"version": "4", "alerts": "x"}')
        assert bad.status_code == 400
        assert bad.text == "alerts: expected a non-empty list\n"
        assert requests.get(relay.url + "alerts", timeout=5).status_code == 405
        assert requests.get(relay.url + "nope", timeout=5).status_code == 404
        assert relay.queue.states() == {}


def test_a_lone_surrogate_is_refused_alone_while_senders_beside_it_are_accepted(
    tmp_path: Path, receiver: FakeTarget
) -> None:
    document = notification(alert())
    document["alerts"][0]["annotations"]["summary"] = "\ud800 is not a character"
    bad_body = json.dumps(document).encode()
    assert b'"\\ud800 is not' in bad_body
    with running_relay(tmp_path, hook(receiver)) as relay:
        with write_lock_held(tmp_path / "relay.db"):
            # As in the queue's tests: the first commits alone once the lock is free, and
            # those that arrive meanwhile (the bad one among them) share the next commit.
            valid = [
                in_thread(post, relay.url, notification(alert(), group=f"g{n}")) for n in range(2)
            ]
            wait_until(lambda: relay.queue.waiting == 1, what="one sender behind the first")
            bad = in_thread(post, relay.url, bad_body)
            valid += [
                in_thread(post, relay.url, notification(alert(), group=f"g{n}"))
                for n in range(2, 6)
            ]
            wait_until(lambda: relay.queue.waiting >= 5, what="five senders behind the first")
        refused = bad.result(timeout=15)
        assert refused.status_code == 400
        assert "surrogate" in refused.text
        assert len(refused.text.splitlines()) == 1
        assert [answer.result(timeout=15).status_code for answer in valid] == [200] * 6
        wait_until(lambda: len(receiver.requests) == 6, what="six deliveries")


def test_health_readiness_and_metrics_with_help(tmp_path: Path, receiver: FakeTarget) -> None:
    with running_relay(tmp_path, hook(receiver)) as relay:
        assert requests.get(relay.url + "healthz", timeout=5).status_code == 200
        assert requests.get(relay.url + "readyz", timeout=5).status_code == 200
        assert post(relay.url, notification(alert())).status_code == 200
        wait_until(lambda: receiver.requests, what="the delivery")
        text = requests.get(relay.url + "metrics", timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(families) >= FAMILIES
        for family in families.values():
            assert family.documentation, family.name
        assert receiver.url not in text
        assert families["gpuload_relay_delivery_duration_seconds"].type == "histogram"
        for name in FAMILIES - {"gpuload_relay_notifications_received"}:
            assert all(s.labels.get("target") == "hook" for s in families[name].samples)


def test_sigterm_stops_the_relay_while_a_delivery_hangs(tmp_path: Path) -> None:
    held = threading.Event()

    def hang(_request: Received) -> tuple[int, dict[str, str], bytes]:
        held.wait(120)
        return 200, {}, b"late"

    hung = FakeTarget(hang)
    try:
        config = write_config(
            tmp_path,
            {
                # The delivery's own timeout is far away: only abandoning it lets the relay stop.
                "targets": {"hung": {"type": "webhook", "url": hung.url, "timeout": "120s"}},
                "route": {"targets": ["hung"]},
            },
        )
        relay = start_relay_process(config)
        assert post(relay.url, notification(alert())).status_code == 200
        wait_until(lambda: hung.requests, what="a delivery that hangs")
        relay.process.send_signal(signal.SIGTERM)
        # The target is still holding the delivery (until `held` is set, below): a relay
        # that waited for it would not exit, and this wait would raise TimeoutExpired.
        relay.process.wait(timeout=30)
        assert relay.process.returncode == 0
        wait_until(lambda: "stopped" in relay.log(), what="the stop to be logged")
        # The hanging delivery was abandoned, not lost: the row is still queued.
        listing = queue_command(config, "list", "--json")
        assert [row["target"] for row in json.loads(listing.stdout)] == ["hung"]
    finally:
        held.set()
        hung.close()


def queue_command(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", "relay", "queue", *args, "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_queue_commands_retry_and_drop_while_the_relay_runs(
    tmp_path: Path, receiver: FakeTarget
) -> None:
    refusing = FakeTarget(lambda _request: (400, {}, b"bad request"))
    try:
        config = {
            "targets": {
                "refusing": {"type": "webhook", "url": refusing.url},
                "hook": {"type": "webhook", "url": receiver.url},
            },
            "route": {"targets": ["refusing"]},
            "delivery": fast_delivery(),
        }
        with running_relay(tmp_path, config) as relay:
            for group in ("a", "b"):
                assert post(relay.url, notification(alert(), group=group)).status_code == 200
            wait_until(lambda: len(relay.queue.entries("dead")) == 2, what="two dead letters")
            path = tmp_path / "relay.yaml"
            listing = queue_command(path, "list", "--dead")
            assert listing.returncode == 0, listing.stderr
            assert "HTTP 400: bad request" in listing.stdout
            ids = [
                row["id"]
                for row in json.loads(queue_command(path, "list", "--dead", "--json").stdout)
            ]
            assert queue_command(path, "list").stdout.strip() == "(none)"
            refusing.answer = lambda _request: (200, {}, b"ok")
            retried = queue_command(path, "retry", str(ids[0]), "--dead")
            assert retried.returncode == 0, retried.stderr
            wait_until(lambda: len(refusing.requests) == 3, what="the retried delivery")
            assert queue_command(path, "drop", str(ids[1]), "--dead").returncode == 0
            assert relay.queue.entries("dead") == []
            missing = queue_command(path, "drop", str(ids[1]), "--dead")
            assert missing.returncode == 1
            assert f"no {ids[1]} among the dead letters" in missing.stderr
    finally:
        refusing.close()


def test_connection_threads_wait_for_the_next_connection_a_few_at_most_and_end_at_stop(
    tmp_path: Path, receiver: FakeTarget
) -> None:
    before = set(threading.enumerate())

    def serving() -> list[threading.Thread]:
        started = set(threading.enumerate()) - before
        return [thread for thread in started if thread.name == "http-connection"]

    with running_relay(tmp_path, hook(receiver)) as relay:
        with ThreadPoolExecutor(40) as senders:
            answers = senders.map(
                lambda i: post(relay.url, notification(alert(instance=f"node-{i}"))).status_code,
                range(80),
            )
            assert list(answers) == [200] * 80
        # Each sender closed its connection: at most MAX_SPARE_THREADS threads wait on.
        wait_until(
            lambda: len(serving()) <= MAX_SPARE_THREADS, what="the connections' threads to end"
        )
    # Stopping the server ends the threads that wait.
    wait_until(lambda: not serving(), what="the waiting threads to end at stop")


def test_sigterm_with_many_half_sent_requests_exits_at_once(tmp_path: Path) -> None:
    """Connections that sent part of a request hold no thread the shutdown waits for."""
    config = write_config(
        tmp_path,
        {
            "web": {"listen_address": "127.0.0.1:0"},
            "queue": {"path": str(tmp_path / "q.db")},
            "targets": {"hook": {"type": "webhook", "url": "http://127.0.0.1:9/hook"}},
            "route": {"targets": ["hook"]},
        },
    )
    relay = start_relay_process(config)
    host, port = relay.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    held = []
    try:
        for _ in range(500):
            connection = socket.create_connection((host, int(port)), timeout=10)
            connection.sendall(b"POST /alerts HTTP/1.1\r\nHost: relay\r\n")
            held.append(connection)
        relay.process.send_signal(signal.SIGTERM)
        # A bound on a hang only: the relay's docs promise about 3 s (0.3 s measured).
        assert relay.process.wait(timeout=30) == 0
    finally:
        for connection in held:
            connection.close()
        if relay.process.poll() is None:
            relay.process.kill()
