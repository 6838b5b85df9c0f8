"""The live status page: server-rendered cards, its JSON, and real headless Chromium.

Chromium opens the page of a real daemon on each scenario an on-call engineer meets; the checks
read the DOM Chromium rendered and the pixels of its screenshot, which stays in
``test-artifacts/status-page/`` for a person to look at.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, wait_until
from status_page_helpers import cards, png_pixels, rgb, summary, title

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
ARTIFACTS = ROOT / "test-artifacts" / "status-page"
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/test installs it)"
)


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
        "SM clock",
    ]
    assert gpu["bars"][0]["ratio"] > 0.9
    assert gpu["verdict"]["healthy"] is True
    assert gpu["verdict"]["runbook_url"] == ""  # a healthy GPU has no runbook to follow
    assert status["hostname"] == socket.gethostname()
    assert status["simulated"] == "saturated"
    assert status["summary"]["gpus"] == 8 and status["summary"]["lost"] == 0
    page = daemon.get("/")
    assert page.headers["Content-Type"].startswith("text/html")
    assert len(re.findall(r'data-gpu="\d+"', page.text)) == 8
    assert 'href="/metrics"' in page.text and 'href="/healthz"' in page.text
    assert "<script src" not in page.text and "<link" not in page.text  # nothing external
    assert 'data-verdict="compute-bound"' in page.text
    assert f"<title>SIMULATED {socket.gethostname()} " in page.text
    assert 'http-equiv="refresh"' in page.text  # reloads itself without JavaScript


def test_a_gpu_lost_before_it_was_read_says_so_for_its_name_and_uuid(daemon_factory) -> None:
    # fell-off-bus's GPU 3 is lost 60 s after the epoch, before this daemon starts: NVML never
    # gives its name or UUID. The card and the JSON say so rather than show nothing.
    epoch = str(time.time() - 70)
    daemon = daemon_factory("--simulate", "fell-off-bus", "--sim.epoch", epoch)
    wait_until(lambda: len(daemon.get("/api/v1/status").json()["gpus"]) == 8, what="every GPU")
    status = daemon.get("/api/v1/status").json()
    lost = status["gpus"][3]
    assert lost["state"] == "lost"
    assert lost["name"] == "name unknown: lost before it was read"
    assert lost["uuid"] == "UUID unknown: lost before it was read"
    assert all(gpu["name"] and gpu["uuid"] for gpu in status["gpus"]), status["gpus"]
    shown = cards(daemon.get("/").text)
    card = next(card for card in shown if card.gpu == 3)
    assert "<small>name unknown: lost before it was read</small>" in card.html
    assert '<p class="uuid">UUID unknown: lost before it was read &middot; lost</p>' in card.html
    for card in shown:
        assert "<small></small>" not in card.html and '<p class="uuid"> &middot;' not in card.html


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


@needs_chromium
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
    assert refreshes >= 1, "the script did not refresh the page"
    idle.process.send_signal(signal.SIGTERM)  # frees the port for the next one
    idle.process.wait(timeout=30)

    # The same node now runs another scenario. The page as first painted (idle) is opened again;
    # its script fetches the page from the restarted exporter and swaps in every card.
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

    assert "scenario thermal-throttle" in dom


# A node whose driver does not answer: the page says so (the simulator, so that a machine with a
# real GPU sees the same).
NO_NVML = """
description: one H100 whose driver is not loaded
driver: {version: "550.90.07", cuda_version: 12040}
gpus: [{model: h100-sxm, count: 1}]
phases: [{name: idle, duration: 1h, utilization: {value: 0}}]
faults: [{kind: driver_not_loaded, at: 0}]
"""
# Colours of the page that the screenshots are checked for (the stylesheet's own).
FAULT_CARD = rgb("#fff5f5")  # a fault card's background
FAULT_RED = rgb("#c53030")  # its border, badge and the "lost" chip
SIMULATED_STRIPE = rgb("#faf089")  # the SIMULATED banner


def _settled(scenario: str, status: dict[str, Any]) -> bool:
    """Whether the daemon shows what the scenario is about, whatever the machine's speed."""
    gpus = status["gpus"]
    verdicts = [gpu["verdict"]["state"] for gpu in gpus]
    if scenario == "no-nvml":
        return status["nvml"] == "down"
    if scenario == "fell-off-bus":
        return len(gpus) == 8 and gpus[3]["state"] == "lost" and gpus[3]["last_xid"] == 79
    if scenario == "thermal-throttle":
        return verdicts == ["throttled-thermal"] * 8 and all(gpu["alerts"] for gpu in gpus)
    if scenario == "a100-mig":
        return [len(gpu["mig"]) for gpu in gpus] == [7, 3]
    return len(gpus) == 8 and "unknown" not in verdicts


def _check_training(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["lost"] == 0 and summary(dom)["firing"] == 0
    for card in shown:
        assert card.severity == "ok", card.html
        assert card.verdict in ("compute-bound", "busy")
        assert 'class="runbook"' not in card.html  # nothing to follow on a healthy GPU
        assert "healthy: healthy" not in card.html and "busy computing: healthy" not in card.html


def _check_data_starved(dom: str, shown: list[Any]) -> None:
    for card in shown:
        if card.verdict in ("compute-bound", "busy", "idle"):
            assert 'class="runbook"' not in card.html
        else:
            assert card.severity == "warning" and 'class="runbook"' in card.html, card.html


def _check_thermal_throttle(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["warnings"] == 8
    for card in shown:
        assert card.severity == "warning"
        # The 89 °C bar is red against its slowdown threshold, not a full blue bar.
        assert re.search(r'data-bar="Temperature" data-level="crit"', card.html), card.html
        assert "at slowdown 89" in card.html
        assert re.search(r'data-bar="SM clock" data-level="warn"', card.html)
        assert re.search(r"<b>\d+ / 1980 MHz \u25b2</b>", card.html)  # the clock ratio
        assert "thermal slowdown (SW)" in card.html  # the active throttle reasons
        assert 'class="runbook"' in card.html
        assert re.search(r"GPUThermalThrottling.*for \d+s, since <time", card.html)


def _check_fell_off_bus(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["lost"] == 1
    lost = shown[0]  # worst first
    assert (lost.gpu, lost.severity, lost.verdict) == (3, "fault", "hardware-fault")
    assert 'data-state="lost"' in lost.html and "FAULT" in lost.html
    assert 'data-xid="79"' in lost.html and "XID 79" in lost.html
    assert 'class="runbook"' in lost.html
    assert [card.gpu for card in shown[1:]] == sorted(card.gpu for card in shown[1:])


def _check_a100_mig(dom: str, shown: list[Any]) -> None:
    assert [card.gpu for card in shown] == [0, 1]
    for card in shown:
        text = re.sub(r"<[^>]+>", "", card.html)  # what a person reads
        assert "MIG mode" in text
        assert "unknown" not in text.lower() and "nothing holding it back" not in text
    assert shown[0].html.count("data-mig-instance=") == 7
    assert shown[0].html.count('data-bar="1g.10gb #') == 7
    assert shown[1].html.count("data-mig-instance=") == 3
    assert 'data-bar="3g.40gb #1"' in shown[1].html
    assert re.search(r"<b>36\.0 / 39\.0 GiB</b>", shown[1].html)  # its own memory


def _check_no_nvml(dom: str, shown: list[Any]) -> None:
    assert shown == []
    assert 'id="nvml-down"' in dom and summary(dom)["gpus"] == 0
    assert "NVML down" in title(dom)


CHECKS = {
    "training": _check_training,
    "data-starved": _check_data_starved,
    "thermal-throttle": _check_thermal_throttle,
    "fell-off-bus": _check_fell_off_bus,
    "a100-mig": _check_a100_mig,
    "no-nvml": _check_no_nvml,
}
# Seconds into each scenario when the daemon starts: the part worth looking at.
STARTS = {"training": 120, "data-starved": 120, "thermal-throttle": 150, "fell-off-bus": 58}


@needs_chromium
@pytest.mark.parametrize("scenario", list(CHECKS))
def test_the_page_shows_a_node_at_a_glance_in_chromium(
    tmp_path: Path, daemon_factory, scenario: str
) -> None:
    if scenario == "no-nvml":
        path = tmp_path / "no-nvml.yaml"
        path.write_text(NO_NVML)
        simulate = ["--simulate", str(path)]
    else:
        simulate = ["--simulate", scenario]
    epoch = time.time() - STARTS.get(scenario, 30)
    daemon = daemon_factory(*simulate, "--sim.epoch", str(epoch), "--collect.interval", "500ms")
    wait_until(
        lambda: _settled(scenario, daemon.get("/api/v1/status").json()),
        timeout=60,
        what=f"the {scenario} page",
    )
    dom = chromium(tmp_path, daemon.url, "--dump-dom")
    hostname = socket.gethostname()
    assert re.search(rf'<span id="hostname">{re.escape(hostname)}</span>', dom)
    assert title(dom).startswith(f"SIMULATED {hostname} \u00b7 ")
    assert 'id="simulated"' in dom and "SIMULATED" in dom
    assert "<script src" not in dom and "<link" not in dom
    shown = cards(dom)
    counts = summary(dom)
    assert counts["gpus"] == len(shown)
    CHECKS[scenario](dom, shown)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{scenario}.png"
    screenshot.unlink(missing_ok=True)
    chromium(tmp_path, daemon.url, f"--screenshot={screenshot}", "--window-size=1400,1000")
    width, height, colours = png_pixels(screenshot)
    assert (width, height) == (1400, 1000)
    # Not blank: many colours (text, bars, chips), and not one colour all over.
    assert len(colours) > 50 and colours.most_common(1)[0][1] < 0.99 * width * height
    assert colours[SIMULATED_STRIPE] > 1000
    if scenario == "fell-off-bus":
        assert colours[FAULT_CARD] > 10_000, "no red card for the lost GPU"
        assert colours[FAULT_RED] > 1000
    if scenario == "training":
        assert colours[FAULT_CARD] == 0 and colours[FAULT_RED] == 0
