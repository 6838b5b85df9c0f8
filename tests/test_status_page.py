"""The live status page: server-rendered cards, its JSON, and real headless Chromium."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import ROOT, wait_until

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
ARTIFACTS = ROOT / "test-artifacts"


def test_status_json_and_page_show_every_gpu(daemon_factory) -> None:
    daemon = daemon_factory("--simulate", "saturated", "--collect.interval", "200ms")

    def settled() -> bool:
        gpus = daemon.get("/api/v1/status").json()["gpus"]
        # Every GPU reported (on a busy machine one may miss a cycle's timeout), and GPM's
        # DRAM bandwidth, which needs two cycles' samples (until then the bar shows NVML's
        # "memory busy" instead): the lasting state, however many cycles ran by now.
        return (
            len(gpus) == 8
            and gpus[0]["verdict"]["state"] == "compute-bound"
            and gpus[0]["bars"][2]["name"] == "DRAM bandwidth"
        )

    wait_until(settled, what="a verdict and GPM's readings")
    status = daemon.get("/api/v1/status").json()
    assert status["nvml"] == "up"
    assert len(status["gpus"]) == 8
    gpu = status["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert [bar["name"] for bar in gpu["bars"]] == [
        "Utilization",
        "Memory",
        "DRAM bandwidth",
        "Temperature",
        "Power",
    ]
    assert gpu["bars"][0]["ratio"] > 0.9
    assert gpu["verdict"]["healthy"] is True
    page = daemon.get("/")
    assert page.headers["Content-Type"].startswith("text/html")
    assert len(re.findall(r'data-gpu="\d+"', page.text)) == 8
    assert 'href="/metrics"' in page.text and 'href="/healthz"' in page.text
    assert "<script src" not in page.text and "<link" not in page.text  # nothing external
    assert 'data-verdict="compute-bound"' in page.text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def chromium(tmp_path: Path, url: str, *flags: str) -> str:
    """Run headless Chromium on ``url``; return what it prints (the DOM with --dump-dom)."""
    assert CHROMIUM is not None
    profile = tmp_path / f"profile-{time.monotonic_ns()}"
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            # Timers run in virtual time: 3 s of the page's life, its refreshes included.
            "--virtual-time-budget=3000",
            *flags,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _verdicts(dom: str) -> list[str]:
    return re.findall(r'data-verdict="([a-z-]+)"', dom)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/test installs it)")
def test_the_page_renders_and_follows_a_scenario_change_in_chromium(
    tmp_path: Path, daemon_factory
) -> None:
    port = _free_port()
    address = ["--web.listen-address", f"127.0.0.1:{port}", "--collect.interval", "500ms"]
    idle = daemon_factory("--simulate", "idle", *address)
    wait_until(lambda: _verdicts(idle.get("/").text) == ["idle"] * 8, what="verdicts")
    first_paint = idle.get("/").text
    dom = chromium(tmp_path, idle.url, "--dump-dom")
    assert _verdicts(dom) == ["idle"] * 8
    assert dom.count("NVIDIA H100 80GB HBM3") == 8
    refreshes = int(re.search(r'data-refreshes="(\d+)"', dom).group(1))  # type: ignore[union-attr]
    assert refreshes >= 1, "the script did not refresh the cards from /api/v1/status"
    idle.process.send_signal(signal.SIGTERM)  # frees the port for the next one
    idle.process.wait(timeout=30)

    # The same node now runs another scenario. The page as first painted (idle) is opened again;
    # its script fetches /api/v1/status from the restarted exporter and redraws every card.
    hot = daemon_factory(
        "--simulate", "thermal-throttle", "--sim.epoch", str(time.time() - 150), *address
    )
    wait_until(
        lambda: _verdicts(hot.get("/").text) == ["throttled-thermal"] * 8, what="new verdicts"
    )
    saved = tmp_path / "first-paint.html"
    saved.write_text(first_paint.replace("<head>", f'<head><base href="{hot.url}">', 1))
    dom = chromium(
        tmp_path,
        saved.as_uri(),
        "--disable-web-security",
        "--allow-file-access-from-files",
        "--dump-dom",
    )
    assert "idle" not in _verdicts(dom)
    assert _verdicts(dom) == ["throttled-thermal"] * 8
    assert "GPUThermalThrottling" in dom  # pending (for: 1m) local alerts on the cards
    assert re.search(r"<b>(9\d|100)%</b>", dom), "utilization bars not redrawn"

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "status-page.png"
    screenshot.unlink(missing_ok=True)
    chromium(tmp_path, hot.url, f"--screenshot={screenshot}", "--window-size=1280,1000")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
