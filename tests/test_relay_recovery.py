"""A damaged queue file is recovered, at the start and under a running relay, never refused.

Pages of the table are overwritten with garbage, named by the rows they hold (read from the
file's own b-tree pages, https://www.sqlite.org/fileformat2.html section 1.6): every row on
a page that is still readable is delivered, the damaged file is kept aside with its WAL, and
the counts of rows recovered and lost are logged.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import requests
from helpers import parse_metrics, value_of, wait_until
from relay_helpers import (
    FakeTarget,
    alert,
    fast_delivery,
    notification,
    post,
    running_relay,
)

from exporter.relay.config import AuthConfig
from exporter.relay.metrics import RelayMetrics
from exporter.relay.queue import Queue
from exporter.relay.recovery import QueueCheck, open_queue
from exporter.relay.routes import Route
from exporter.relay.server import RelayApplication

PAGE = 4096
# Long enough that the rows fill a few dozen pages, a handful on each.
PADDING = "x" * 700


def _body(n: int) -> str:
    return json.dumps(notification(alert(gpu=str(n), detail=PADDING), group=f"n{n}"))


def _leaves(path: Path) -> dict[int, list[int]]:
    """The table's leaf pages (by page number) and the row ids on each, from the file itself."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = [
            row[0]
            for row in db.execute(
                "SELECT pageno FROM dbstat WHERE name = 'notifications' AND pagetype = 'leaf'"
            )
        ]
    finally:
        db.close()
    data = path.read_bytes()
    return {page: _rowids(data[(page - 1) * PAGE : page * PAGE]) for page in sorted(pages)}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for index in range(9):
        byte = data[at + index]
        if index == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + index + 1
    raise AssertionError("unreachable")


def _rowids(page: bytes) -> list[int]:
    """The row ids of a table leaf page's cells: payload size, then row id (varints)."""
    assert page[0] == 0x0D, page[0]
    cells = int.from_bytes(page[3:5], "big")
    ids = []
    for cell in range(cells):
        at = int.from_bytes(page[8 + 2 * cell : 10 + 2 * cell], "big")
        _, at = _varint(page, at)
        rowid, _ = _varint(page, at)
        ids.append(rowid)
    return ids


def _overwrite(path: Path, pages: list[int]) -> None:
    with open(path, "r+b") as file:
        for page in pages:
            file.seek((page - 1) * PAGE)
            file.write(bytes([0xA5]) * PAGE)


def _filled(path: Path, count: int) -> Queue:
    queue = Queue(str(path))
    for n in range(1, count + 1):
        queue.enqueue([("hook", f"k{n}", _body(n))], 1000.0 + n, 3600.0)
    return queue


def _damage(path: Path) -> tuple[set[int], set[int]]:
    """Overwrite the table's 2nd and 4th leaf pages: the row ids kept readable, and lost."""
    leaves = _leaves(path)
    pages = list(leaves)
    damaged = [pages[1], pages[3]]
    _overwrite(path, damaged)
    lost = {rowid for page in damaged for rowid in leaves[page]}
    readable = {rowid for page, ids in leaves.items() if page not in damaged for rowid in ids}
    return readable, lost


def _delivered(receiver: FakeTarget) -> set[int]:
    """The notifications the receiver took, by number (their group is ``n<number>``)."""
    found = set()
    for request in receiver.requests:
        match = re.search(r'group="n([0-9]+)"', json.loads(request.body)["groupKey"])
        assert match, request.body[:200]
        found.add(int(match.group(1)))
    return found


def test_a_damaged_file_at_start_is_moved_aside_and_what_it_still_holds_is_recovered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "relay.db"
    _filled(path, 60).close()
    readable, lost = _damage(path)
    assert readable and lost
    with caplog.at_level(logging.WARNING, logger="exporter.relay"):
        queue, recovered = open_queue(str(path), 3600.0)
    try:
        assert recovered is not None
        assert (recovered.recovered, recovered.lost) == (len(readable), len(lost))
        assert recovered.queued == len(readable)
        # Kept as found, WAL and all; the queue is a fresh file holding the readable rows.
        assert Path(recovered.aside).exists()
        assert queue.verify() is None
        assert {entry.id for entry in queue.entries("queued")} == readable
        line = (
            f"{len(readable)} row(s) read back ({len(readable)} still to deliver), {len(lost)} lost"
        )
        assert line in caplog.text
        assert recovered.aside in caplog.text
    finally:
        queue.close()


def test_an_unreadable_schema_recovers_an_empty_queue_and_the_relay_starts(tmp_path: Path) -> None:
    path = tmp_path / "relay.db"
    _filled(path, 5).close()
    _overwrite(path, [1])
    queue, recovered = open_queue(str(path), 3600.0)
    try:
        assert recovered is not None and recovered.recovered == 0
        assert queue.entries("queued") == []
        assert queue.check() is None
    finally:
        queue.close()


def test_damage_found_by_a_check_refuses_notifications_until_the_file_is_recovered(
    tmp_path: Path,
) -> None:
    """The check stepped by hand: 503 with the reason between finding and recovering."""
    path = tmp_path / "relay.db"
    queue = _filled(path, 30)
    metrics = RelayMetrics(queue, ["hook"])
    app = RelayApplication(
        queue=queue,
        route=Route(targets=["hook"]),
        metrics=metrics,
        auth=AuthConfig(),
        path="/alerts",
        max_body_bytes=1 << 20,
        max_age=3600.0,
        wake=lambda _target: None,
    )
    damaged: list[bool] = []
    check = QueueCheck(queue, 30.0, damaged=damaged.append, recovered=lambda _r: None)
    try:
        assert check.step() is None
        readable, lost = _damage(path)
        assert queue.verify() is not None
        status, text = _call(app, "/readyz")
        assert status.startswith("503") and "is damaged" in text, text
        status, text = _call(app, "/alerts", json.dumps(notification(group="late")).encode())
        assert status.startswith("503") and "is damaged" in text, text
        found = check.step()
        assert found is not None and (found.recovered, found.lost) == (len(readable), len(lost))
        assert damaged == [True, False]
        assert _call(app, "/readyz")[0].startswith("200")
        assert _call(app, "/alerts", json.dumps(notification(group="after")).encode())[
            0
        ].startswith("200")
        assert readable < {entry.id for entry in queue.entries("queued")}
    finally:
        queue.close()


def _call(app: RelayApplication, path: str, body: bytes | None = None) -> tuple[str, str]:
    started: list[str] = []
    environ: dict[str, Any] = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    if body is not None:
        environ.update(
            REQUEST_METHOD="POST", CONTENT_LENGTH=str(len(body)), **{"wsgi.input": io.BytesIO(body)}
        )
    answer = app(environ, lambda status, _headers: started.append(status))
    return started[0], b"".join(answer).decode()


def test_damage_under_a_running_relay_is_recovered_and_every_readable_row_delivered(
    tmp_path: Path,
) -> None:
    up = False
    receiver = FakeTarget(lambda _r: (200, {}, b"ok") if up else (503, {}, b"down"))
    path = tmp_path / "relay.db"
    document = {
        "targets": {"hook": {"type": "webhook", "url": receiver.url}},
        "route": {"targets": ["hook"]},
        "queue": {"path": str(path), "check_interval": "1s"},
        "delivery": fast_delivery(backoff_initial="1s", backoff_max="2s"),
    }
    try:
        with running_relay(tmp_path, document) as relay:
            count = 60
            for n in range(1, count + 1):
                body = notification(alert(gpu=str(n), detail=PADDING), group=f"n{n}")
                assert post(relay.url, body).status_code == 200
            readable, lost = _damage(path)

            def recoveries() -> float | None:
                text = requests.get(relay.url + "metrics", timeout=10).text
                return value_of(parse_metrics(text), "gpuload_relay_queue_recoveries_total")

            # Found within the check's period (1 s), and recovered in place: a generous wait.
            wait_until(lambda: recoveries() == 1, timeout=60, what="the queue to be recovered")
            assert requests.get(relay.url + "readyz", timeout=10).status_code == 200
            up = True
            wait_until(
                lambda: readable <= _delivered(receiver),
                timeout=60,
                what="every notification on a readable page to be delivered",
            )
            # Those on the overwritten pages are gone; none was made up.
            assert _delivered(receiver) <= readable | lost
            assert list(path.parent.glob("relay.db.damaged-*"))
    finally:
        receiver.close()
