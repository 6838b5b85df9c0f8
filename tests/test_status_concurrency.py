"""The status page under concurrent requests while the exporter collects and evaluates.

Request threads read the latest snapshot and the local evaluator's last evaluation while the
collection thread replaces both: `/` and `/api/v1/status` once answered 500 (``deque mutated
during iteration``) about 3 times in 6,000, when the page read the history the collection thread
adds to. Four clients poll both for 30 s while a simulated node changes under them: NVLink links
going down and up (GPUNVLinkDown pending, then gone), a GPU lost and reacquired, XIDs; the rules
are evaluated every cycle, so every request reads a different evaluation than the one before.

A cycle every 500 ms; 16 GPUs make each cycle's samples and each evaluation long.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from pathlib import Path

import requests
import yaml
from helpers import Daemon, wait_until
from status_page_helpers import cards, summary

CLIENTS = 4
SECONDS = 30.0
PATHS = ("/", "/api/v1/status")
GPUS = 16
LOST_GPU = GPUS - 1


def _churning_scenario(path: Path) -> Path:
    """16 H100s whose alerts and series come and go all the time, for a few minutes."""
    faults: list[dict[str, object]] = []
    for second in range(300):
        # A link down for 1.5 s each second, on a GPU and link that move on every time.
        link = {"gpu": second % LOST_GPU, "link": second % 18}
        faults.append({"kind": "nvlink_down", **link, "at": second, "until": second + 1.5})
    for start in range(5, 300, 6):
        faults.append({"kind": "gpu_lost", "gpu": LOST_GPU, "at": start, "until": start + 2})
    faults += [{"kind": "xid", "gpu": gpu, "at": 2 + gpu, "code": 13} for gpu in range(LOST_GPU)]
    scenario = {
        "description": "16x H100 SXM with links, a GPU and XIDs changing every second",
        "driver": {"version": "550.90.07", "cuda_version": 12040},
        "gpus": [{"model": "h100-sxm", "count": GPUS}],
        "phases": [
            {
                "name": "train",
                "duration": "1h",
                "utilization": {"value": 0.6, "noise": 0.3},
                "processes": [{"name": "python train.py", "memory": "40GiB"}],
            }
        ],
        "faults": faults,
    }
    path.write_text(yaml.safe_dump(scenario))
    return path


def _problem(path: str, response: requests.Response) -> str | None:
    """What is wrong with one answer, or None: a 200 whose body parses as its kind."""
    if response.status_code != 200:
        return f"{path}: HTTP {response.status_code} {response.text[:200]!r}"
    try:
        if path == "/api/v1/status":
            status = json.loads(response.text)
            assert isinstance(status["gpus"], list) and isinstance(status["summary"], dict)
            assert all(gpu["verdict"]["label"] for gpu in status["gpus"])
            return None
        page = response.text
        assert page.rstrip().endswith("</html>"), "the page is cut short"
        shown = cards(page)
        assert summary(page)["gpus"] == len(shown)
    except (AssertionError, ValueError, KeyError, TypeError) as error:
        answer = response.text[:200]
        return f"{path}: unparsable answer ({type(error).__name__}: {error}): {answer!r}"
    return None


def _updated_at(daemon: Daemon) -> float | None:
    """When the daemon's latest snapshot was taken (None before the first)."""
    updated: float | None = daemon.get("/api/v1/status").json()["updated_at"]
    return updated


def _client(url: str, deadline: float, counts: Counter[str], problems: list[str]) -> None:
    """Poll `/` and `/api/v1/status` in turn until the deadline, as one browser tab would."""
    with requests.Session() as session:
        turn = 0
        while time.monotonic() < deadline:
            path = PATHS[turn % len(PATHS)]
            turn += 1
            try:
                # A generous bound: an answer waits for no more than one encoding.
                response = session.get(url + path.lstrip("/"), timeout=90)
            except requests.RequestException as error:
                problems.append(f"{path}: {type(error).__name__}: {error}")
                continue
            counts[path] += 1
            problem = _problem(path, response)
            if problem is not None:
                problems.append(problem)


def test_concurrent_status_requests_while_collecting_never_fail(
    tmp_path: Path, daemon_factory
) -> None:
    config = tmp_path / "gpuload.yaml"
    # The rules evaluated every cycle, as often as the history changes.
    config.write_text(yaml.safe_dump({"alerting": {"evaluation_interval": "500ms"}}))
    daemon: Daemon = daemon_factory(
        "--simulate",
        str(_churning_scenario(tmp_path / "churn.yaml")),
        "--collect.interval",
        "500ms",
        "--collect.slow-interval",
        "500ms",  # NVLink link states read every cycle
        "--config",
        str(config),
    )
    # Local alerting on: the status page's verdicts and alerts read its evaluator.
    wait_until(lambda: _updated_at(daemon) is not None, what="a first snapshot")
    wait_until(
        lambda: daemon.get("/api/v1/status").json()["rules"] is not None,
        timeout=60,
        what="a first evaluation on the status page",
    )
    wait_until(
        lambda: any(gpu["alerts"] for gpu in daemon.get("/api/v1/status").json()["gpus"]),
        timeout=60,
        what="a local alert on the status page",
    )

    deadline = time.monotonic() + SECONDS
    counts: list[Counter[str]] = [Counter() for _ in range(CLIENTS)]
    problems: list[str] = []
    clients = [
        threading.Thread(target=_client, args=(daemon.url, deadline, counts[i], problems))
        for i in range(CLIENTS)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join(timeout=SECONDS + 120)
    assert not any(client.is_alive() for client in clients), "a client hangs"

    total = sum(counts, Counter())
    asked = f"{sum(total.values())} requests ({', '.join(f'{n} {p}' for p, n in total.items())})"
    print(f"{CLIENTS} clients, {SECONDS:g} s: {asked}")
    # The last line of each traceback: what the request raised.
    failures = re.findall(r"^\w+(?:Error|Exception): .*$", daemon.log(), re.M)
    assert not problems, (
        f"{len(problems)} of {asked} failed: {problems[:5]}; daemon log: {failures[:3]}"
    )
    # How many requests fit in 30 s depends on the machine; that each client got answers does not.
    assert all(sum(c.values()) >= 1 for c in counts), f"a client got no answer: {counts}; {asked}"
    assert daemon.process.poll() is None, daemon.log()[-3000:]
    assert "Traceback" not in daemon.log(), f"{asked}; daemon log: {daemon.log()[-5000:]}"
