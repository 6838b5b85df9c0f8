"""The golden files: the real daemon's /metrics on pinned scenarios, less what varies by run.

Each golden file ``tests/golden/metrics-NAME.txt`` is what ``gpuload serve --simulate`` serves
for one pinned scenario (and metrics profile), with the non-deterministic families dropped by
one regex. `scrape` starts the daemon and returns what it serves once it has settled;
``tests/test_golden.py`` diffs that against the committed files, and ``scripts/regenerate``
rewrites them with it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import requests

from tools import ROOT
from tools.kubelet import mig_node_kubelet, stop_and_remove

GOLDEN_DIR = ROOT / "tests" / "golden"
# Scenario -> the pinned scenario time to scrape at (after each scenario's events).
SCENARIOS = {
    "mixed": 600,
    "h100-nvlink": 300,
    "memory-bound": 300,
    "a100-mig": 300,
    "h100-mig": 300,
    "h200-mig": 300,
    "legacy-v100": 300,
    "fell-off-bus": 120,
    "ecc-remap": 120,
    # Before the CronJob's pod ends at 6 minutes: every way a GPU reaches a pod, shown at once.
    "pods": 300,
}
# Golden files of other metrics profiles (exporter/collectors/profiles.py): name -> (scenario,
# profile). `full` with NVLink link by link shows every family there is.
PROFILES = {
    "h100-nvlink-full": ("h100-nvlink", "full"),
    "h100-mig-full": ("h100-mig", "full"),
    "h100-nvlink-minimal": ("h100-nvlink", "minimal"),
}
# Every golden file's name, as in metrics-NAME.txt.
NAMES = sorted([*SCENARIOS, *PROFILES])
# Scenarios whose MIG devices a fake kubelet allocates to pods, so that gpu_pod_info shows.
KUBELET_SCENARIOS = {"a100-mig"}
SEED = 7

# The only families that differ between two runs of the same pinned scenario:
# wall-clock timestamps, durations and the process's own resource use, and the PCIe byte
# counters, which GPUs without NVML's byte counters integrate over wall-clock time.
NON_DETERMINISTIC = re.compile(
    r"^(# (HELP|TYPE) )?(process_|python_gc_|python_info"
    r"|gpuload_collector_duration_seconds"
    r"|gpu_pcie_transmit_bytes_total|gpu_pcie_receive_bytes_total"
    r"|gpuload_collector_last_success_timestamp_seconds|gpuload_last_collection_timestamp_seconds"
    r"|gpuload_collection_duration_seconds)"
)

# Seconds between two polls of the daemon while it starts and while its output settles.
_POLL_SECONDS = 0.1
_LAST_COLLECTION = re.compile(r"^gpuload_last_collection_timestamp_seconds (\S+)$", re.M)
_LISTENING = re.compile(r"listening on (https?://\S+/)")


def path(name: str) -> Path:
    """The golden file of scenario (or profile golden) `name`."""
    return GOLDEN_DIR / f"metrics-{name}.txt"


def deterministic(text: str) -> str:
    """An exposition without the families that differ between two runs: a golden file's text."""
    return "".join(
        line for line in text.splitlines(keepends=True) if not NON_DETERMINISTIC.match(line)
    )


def expected_files() -> dict[Path, str]:
    """Every golden file and what the daemon serves for it now."""
    return {path(name): deterministic(scrape(name)) for name in NAMES}


def scrape(name: str) -> str:
    """Start the daemon on golden `name`'s pinned scenario; return its settled /metrics."""
    scenario, profile = PROFILES.get(name, (name, "default"))
    with ExitStack() as stack:
        config: list[str] = []
        if scenario in KUBELET_SCENARIOS:
            kubelet, config_path = mig_node_kubelet(scenario, seed=SEED)
            stack.callback(stop_and_remove, kubelet)
            config = ["--config", str(config_path)]
        url = stack.enter_context(
            serving(
                "--simulate",
                scenario,
                "--sim.time",
                str(SCENARIOS[scenario]),
                "--sim.seed",
                str(SEED),
                "--collect.interval",
                "200ms",
                "--metrics.profile",
                profile,
                *config,
                env={"GPULOAD_COLLECTORS_NVLINK_PER_LINK": str(profile == "full").lower()},
            )
        )
        return settled_scrape(url + "metrics")


@contextmanager
def serving(*args: str, env: dict[str, str]) -> Iterator[str]:
    """Run ``gpuload serve ARGS`` on a free port of 127.0.0.1; yield its URL once it is ready.

    Only `env` reaches it of the GPULOAD_ environment, so the caller's settings change nothing.
    """
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULOAD_")}
    environment.update(env, PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "exporter", "serve", "--web.listen-address", "127.0.0.1:0"]
    process = subprocess.Popen(
        [*command, *args],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = listening_url(process)
        _wait_ready(url)
        yield url
    finally:
        process.kill()
        process.wait(timeout=30)


def listening_url(process: subprocess.Popen[str], timeout: float = 30) -> str:
    """The URL a starting ``gpuload serve`` says it listens on (its stderr piped).

    Its log is drained on in a thread, so the daemon never blocks on a full pipe.
    """
    found: list[str] = []
    log: list[str] = []
    seen = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            match = _LISTENING.search(line)
            if match and not found:
                found.append(match.group(1))
                seen.set()
        seen.set()

    threading.Thread(target=drain, daemon=True).start()
    if not seen.wait(timeout=timeout) or not found:
        raise RuntimeError("gpuload serve did not start:\n" + "".join(log))
    return found[0]


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if requests.get(url + "readyz", timeout=10).status_code == 200:
            return
        time.sleep(_POLL_SECONDS)
    raise RuntimeError(f"{url}readyz did not answer 200")


def settled_scrape(metrics_url: str) -> str:
    """Scrape until three cycles in a row give the same output: events and lost GPUs seen.

    With the scenario clock pinned nothing is rescheduled (retries, slow reads follow it), so
    the output settles whatever the machine's speed; scrapes of one cycle count once.
    """
    previous, cycle, agreeing = "", "", 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = requests.get(metrics_url, timeout=10).text
        completed = _LAST_COLLECTION.search(text)
        if completed and completed.group(1) != cycle:
            cycle = completed.group(1)
            agreeing = agreeing + 1 if deterministic(text) == deterministic(previous) else 0
            if agreeing == 2:
                return text
            previous = text
        time.sleep(_POLL_SECONDS)
    raise RuntimeError(f"{metrics_url} did not settle")
