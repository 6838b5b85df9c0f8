"""Crash safety: `kill -9` the relay mid-stream, restart it; everything answered 200 arrives."""

from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path

import requests
from helpers import parse_metrics, value_of, wait_until
from relay_helpers import (
    FakeTarget,
    RelayProcess,
    alert,
    fast_delivery,
    notification,
    post,
    start_relay_process,
    write_config,
)

NOTIFICATIONS = 150
KILLS = 4


def metric(relay: RelayProcess, name: str) -> float | None:
    """A sample of the relay's /metrics for the one target, `hook`."""
    answer = requests.get(relay.url + "metrics", timeout=10)
    return value_of(parse_metrics(answer.text), name, target="hook")


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
    relay: list[RelayProcess] = [start_relay_process(config)]
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
        for process in relay:
            if process.process.poll() is None:
                process.process.kill()
                process.process.wait()
        receiver.close()
