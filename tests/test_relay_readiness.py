"""The relay is ready only when it can keep a notification; a full disk strands nothing.

On real small file systems (a tmpfs the test mounts; skipped where it cannot): full, read-only,
and a damaged queue file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
from helpers import ROOT, gpuload, wait_until
from relay_helpers import (
    FakeTarget,
    alert,
    fast_delivery,
    fill,
    notification,
    post,
    running_relay,
    small_disk,
    start_relay_process,
    write_config,
)

from exporter.relay.config import ConfigError, load
from exporter.relay.queue import RESERVE_BYTES, Queue


def _ready(relay_url: str) -> requests.Response:
    return requests.get(relay_url + "readyz", timeout=10)


def _document(receiver: FakeTarget, queue: Path) -> dict[str, object]:
    return {
        "targets": {"hook": {"type": "webhook", "url": receiver.url}},
        "route": {"targets": ["hook"]},
        "queue": {"path": str(queue)},
        "delivery": fast_delivery(),
    }


def test_a_full_disk_refuses_new_notifications_and_delivers_the_accepted_ones(
    tmp_path: Path,
) -> None:
    down = True
    receiver = FakeTarget(lambda _request: (503, {}, b"down") if down else (200, {}, b"ok"))
    try:
        with (
            small_disk(tmp_path / "disk", "4m") as disk,
            running_relay(tmp_path, _document(receiver, disk / "relay.db")) as relay,
        ):
            assert (disk / "relay.db-reserve").stat().st_size == RESERVE_BYTES
            accepted = [f"gpu{n}" for n in range(20)]
            for gpu in accepted:
                assert post(relay.url, notification(alert(gpu=gpu), group=gpu)).status_code == 200
            filler = fill(disk)
            # What still fits in the file's free pages is kept, and answered 200; then 503.
            for n in range(500):
                answer = post(relay.url, notification(alert(gpu=f"late{n}"), group=f"late{n}"))
                if answer.status_code != 200:
                    break
                accepted.append(f"late{n}")
            assert answer.status_code == 503, answer.text
            not_ready = _ready(relay.url)
            assert not_ready.status_code == 503
            assert "full" in not_ready.text or "no room" in not_ready.text, not_ready.text
            # The receiver comes back while the disk is still full: every accepted one leaves.
            down = False
            wait_until(
                lambda: (
                    {r.json()["alerts"][0]["labels"]["gpu"] for r in receiver.requests}
                    >= set(accepted)
                ),
                what="the accepted notifications delivered on a full disk",
                timeout=60,
            )
            wait_until(
                lambda: (
                    relay.queue.states().get("hook") is None
                    or relay.queue.states()["hook"].queued == 0
                ),
                what="their deliveries recorded",
                timeout=60,
            )
            assert _ready(relay.url).status_code == 503  # still no room for the reserve
            # Room again: ready and accepting, without a restart.
            filler.unlink()
            wait_until(lambda: _ready(relay.url).status_code == 200, what="ready again")
            assert (
                post(relay.url, notification(alert(gpu="after"), group="after")).status_code == 200
            )
            wait_until(
                lambda: any(
                    r.json()["alerts"][0]["labels"]["gpu"] == "after" for r in receiver.requests
                ),
                what="the notification after the disk had room again",
            )
    finally:
        receiver.close()


def test_a_queue_on_a_read_only_file_system_stops_the_start(tmp_path: Path) -> None:
    """The queue file is there and readable, and no notification could be written to it."""
    folder, view = tmp_path / "queue", tmp_path / "read-only"
    folder.mkdir()
    view.mkdir()
    Queue(str(folder / "relay.db")).close()
    bound = subprocess.run(["mount", "--bind", str(folder), str(view)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip("cannot bind-mount here (needs root): no read-only file system to test with")
    receiver = FakeTarget()
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        config = write_config(tmp_path, _document(receiver, view / "relay.db"))
        result = gpuload("relay", "--config", str(config))
        assert result.returncode == 1
        assert f"its folder {view} is on a read-only file system" in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
    finally:
        receiver.close()
        subprocess.run(["umount", "-l", str(view)], capture_output=True, check=False)


def _damaged(tmp_path: Path) -> Path:
    """A queue file with notifications whose last two pages are gone."""
    path = tmp_path / "relay.db"
    queue = Queue(str(path))
    bodies = [json.dumps(notification(alert(gpu=str(n)), group=f"g{n}")) for n in range(40)]
    queue.enqueue([("hook", f"k{n}", body) for n, body in enumerate(bodies)], time.time(), 3600.0)
    queue.close()
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    with open(path, "r+b") as file:
        file.truncate(os.path.getsize(path) - 2 * 4096)
    return path


def test_a_damaged_queue_is_recovered_at_the_start_and_the_relay_serves(tmp_path: Path) -> None:
    path = _damaged(tmp_path)
    receiver = FakeTarget()
    try:
        config = write_config(
            tmp_path,
            {
                "targets": {"hook": {"type": "webhook", "url": receiver.url}},
                "route": {"targets": ["hook"]},
                "queue": {"path": str(path)},
            },
        )
        relay = start_relay_process(config)
        try:
            assert _ready(relay.url).status_code == 200
            assert f"recovered the damaged queue file {path}: " in relay.log()
            # Its rows on the pages that are left are delivered.
            wait_until(lambda: len(receiver.requests) > 0, what="a recovered notification")
        finally:
            assert relay.stop() == 0
        assert list(tmp_path.glob("relay.db.damaged-*"))
    finally:
        receiver.close()


@pytest.mark.parametrize(
    ("source", "layer"),
    [
        ("config file", {"file": {"queue": {"path": ""}}}),
        ("config file", {"file": {"queue": {"path": ":memory:"}}}),
        ("environment", {"environ": {"GPULOAD_RELAY_QUEUE_PATH": ""}}),
        ("flag", {"flags": {"queue.path": ":memory:"}}),
    ],
)
def test_a_queue_a_restart_would_lose_is_refused(
    tmp_path: Path, source: str, layer: dict[str, dict[str, object]]
) -> None:
    file = None
    if "file" in layer:
        file = write_config(tmp_path, layer["file"])
    with pytest.raises(ConfigError) as raised:
        load(
            file=file,
            environ=layer.get("environ", {}),  # type: ignore[arg-type]
            flags={"web.listen_address": "127.0.0.1:0", **layer.get("flags", {})},
        )
    message = str(raised.value)
    assert message.startswith(f"{source} queue.path: ")
    assert "an in-memory queue loses every notification it holds at a restart" in message


# Run as uid 10001, the image's user, who owns the folder and the 0444 queue file: a worker on a
# clock moved by hand, as far as each look asks, looks at the queue ten times; the file is made
# writable; ten more looks.
_READ_ONLY_SCRIPT = """
import logging, os, sys
from exporter.relay import targets
from exporter.relay.config import load
from exporter.relay.delivery import Worker
from exporter.relay.metrics import RelayMetrics
from exporter.relay.queue import Queue
from exporter.relay.templates import MessageSettings
import sqlite3
config = load(file=sys.argv[2], environ={})
os.setgroups([]); os.setgid(10001); os.setuid(10001)
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout)
queue = Queue(sys.argv[1])
for attempt in (queue.check, lambda: queue.enqueue([("hook", "k", "{}")], 0.0, 60.0)):
    try:
        attempt()
        print("accepted")
    except sqlite3.Error as error:
        print("refused:", error)
now = [1000.0]
worker = Worker(
    targets.build(config.targets["hook"], MessageSettings()), queue, config.delivery,
    RelayMetrics(queue, ["hook"]), clock=lambda: now[0],
)
for _ in range(10):
    now[0] += max(worker.step(), 0.01)
os.chmod(sys.argv[1], 0o644)
print("writable")
for _ in range(10):
    now[0] += max(worker.step(), 0.01)
queue.check()
print("ready")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become uid 10001")
def test_a_read_only_queue_file_is_refused_and_logged_once_until_it_is_writable(
    tmp_path: Path,
) -> None:
    """A 0444 queue file: 503s, one line while it stays so, one when it is writable again."""
    # Outside pytest's folders, which uid 10001 may not traverse.
    with tempfile.TemporaryDirectory(prefix="gpuload-read-only-") as outside:
        folder = Path(outside)
        folder.chmod(0o755)
        path = folder / "relay.db"
        Queue(str(path)).close()
        receiver = FakeTarget()
        try:
            config = write_config(tmp_path, _document(receiver, path))
            for owned in (folder, *folder.iterdir()):
                os.chown(owned, 10001, 10001)
            path.chmod(0o444)
            # Imports as root (the checkout need not be readable by uid 10001), then the user's.
            result = subprocess.run(
                [sys.executable, "-c", _READ_ONLY_SCRIPT, str(path), str(config)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            receiver.close()
        # SQLite gives the -wal and -shm files the database's mode: none was made read-only.
        sidecars = {sidecar.name: sidecar.stat().st_mode for sidecar in folder.glob("relay.db-*")}
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    refusal = f"refused: this user cannot write the queue file {path}: give it write permission"
    assert lines[:2] == [refusal, refusal], lines
    assert sum("cannot use the queue" in line for line in lines) == 1, lines
    assert sum("records again" in line for line in lines) == 1, lines
    # Reads go on while the file is read-only: recovery is told only once a write went through.
    recovered = next(line for line in lines if "records again" in line)
    assert lines.index(recovered) > lines.index("writable"), lines
    assert lines[-1] == "ready", lines
    assert all(mode & 0o200 for mode in sidecars.values()), sidecars
