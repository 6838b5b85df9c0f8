"""End to end: Debian's real Alertmanager posting to a `gpuload relay` process."""

from __future__ import annotations

import datetime
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import wait_until
from relay_helpers import FakeTarget, fast_delivery, start_relay_process, write_config

ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"

pytestmark = pytest.mark.skipif(
    not Path(ALERTMANAGER).exists(),
    reason="needs Debian's prometheus-alertmanager (apt-get install prometheus-alertmanager)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_alertmanager(
    directory: Path, relay_url: str, token: str
) -> tuple[subprocess.Popen[bytes], str]:
    config = {
        "route": {
            "receiver": "relay",
            "group_by": ["alertname"],
            "group_wait": "100ms",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "relay",
                "webhook_configs": [
                    {
                        "url": relay_url + "alerts",
                        "send_resolved": True,
                        "http_config": {"authorization": {"credentials": token}},
                    }
                ],
            }
        ],
    }
    (directory / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={directory / 'alertmanager.yml'}",
            f"--storage.path={directory / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/"

    def ready() -> bool:
        try:
            return requests.get(url + "-/ready", timeout=5).status_code == 200
        except requests.RequestException:  # not listening yet, or too busy to answer in time
            return False

    wait_until(ready, timeout=20, what="Alertmanager to start")
    return process, url


def push(alertmanager: str, *, ends_at: str | None = None) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    item: dict[str, Any] = {
        "labels": {
            "alertname": "GPUTemperatureHigh",
            "severity": "critical",
            "gpu": "3",
            "uuid": "GPU-0c1d",
            "instance": "node-7:19400",
        },
        "annotations": {
            "summary": "A GPU is too hot",
            "description": "GPU 3 is at 91 °C.",
            "runbook_url": "https://example.com/runbooks.md#gputemperaturehigh",
            "value": "91 °C",
        },
        "startsAt": (now - datetime.timedelta(minutes=1)).isoformat(),
        "generatorURL": "http://prometheus:9090/graph",
    }
    if ends_at:
        item["endsAt"] = ends_at
    answer = requests.post(alertmanager + "api/v2/alerts", json=[item], timeout=5)
    assert answer.status_code == 200, answer.text


def test_alertmanager_notifications_reach_slack_and_a_webhook(tmp_path: Path) -> None:
    slack, webhook = FakeTarget(), FakeTarget()
    processes: list[subprocess.Popen[Any]] = []
    try:
        config = write_config(
            tmp_path,
            {
                "web": {
                    "listen_address": "127.0.0.1:0",
                    "auth": {"bearer_token_env": "RELAY_TOKEN"},
                },
                "targets": {
                    "slack": {"type": "slack", "url": slack.url, "min_interval": "100ms"},
                    "archive": {"type": "webhook", "url": webhook.url},
                },
                "route": {"targets": ["slack", "archive"]},
                "delivery": fast_delivery(),
                "message": {"grafana_url": "https://grafana.example.com"},
            },
        )
        relay = start_relay_process(config, env={"RELAY_TOKEN": "am-token"})
        processes.append(relay.process)
        alertmanager, url = start_alertmanager(tmp_path, relay.url, "am-token")
        processes.append(alertmanager)

        push(url)
        wait_until(lambda: slack.requests and webhook.requests, timeout=20, what="the firing one")
        firing = webhook.requests[0].json()
        assert firing["version"] == "4"
        assert firing["status"] == "firing"
        assert firing["receiver"] == "relay"
        assert firing["alerts"][0]["labels"]["gpu"] == "3"
        message = slack.requests[0].json()
        assert message["text"] == "[FIRING:1] GPUTemperatureHigh (critical) · GPU 3 on node-7:19400"
        shown = str(message["blocks"])
        assert "GPU 3 (GPU-0c1d) on node-7:19400" in shown
        assert "var-instance=node-7%3A19400" in shown

        push(url, ends_at=datetime.datetime.now(datetime.timezone.utc).isoformat())
        wait_until(
            lambda: any(r.json()["status"] == "resolved" for r in webhook.requests),
            timeout=20,
            what="the resolved one",
        )
        wait_until(
            lambda: any("RESOLVED" in r.json()["text"] for r in slack.requests),
            what="the resolved Slack message",
        )
        # A resolved alert carries its last firing annotations: the value is what it was.
        (resolved,) = [r.json() for r in slack.requests if "RESOLVED" in r.json()["text"]]
        assert (
            resolved["text"] == "[RESOLVED] GPUTemperatureHigh (critical) · GPU 3 on node-7:19400"
        )
        assert "value was 91 °C" in str(resolved["blocks"])
        assert "value 91 °C" not in str(resolved["blocks"])
        # Alertmanager's flushes repeat nothing new: one message per state per target.
        statuses = [r.json()["status"] for r in webhook.requests]
        assert statuses == ["firing", "resolved"]
        assert "Authorization" not in relay.log() and "am-token" not in relay.log()
    finally:
        for process in processes:
            process.kill()
            process.wait()
        slack.close()
        webhook.close()
