"""The live status page: server-rendered cards, its JSON, and real headless Chromium.

Chromium opens the page on each scenario an on-call engineer meets; the checks read the DOM
Chromium rendered and the pixels of its screenshot, which stays in ``test-artifacts/status-page/``
for a person to look at. Two kinds of node serve it:

- the real `gpuload serve`, in real time. Its rules need 6 minutes of samples before their
  5-minute means are whole, so these tests check what is true in a daemon's first minute: every
  card, the bars read now, the alerts already pending, a lost GPU, and that it says it is
  warming up;
- a :class:`simnode.SimulatedNode` run minutes into its scenario in seconds and served on
  127.0.0.1, for the verdicts the rules record once their windows are whole.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, wait_until
from simnode import SimulatedNode
from status_page_helpers import cards, png_pixels, rgb, served, summary, title

from exporter.server.status import SEVERITIES

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
)
ARTIFACTS = ROOT / "test-artifacts" / "status-page"
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/test installs it)"
)


# Pending from a saturated node's first evaluation: their conditions need no whole window.
SATURATED_ALERTS = {"GPUPowerCapped", "GPUMemoryNearlyFull"}


def test_status_json_and_page_show_every_gpu(daemon_factory) -> None:
    daemon = daemon_factory("--simulate", "saturated", "--collect.interval", "200ms")

    def settled() -> bool:
        status = daemon.get("/api/v1/status").json()
        gpus = status["gpus"]
        # Every GPU reported (on a busy machine one may miss a cycle's timeout), the rules
        # evaluated with saturated's alerts (it draws its power limit and fills its memory),
        # and GPM's DRAM bandwidth, which needs two cycles' samples (until then the bar shows
        # NVML's "memory busy" instead): the lasting state, however fast the machine.
        return (
            len(gpus) == 8
            and status["rules"] is not None
            and all({a["alertname"] for a in gpu["alerts"]} >= SATURATED_ALERTS for gpu in gpus)
            and gpus[0]["bars"][2]["name"] == "DRAM bandwidth (now)"
        )

    wait_until(settled, timeout=60, what="an evaluation and GPM's readings")
    status = daemon.get("/api/v1/status").json()
    assert status["nvml"] == "up"
    assert len(status["gpus"]) == 8
    gpu = status["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert [bar["name"] for bar in gpu["bars"]] == [
        "Utilization (now)",
        "Memory (now)",
        "DRAM bandwidth (now)",
        "Temperature (now)",
        "Power (now)",
        "SM clock (now)",
    ]
    assert gpu["bars"][0]["ratio"] > 0.9
    # A real-time node has minutes to go before its 5-minute means are whole: it says so.
    rules = status["rules"]
    assert rules["warming_up"] is True and rules["warm_up_seconds"] > rules["seen_seconds"]
    for card in status["gpus"]:
        assert card["verdict"]["label"] == "Warming up", card["verdict"]
        assert "min of samples" in card["verdict"]["summary"]
        assert card["severity"] == "warning"  # the alerts pending already
    assert status["hostname"] == socket.gethostname()
    assert status["simulated"] == "saturated"
    assert status["summary"]["gpus"] == 8 and status["summary"]["lost"] == 0
    page = daemon.get("/")
    assert page.headers["Content-Type"].startswith("text/html")
    assert len(re.findall(r'data-gpu="\d+"', page.text)) == 8
    assert 'href="/metrics"' in page.text and 'href="/healthz"' in page.text
    assert "<script src" not in page.text and "<link" not in page.text  # nothing external
    assert 'id="warming-up"' in page.text
    assert f"<title>SIMULATED {socket.gethostname()} " in page.text
    assert 'http-equiv="refresh"' in page.text  # reloads itself without JavaScript


def test_a_gpu_lost_before_it_was_read_says_so_for_its_name_and_uuid(daemon_factory) -> None:
    # fell-off-bus's GPU 3 is lost 60 s after the epoch, before this daemon starts: NVML never
    # gives its name or UUID. The card and the JSON say so rather than show nothing.
    epoch = str(time.time() - 70)
    daemon = daemon_factory("--simulate", "fell-off-bus", "--sim.epoch", epoch)

    def evaluated() -> bool:
        status = daemon.get("/api/v1/status").json()
        return len(status["gpus"]) == 8 and status["rules"] is not None

    wait_until(evaluated, what="every GPU, evaluated")
    status = daemon.get("/api/v1/status").json()
    lost = status["gpus"][3]
    assert lost["state"] == "lost"
    assert lost["name"] == "name unknown: lost before it was read"
    assert lost["uuid"] == "UUID unknown: lost before it was read"
    # Lost is a state now, not a mean: no warming up for it.
    assert (lost["verdict"]["state"], lost["verdict"]["label"]) == ("lost", "Lost")
    assert lost["severity"] == "fault"
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


def _levels(dom: str, bar: str) -> list[str]:
    return re.findall(rf'data-bar="{re.escape(bar)}" data-level="(\w+)"', dom)


@needs_chromium
def test_the_page_renders_and_follows_a_scenario_change_in_chromium(
    tmp_path: Path, daemon_factory
) -> None:
    port = _free_port()
    address = ["--web.listen-address", f"127.0.0.1:{port}", "--collect.interval", "500ms"]
    idle = daemon_factory("--simulate", "idle", *address)
    # Idle GPUs hold nothing: the rules record them idle from their first evaluation.
    wait_until(lambda: _verdicts(idle.get("/").text) == ["idle"] * 8, timeout=60, what="verdicts")
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

    def hot_now() -> bool:
        page = hot.get("/").text
        return _levels(page, "Temperature (now)") == ["warn"] * 8 and "GPUThermalThrottling" in page

    # A bound, not an expectation: at a load of 10 on 2 cores the restarted daemon took over 15 s
    # to start, collect and evaluate the rules that make the pending alert.
    wait_until(hot_now, timeout=60, what="the throttled GPUs' readings and alerts")
    saved = tmp_path / "first-paint.html"
    saved.write_text(first_paint.replace("<head>", f'<head><base href="{hot.url}">', 1))
    dom = chromium(
        tmp_path,
        saved.as_uri(),
        "--disable-web-security",
        "--allow-file-access-from-files",
        "--dump-dom",
    )
    assert len(_verdicts(dom)) == 8  # every card swapped in: its bars and alerts below
    assert _levels(dom, "Temperature (now)") == ["warn"] * 8
    assert "GPUThermalThrottling" in dom  # pending (for: 1m) local alerts on the cards
    # At or above GPUUtilizationHigh's threshold, the bar is marked info.
    assert re.search(r"<b>(9\d|100)%( \u25cf)?</b>", dom), "utilization bars not redrawn"
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
WARNING_ORANGE = rgb("#c05621")  # a warning card's border and badge
SIMULATED_STRIPE = rgb("#faf089")  # the SIMULATED banner


def _text(html: str) -> str:
    """What a person reads of some HTML."""
    return re.sub(r"<[^>]+>", "", html)


def _bars_read_now(shown: list[Any]) -> None:
    for card in shown:
        bars = re.findall(r'data-bar="([^"]*)"', card.html)
        assert all(bar.endswith("(now)") for bar in bars), bars


def _check_training_now(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["lost"] == 0 and summary(dom)["firing"] == 0
    assert 'id="warming-up"' in dom
    for card in shown:
        # In use, not yet measured over a whole window: nothing to say yet, and it says why.
        # On a loaded machine a collection cycle may come late, and GPULoadStale says so: true,
        # and the one alert such a card may carry.
        stale = "GPULoadStale" in card.html
        assert card.severity in (("warning",) if stale else ("unknown", "ok")), card.html
        assert "<strong>Warming up</strong>" in card.html
        assert stale or 'class="runbook"' not in card.html
        assert re.search(r'data-bar="Utilization \(now\)"', card.html)
    _bars_read_now(shown)


def _check_thermal_throttle_now(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["warnings"] == 8
    for card in shown:
        assert card.severity == "warning"
        # The 89 °C reading takes GPUTemperatureHigh's level (a warning), not a full blue bar.
        assert _levels(card.html, "Temperature (now)") == ["warn"], card.html
        assert "at slowdown 89" in card.html
        assert _levels(card.html, "SM clock (now)") == ["warn"]
        assert re.search(r"<b>\d+ / 1980 MHz \u25b2</b>", card.html)  # the clock ratio
        assert "thermal slowdown (SW)" in card.html  # the active throttle reasons
        assert "<strong>Warming up</strong>" in card.html
        assert 'class="runbook"' in card.html
        assert re.search(r"GPUThermalThrottling.*for \d+s, since <time", card.html)
    _bars_read_now(shown)


def _check_fell_off_bus_now(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["lost"] == 1
    lost = shown[0]  # worst first
    assert (lost.gpu, lost.severity, lost.verdict) == (3, "fault", "lost")
    assert 'data-state="lost"' in lost.html and "FAULT" in lost.html
    assert "<strong>Lost</strong>" in lost.html
    assert 'data-xid="79"' in lost.html and "XID 79" in lost.html
    assert 'class="runbook"' in lost.html and "GPUFellOffBus" in lost.html
    # The others by severity, then index: provisional verdicts may differ from GPU to GPU.
    ranks = [(SEVERITIES[card.severity][0], card.gpu) for card in shown[1:]]
    assert ranks == sorted(ranks)
    _bars_read_now(shown)


def _check_no_nvml(dom: str, shown: list[Any]) -> None:
    assert shown == []
    assert 'id="nvml-down"' in dom and summary(dom)["gpus"] == 0
    assert "NVML down" in title(dom)


def _settled_now(scenario: str, status: dict[str, Any]) -> bool:
    """Whether the daemon shows what the scenario is about now, whatever the machine's speed."""
    gpus = status["gpus"]
    if scenario == "no-nvml":
        return status["nvml"] == "down"
    if status["rules"] is None or len(gpus) != 8:
        return False
    if scenario == "fell-off-bus":
        lost = gpus[3]
        return lost["verdict"]["state"] == "lost" and lost["last_xid"] == 79 and lost["alerts"]
    if scenario == "thermal-throttle":
        return all(
            any(a["alertname"] == "GPUThermalThrottling" for a in gpu["alerts"])
            and gpu["bars"][3]["level"] == "warn"
            for gpu in gpus
        )
    return True


# What a real-time daemon shows in its first minutes, while the rules warm up.
CHECKS_NOW = {
    "training": _check_training_now,
    "thermal-throttle": _check_thermal_throttle_now,
    "fell-off-bus": _check_fell_off_bus_now,
    "no-nvml": _check_no_nvml,
}
# Seconds into each scenario when the daemon starts: the part worth looking at (fell-off-bus:
# 10 s before GPU 3 falls off, so that its XID 79 is read while it still answers).
STARTS = {"training": 120, "thermal-throttle": 150, "fell-off-bus": 50}


def _screenshot(tmp_path: Path, url: str, name: str) -> Counter[bytes]:
    """Screenshot the page into the artifacts; how many pixels have each colour."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{name}.png"
    screenshot.unlink(missing_ok=True)
    chromium(tmp_path, url, f"--screenshot={screenshot}", "--window-size=1400,1000")
    width, height, colours = png_pixels(screenshot)
    assert (width, height) == (1400, 1000)
    # Not blank: many colours (text, bars, chips), and not one colour all over.
    assert len(colours) > 50 and colours.most_common(1)[0][1] < 0.99 * width * height
    assert colours[SIMULATED_STRIPE] > 1000
    return colours


def _common(dom: str, hostname: str) -> list[Any]:
    """The checks every page passes; its cards."""
    assert re.search(rf'<span id="hostname">{re.escape(hostname)}</span>', dom)
    assert title(dom).startswith(f"SIMULATED {hostname} \u00b7 ")
    assert 'id="simulated"' in dom and "SIMULATED" in dom
    assert "<script src" not in dom and "<link" not in dom
    shown = cards(dom)
    assert summary(dom)["gpus"] == len(shown)
    return shown


@needs_chromium
@pytest.mark.parametrize("scenario", list(CHECKS_NOW))
def test_a_starting_daemon_shows_readings_alerts_and_warm_up_in_chromium(
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
        lambda: _settled_now(scenario, daemon.get("/api/v1/status").json()),
        timeout=60,
        what=f"the {scenario} page",
    )
    dom = chromium(tmp_path, daemon.url, "--dump-dom")
    CHECKS_NOW[scenario](dom, _common(dom, socket.gethostname()))

    colours = _screenshot(tmp_path, daemon.url, f"{scenario}-starting")
    if scenario == "fell-off-bus":
        assert colours[FAULT_CARD] > 10_000, "no red card for the lost GPU"
        assert colours[FAULT_RED] > 1000
    if scenario == "training":
        assert colours[FAULT_CARD] == 0 and colours[FAULT_RED] == 0


def _check_training(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["lost"] == 0 and summary(dom)["firing"] == 0
    assert 'id="warming-up"' not in dom
    for card in shown:
        assert (card.severity, card.verdict) == ("ok", "healthy"), card.html
        assert "<strong>Healthy</strong>" in card.html
        assert 'class="runbook"' not in card.html  # nothing to follow on a healthy GPU
        assert "(5-min mean)" in _text(card.html)


def _check_data_starved(dom: str, shown: list[Any]) -> None:
    for card in shown:
        assert (card.severity, card.verdict) == ("warning", "underutilized"), card.html
        assert 'data-bottleneck="input_starved"' in card.html
        assert 'class="runbook"' in card.html
        assert "GPUDataLoaderStarved" in card.html
        evidence = re.findall(r"<li>([^<]*)</li>", card.html.split('class="evidence"')[1])
        windowed = ("(5-min mean)", " 5-min mean)")
        assert evidence and all(line.endswith(windowed) or "GPU" in line for line in evidence)


def _check_thermal_throttle(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["warnings"] == 8
    for card in shown:
        assert card.severity == "warning"
        chip = re.search(r'data-bottleneck="thermal_throttled">([^<]*)', card.html)
        assert chip and "(5-min mean)" in chip.group(1), card.html
        assert 'href="' in card.html.split('data-bottleneck="thermal_throttled"')[1][:400]
        assert re.search(r'class="firing warn" data-alert="GPUThermalThrottling"', card.html)


def _check_fell_off_bus(dom: str, shown: list[Any]) -> None:
    assert summary(dom)["lost"] == 1
    lost = shown[0]  # worst first
    assert (lost.gpu, lost.severity, lost.verdict) == (3, "fault", "lost")
    assert "<strong>Lost</strong>" in lost.html and "FAULT" in lost.html
    assert 'data-xid="79"' in lost.html and "XID 79" in lost.html
    assert 'class="runbook"' in lost.html
    assert 'class="firing crit" data-alert="GPUFellOffBus"' in lost.html
    for card in shown[1:]:
        assert card.verdict == "healthy" or "GPUXidError" in card.html, card.html
    # The others by severity, then index: provisional verdicts may differ from GPU to GPU.
    ranks = [(SEVERITIES[card.severity][0], card.gpu) for card in shown[1:]]
    assert ranks == sorted(ranks)


def _check_a100_mig(dom: str, shown: list[Any]) -> None:
    assert [card.gpu for card in shown] == [0, 1]
    for card in shown:
        text = _text(card.html)
        # NVML has no whole-GPU utilization in MIG mode, and an A100 no GPM: the rules say so.
        assert (card.severity, card.verdict) == ("unknown", "unmeasured"), card.html
        assert "Unmeasured" in text and "SM activity n/a (no GPM)" in text
        assert "warming up" not in text.lower()
    assert shown[0].html.count("data-mig-instance=") == 7
    assert shown[0].html.count('data-bar="1g.10gb #') == 7
    assert shown[1].html.count("data-mig-instance=") == 3
    assert 'data-bar="3g.40gb #1 (now)"' in shown[1].html
    assert re.search(r"<b>36\.0 / 39\.0 GiB</b>", shown[1].html)  # its own memory


def _check_hung_collective(dom: str, shown: list[Any]) -> None:
    for card in shown:
        assert card.severity == "warning"
        assert 'data-bottleneck="hung"' in card.html and "GPUJobHung" in card.html
        verdict = card.html.split('<p class="verdict">')[1].split("</p>")[0]
        assert "healthy" not in _text(verdict).lower(), verdict


# What a node shows once the rules' windows are whole, and when (seconds into the scenario):
# thermal-throttle's clocks are held down from minute 2 to 5.
CHECKS = {
    "training": (_check_training, 420),
    "data-starved": (_check_data_starved, 420),
    "thermal-throttle": (_check_thermal_throttle, 360),
    "fell-off-bus": (_check_fell_off_bus, 420),
    "a100-mig": (_check_a100_mig, 420),
    "hung-collective": (_check_hung_collective, 420),
}


@needs_chromium
@pytest.mark.parametrize("scenario", list(CHECKS))
def test_the_recorded_verdicts_show_a_node_at_a_glance_in_chromium(
    tmp_path: Path, scenario: str
) -> None:
    check, seconds = CHECKS[scenario]
    node = SimulatedNode(scenario)
    try:
        node.run_until(seconds)
        with served(node.status) as url:
            dom = chromium(tmp_path, url, "--dump-dom")
            check(dom, _common(dom, "node"))
            colours = _screenshot(tmp_path, url, scenario)
    finally:
        node.close()
    if scenario == "fell-off-bus":
        assert colours[FAULT_CARD] > 10_000, "no red card for the lost GPU"
        assert colours[FAULT_RED] > 1000
    if scenario in ("training", "a100-mig"):
        assert colours[FAULT_CARD] == 0 and colours[FAULT_RED] == 0
        assert colours[WARNING_ORANGE] == 0
    if scenario in ("data-starved", "thermal-throttle", "hung-collective"):
        assert colours[WARNING_ORANGE] > 1000, "no orange cards for the GPUs that need a look"
