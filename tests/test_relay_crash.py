"""Crash safety: `kill -9` the relay mid-stream, restart it; everything answered 200 arrives."""

from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path

import requests
from helpers import Daemon, parse_metrics, value_of, wait_until
from relay_helpers import (
    FakeTarget,
    Received,
    alert,
    fast_delivery,
    notification,
    pagerduty_accepted,
    post,
    start_relay_process,
    write_config,
)

NOTIFICATIONS = 150
KILLS = 4


def kill_all(relays: list[Daemon]) -> None:
    """Kill what is still running of the relays a test started."""
    for relay in relays:
        if relay.process.poll() is None:
            relay.process.kill()
            relay.process.wait()


def metric(relay: Daemon, name: str, target: str = "hook") -> float | None:
    """A sample of the relay's /metrics for one target."""
    answer = requests.get(relay.url + "metrics", timeout=10)
    return value_of(parse_metrics(answer.text), name, target=target)


def test_every_acknowledged_notification_arrives_exactly_once_after_dedup(tmp_path: Path) -> None:
    receiver = FakeTarget()
    config = write_config(
        tmp_path,
        {
            "targets": {"hook": {"type": "webhook", "url": receiver.url}},
            "route": {"targets": ["hook"]},
            "delivery": fast_delivery(),
        },
    )
    relay: list[Daemon] = [start_relay_process(config)]
    acknowledged: set[str] = set()
    refused = collections.Counter[str]()
    done = threading.Event()

    def send() -> None:
        # Like Alertmanager: a notification not answered 2xx is sent again.
        session = requests.Session()
        for i in range(NOTIFICATIONS):
            group = f"g{i}"
            document = notification(alert(gpu=str(i % 8)), group=group)
            while True:
                try:
                    # A killed relay resets the connection at once; the timeout is for a hang.
                    answer = session.post(relay[-1].url + "alerts", json=document, timeout=30)
                except requests.RequestException:
                    refused["connection"] += 1
                    time.sleep(0.02)
                    continue
                if answer.status_code == 200:
                    acknowledged.add(f'{{}}:{{group="{group}"}}')
                    break
                refused[str(answer.status_code)] += 1
                time.sleep(0.02)
        done.set()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        for kill in range(1, KILLS + 1):
            # Kill while the stream goes on: after each fifth of the notifications.
            share = kill * NOTIFICATIONS // (KILLS + 1)
            wait_until(lambda share=share: len(acknowledged) >= share, timeout=30, what="progress")
            relay[-1].process.send_signal(signal.SIGKILL)
            relay[-1].process.wait()
            relay.append(start_relay_process(config))
        assert done.wait(60), "the sender did not finish"
        assert refused["connection"] >= KILLS, "the kills did not land mid-stream"

        def arrived() -> set[str]:
            return {request.json()["groupKey"] for request in receiver.requests}

        wait_until(lambda: arrived() >= acknowledged, timeout=30, what="every acknowledged one")
        # Nothing left to deliver (a row sent but not recorded before a kill is sent again):
        # the deliveries below are all there will be.
        wait_until(lambda: metric(relay[-1], "gpuload_relay_queue_depth") == 0, what="no queue")
        assert len(acknowledged) == NOTIFICATIONS
        assert arrived() == acknowledged
        # At least once: a kill between sending and recording may repeat a delivery; the
        # dedup key header lets the receiver drop it, and it is the only duplicate kind.
        keys = collections.Counter(r.headers["X-Gpuload-Dedup-Key"] for r in receiver.requests)
        assert len(keys) == NOTIFICATIONS
        assert sum(keys.values()) - len(keys) <= KILLS
        # Alertmanager re-sends one: the relay knows it (counted as a duplicate when it
        # answers) and queues nothing, so nothing more will reach the receiver.
        duplicates = metric(relay[-1], "gpuload_relay_duplicates_total")
        assert post(relay[-1].url, notification(alert(gpu="0"), group="g0")).status_code == 200
        assert metric(relay[-1], "gpuload_relay_duplicates_total") == duplicates + 1
        assert metric(relay[-1], "gpuload_relay_queue_depth") == 0
        assert len(receiver.requests) == sum(keys.values())
    finally:
        kill_all(relay)
        receiver.close()


def test_a_resolve_stays_behind_its_trigger_across_a_kill(tmp_path: Path) -> None:
    triggers = 0

    def answer(request: Received) -> tuple[int, dict[str, str], bytes] | None:
        # The first trigger fails, the second hangs until the relay is killed, then all is taken.
        nonlocal triggers
        if request.json()["event_action"] == "trigger":
            triggers += 1
            if triggers == 1:
                return 502, {}, b"bad gateway"
            if triggers == 2:
                return None
        return pagerduty_accepted(request)

    pager = FakeTarget(answer)
    (tmp_path / "routing-key").write_text("routing-key-1\n")
    config = write_config(
        tmp_path,
        {
            "targets": {
                "pager": {"type": "pagerduty", "url": pager.url, "routing_key_file": "routing-key"}
            },
            "route": {"targets": ["pager"]},
            # Long enough for the resolve to be accepted while the trigger waits to be retried.
            "delivery": fast_delivery(backoff_initial="2s", backoff_max="2s"),
        },
    )
    relay = [start_relay_process(config)]

    def actions() -> list[str]:
        return [request.json()["event_action"] for request in pager.requests]

    try:
        assert post(relay[-1].url, notification(alert(), group="db")).status_code == 200
        wait_until(lambda: actions() == ["trigger"], what="the trigger that fails")
        resolved = notification(alert(status="resolved"), group="db")
        assert post(relay[-1].url, resolved).status_code == 200
        wait_until(lambda: actions().count("trigger") == 2, timeout=30, what="the retry that hangs")
        relay[-1].process.send_signal(signal.SIGKILL)
        relay[-1].process.wait()
        relay.append(start_relay_process(config))
        wait_until(lambda: "resolve" in actions(), timeout=30, what="the resolve")
        wait_until(
            lambda: metric(relay[-1], "gpuload_relay_queue_depth", "pager") == 0,
            what="no queue",
        )
        assert actions() == ["trigger", "trigger", "trigger", "resolve"]
        assert len({request.json()["dedup_key"] for request in pager.requests}) == 1
    finally:
        kill_all(relay)
        pager.close()
