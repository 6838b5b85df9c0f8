"""The soak, shortened: scripts/soak for 42 s with a fault every 5 s and a relay kill every 5 s.

Each fault lasts a fifth of the spacing: a second, so that a loaded machine's late collection
cycle still sees it.

The full run (`scripts/soak`, 10 minutes, a fault a minute) gives the figures in
docs/reliability.md; this one proves in the suite that the same machinery holds: every fault
seen and survived, the exporter up, its thread count bounded, no acknowledged notification lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

# The most threads the exporter may have: one collection worker per GPU (16), the main thread
# (which runs the cycles), the HTTP server's accepting thread, the deadlines of the connections
# it serves, the XID event thread, the scrape's connection thread, and the thread of the scrape
# before it: the scraper opens its next connection as soon as it has read an answer, while the
# server's side of the last one may still be closing (on a loaded machine, often). A hung call
# holds its GPU's worker without a new one being started; a pile-up would break the bound within
# a fault or two.
MAX_THREADS = 16 + 6


@pytest.mark.engines
def test_short_soak_loses_nothing_and_survives_every_fault(tmp_path: Path) -> None:
    figures = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "soak"),
            "--minutes",
            "0.7",
            "--fault-spacing",
            "5",
            "--kill-spacing",
            "5",
            "--interval",
            "0.25",
            "--json",
            str(figures),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    print(result.stdout)
    soak = json.loads(figures.read_text())
    assert soak["exporter_alive"] and soak["relay_alive"], result.stderr
    assert soak["scrape_failures"] == 0
    # How many scrapes, notifications and relay restarts fit in the 42 s depends on how fast
    # the machine is; that each happened does not. A fault shorter than a late scrape is seen
    # by the error counter it raised.
    assert soak["scrapes"] > 0
    assert soak["faults_injected"] == 7
    assert soak["faults_survived"] == soak["faults_injected"], soak["faults"]
    assert soak["threads_max"] <= MAX_THREADS
    assert soak["relay_kills"] >= 1
    assert soak["accepted"] > 0
    assert soak["lost"] == 0
    assert soak["delivered"] == soak["accepted"]
    assert result.returncode == 0, result.stdout
