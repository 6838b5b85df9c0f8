"""The fleet recipes of docs/fleet.md, run with the engines they name.

Three simulated nodes (a training job, an idle node, a job starved by its data loader) are
scraped by:

- a Prometheus agent with examples/fleet/prometheus-agent.yml, remote-writing to VictoriaMetrics,
  the rules evaluated by vmalert: every command as docs/fleet.md gives it, run as written but for
  the addresses, the data folders and the intervals;
- a Prometheus server over the same targets with the same rules: the reference;
- a global Prometheus federating from the reference with examples/fleet/prometheus-global.yml.

Each fleet panel must give VictoriaMetrics' answer equal to the reference's, and no panel may be
empty on the global Prometheus. The rules and the dashboard are rendered from the shipped
thresholds with 1-minute windows (names included: `gpu:gpu_state:1m`), so that every GPU is
measured within minutes; scrapes and evaluations every 5 s. The lag of VictoriaMetrics behind the
reference is printed, not asserted (docs/fleet.md gives it at the documented settings; it
depends on the machine).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from helpers import ROOT, answers, free_port, run_prometheus, start_daemon, wait_until
from relay_helpers import FakeTarget
from test_helm_chart import CHART, render_objects, the

from bench import fleet_panels
from bench.fleet_panels import TimeRange
from exporter.alerting.thresholds import load
from tools.dashboards import fleet as fleet_dashboard
from tools.render_rules import render

pytestmark = [
    pytest.mark.skipif(
        not all(map(shutil.which, ("prometheus", "victoria-metrics", "vmalert"))),
        reason="needs Debian's prometheus and victoria-metrics (scripts/test installs them)",
    ),
    pytest.mark.engines,
]

DOC = ROOT / "docs" / "fleet.md"
HEADING = "## The fleet on VictoriaMetrics"
EXAMPLES = ROOT / "examples" / "fleet"
SCENARIOS = ("training", "idle", "data-starved")
INTERVAL = "5s"
# The documented addresses, replaced by the test's own.
VICTORIA_METRICS = "http://victoria-metrics:8428"
ALERTMANAGER = "http://alertmanager:9093"
# The labels the fleet panels show.
SHOWN = {"__name__", "state", "node", "gpu", "uuid", "alertname", "alertstate", "severity"}


def short_windows(folder: Path) -> Path:
    """The shipped thresholds with 1-minute windows and 20 s `for:`, written to `folder`."""
    text = (ROOT / "alert_rules" / "thresholds.yaml").read_text()
    for pattern, replacement in (
        (r"(?m)^window: 5m$", "window: 1m"),
        (r"(?m)^short_window: 1m$", "short_window: 20s"),
        (r"(?m)^gap_tolerance: 3m$", "gap_tolerance: 30s"),
        (r"for: 5m\b", "for: 20s"),
    ):
        text, count = re.subn(pattern, replacement, text)
        assert count, f"alert_rules/thresholds.yaml has no {pattern!r} any more"
    path = folder / "thresholds.yaml"
    path.write_text(text)
    return path


def recipe(heading: str) -> list[list[str]]:
    """The commands of the first ```sh block under `heading` in docs/fleet.md, comments left out."""
    text = DOC.read_text()
    start = text.index(f"\n{heading}\n")
    block = re.search(r"```sh\n(.*?)```", text[start:], re.DOTALL)
    assert block, f"docs/fleet.md: no ```sh block under {heading!r}"
    joined = re.sub(r"\\\n\s*", " ", block.group(1))
    return [
        shlex.split(line)
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def with_flags(command: list[str], values: dict[str, str]) -> list[str]:
    """`command` with each flag named in `values` given that value (added where absent)."""
    wanted = dict(values)
    out = []
    for word in command:
        name = word.lstrip("-").split("=", 1)[0]
        if name in wanted:
            dashes = word[: len(word) - len(word.lstrip("-"))]
            out.append(f"{dashes}{name}={wanted.pop(name)}")
        else:
            out.append(word)
    dashes = "--" if command[0] == "prometheus" else "-"
    return out + [f"{dashes}{name}={value}" for name, value in wanted.items()]


class Engine:
    """The query API of a Prometheus or of VictoriaMetrics."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str, at: float) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query at `at`: the labels a fleet panel shows -> value (no result cache).

        vmalert's ALERTS carry labels of its own (the group's): only those both engines give
        are kept.
        """
        params = {"query": expr, "time": f"{at:.3f}", "nocache": "1"}
        body = urllib.parse.urlencode(params).encode()
        with urllib.request.urlopen(self.url + "/api/v1/query", data=body, timeout=60) as answer:
            data = json.load(answer)
        assert data["status"] == "success", (expr, data)
        return {
            tuple(sorted((k, v) for k, v in item["metric"].items() if k in SHOWN)): float(
                item["value"][1]
            )
            for item in data["data"]["result"]
        }

    def states(self, at: float) -> dict[str, float]:
        """GPUs per fleet state, as the fleet dashboard's state panel counts them."""
        counts = self.query("sum by (state) (node:gpu_state:count)", at)
        return {dict(labels)["state"]: value for labels, value in counts.items()}


@pytest.fixture(scope="module")
def chart_pod() -> tuple[dict[str, str], str]:
    """The exporter pod's labels and its metrics port name, from the chart's default render."""
    with helm.Chart.load(CHART) as chart:
        daemonset = the(render_objects(chart, {}), "DaemonSet")
    template = daemonset["spec"]["template"]
    (exporter,) = [c for c in template["spec"]["containers"] if c["name"] == "exporter"]
    (port,) = [p["name"] for p in exporter["ports"] if p["name"] == "metrics"]
    return template["metadata"]["labels"], port


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, chart_pod: tuple[dict[str, str], str]
) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("fleet")
    thresholds = load(short_windows(folder))
    (folder / "alert_rules").mkdir()
    for name, text in render(thresholds).items():
        (folder / "alert_rules" / name).write_text(text)
    started: list[subprocess.Popen[str]] = []
    start = start_in(started, folder)
    exporters = [start_daemon("--simulate", scenario) for scenario in SCENARIOS]
    # Alertmanager's stand-in: it keeps what vmalert posts.
    notifier = FakeTarget()
    try:
        # Each simulated node is a pod that Kubernetes service discovery would find: the labels
        # the chart gives the exporter pod, its port's name, the node it runs on.
        labels, port = chart_pod
        meta = {
            f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
            for k, v in labels.items()
        }
        targets = [
            {
                "targets": [exporter.url.removeprefix("http://").rstrip("/")],
                "labels": {
                    **meta,
                    "__meta_kubernetes_pod_container_port_name": port,
                    "__meta_kubernetes_pod_node_name": f"gpu-node-{index + 1}",
                },
            }
            for index, exporter in enumerate(exporters)
        ]
        vm_port = free_port()
        vm_url = f"http://127.0.0.1:{vm_port}"

        def local(word: str) -> str:
            return word.replace(VICTORIA_METRICS, vm_url).replace(ALERTMANAGER, notifier.url)

        agent = yaml.safe_load((EXAMPLES / "prometheus-agent.yml").read_text())
        agent["global"]["scrape_interval"] = INTERVAL
        agent["global"]["scrape_timeout"] = "4s"
        (job,) = agent["scrape_configs"]
        del job["kubernetes_sd_configs"]
        job["static_configs"] = targets
        for remote in agent["remote_write"]:
            remote["url"] = local(remote["url"])
        (folder / "examples" / "fleet").mkdir(parents=True)
        (folder / "examples" / "fleet" / "prometheus-agent.yml").write_text(yaml.safe_dump(agent))

        commands = [[local(word) for word in command] for command in recipe(HEADING)]
        programs = [command[0] for command in commands]
        assert programs == ["victoria-metrics", "prometheus", "sed", "vmalert"], programs
        store, scraper, strip, rules = commands
        start(
            *with_flags(
                store, {"storageDataPath": "vm-data", "httpListenAddr": f"127.0.0.1:{vm_port}"}
            ),
            log=folder / "victoria-metrics.log",
        )
        wait_until(lambda: answers(vm_url + "/health"), timeout=60, what="victoria-metrics")
        agent_port = free_port()
        start(
            *with_flags(
                scraper,
                {
                    "storage.agent.path": "agent-data",
                    "web.listen-address": f"127.0.0.1:{agent_port}",
                },
            ),
            log=folder / "agent.log",
        )
        wait_until(
            lambda: answers(f"http://127.0.0.1:{agent_port}/-/ready"), timeout=60, what="agent"
        )
        assert strip[-2] == ">", strip  # sed ... > FILE
        with (folder / strip[-1]).open("w") as stripped:
            subprocess.run(strip[:-2], cwd=folder, stdout=stripped, check=True)
        vmalert_port = free_port()
        vmalert = start(
            *with_flags(
                rules,
                {"evaluationInterval": INTERVAL, "httpListenAddr": f"127.0.0.1:{vmalert_port}"},
            ),
            log=folder / "vmalert.log",
        )
        wait_until(
            lambda: (
                answers(f"http://127.0.0.1:{vmalert_port}/health") or vmalert.poll() is not None
            ),
            timeout=60,
            what="vmalert",
        )
        assert vmalert.poll() is None, (folder / "vmalert.log").read_text()[-3000:]

        reference_folder = folder / "reference"
        reference_folder.mkdir()
        reference = run_prometheus(
            start,
            reference_folder,
            {
                "global": {
                    "scrape_interval": INTERVAL,
                    "scrape_timeout": "4s",
                    "evaluation_interval": INTERVAL,
                },
                "rule_files": [str(p) for p in sorted((folder / "alert_rules").glob("*.yml"))],
                "scrape_configs": [job],
            },
        )
        federation = yaml.safe_load((EXAMPLES / "prometheus-global.yml").read_text())
        federation["global"] = {"scrape_interval": INTERVAL, "scrape_timeout": "4s"}
        (federate,) = federation["scrape_configs"]
        federate["static_configs"] = [{"targets": [reference.removeprefix("http://")]}]
        global_folder = folder / "global"
        global_folder.mkdir()
        federated = run_prometheus(start, global_folder, federation)
        yield {
            "vm": Engine(vm_url),
            "reference": Engine(reference),
            "global": Engine(federated),
            "notifier": notifier,
            "thresholds": thresholds,
            "nodes": len(exporters),
            "gpus": 8 * len(exporters),
        }
    finally:
        notifier.close()
        for process in started:
            process.kill()
            process.wait(timeout=10)
        for exporter in exporters:
            exporter.stop()


def start_in(started: list[subprocess.Popen[str]], folder: Path) -> Callable[..., Any]:
    """Start an engine in `folder`, its output in `log`; the fixture stops every one `started`.

    The same signature as the `processes` fixture's, so helpers.run_prometheus takes it too.
    """

    def start(*command: str, log: Path) -> subprocess.Popen[str]:
        with log.open("w") as output:
            process = subprocess.Popen(
                command, cwd=folder, stdout=output, stderr=subprocess.STDOUT, text=True
            )
        started.append(process)
        return process

    return start


def measured(engine: Engine, gpus: int) -> bool:
    """Every GPU counted in a state, none of them unmeasured."""
    states = engine.states(time.time())
    return sum(states.values()) == gpus and not states.get("unmeasured")


def test_victoria_metrics_and_vmalert_agree_with_prometheus_on_every_fleet_panel(
    fleet: dict[str, Any],
) -> None:
    vm, reference = fleet["vm"], fleet["reference"]
    gpus = fleet["gpus"]
    started = time.time()
    wait_until(lambda: measured(reference, gpus), timeout=600, what="every GPU measured")
    reference_at = time.time() - started
    wait_until(lambda: measured(vm, gpus), timeout=600, what="every GPU measured in vmalert")
    print(
        f"every GPU measured: Prometheus after {reference_at:.0f} s, "
        f"VictoriaMetrics with vmalert after {time.time() - started:.0f} s"
    )
    # The three nodes are in three different states, steadily: both engines count each alike
    # (asked 10 s back: what VictoriaMetrics shows lags by its -search.latencyOffset, 5 s).
    wait_until(
        lambda: vm.states(time.time() - 10) == reference.states(time.time() - 10),
        timeout=120,
        what="the same count in each state",
    )
    assert len(reference.states(time.time() - 10)) == 3, reference.states(time.time() - 10)

    # Every panel of the fleet dashboard (rendered with the same windows), as Grafana asks it,
    # answers the same series, with the same values within 5 % (each engine's rates are over its
    # own scrapes of the simulated GPUs). A sum over the dashboard's range counts evaluations
    # since a state began, which vmalert makes later: the series only.
    board = fleet_dashboard.build(fleet["thresholds"])
    variables = fleet_panels.all_values(board)
    time_range = TimeRange(3600, 5)

    def agree() -> list[str]:
        at = time.time() - 10
        differing = []
        for panel in fleet_panels.panels(board):
            for target in panel.targets:
                expr = fleet_panels.expand(target.expr, variables, time_range)
                ours, theirs = vm.query(expr, at), reference.query(expr, at)
                over_range = "_over_time(" in expr
                if ours.keys() != theirs.keys() or any(
                    abs(ours[key] - theirs[key]) > 0.05 * max(abs(theirs[key]), 1)
                    for key in theirs
                    if not over_range
                ):
                    differing.append(f"{panel.title}: {expr}\n  vm {ours}\n  prometheus {theirs}")
        return differing

    wait_until(lambda: not agree(), timeout=300, what="the same answer to every panel")
    assert not agree()
    # vmalert sent the alerts the reference has firing to the notifier the doc names.
    firing = reference.query('count by (alertname) (ALERTS{alertstate="firing"})', time.time())
    assert firing
    names = {dict(labels)["alertname"] for labels in firing}
    notifier = fleet["notifier"]

    def notified() -> set[str]:
        return {alert["labels"]["alertname"] for body in notifier.bodies() for alert in body}

    wait_until(lambda: names <= notified(), timeout=120, what="notifications")


def test_federating_the_documented_series_leaves_no_fleet_panel_empty(
    fleet: dict[str, Any],
) -> None:
    reference, federated = fleet["reference"], fleet["global"]
    wait_until(lambda: measured(reference, fleet["gpus"]), timeout=600, what="every GPU measured")
    wait_until(lambda: measured(federated, fleet["gpus"]), timeout=300, what="federated states")
    board = fleet_dashboard.build(fleet["thresholds"])
    variables = fleet_panels.all_values(board)
    time_range = TimeRange(3600, 5)

    def empty() -> list[str]:
        return [
            panel.title
            for panel in fleet_panels.panels(board)
            for target in panel.targets
            if not federated.query(
                fleet_panels.expand(target.expr, variables, time_range), time.time()
            )
        ]

    wait_until(lambda: not empty(), timeout=120, what="every fleet panel answered")
    # What federation holds: per node, its recordings (a count per state it has, busy, power,
    # power limit: at most 6 + 3); per GPU, its state; and the firing alerts.
    now = time.time()
    recorded = federated.query('count({__name__=~"node:gpu_.*|gpu:gpu_state:.*"})', now)
    assert list(recorded.values()) <= [fleet["nodes"] * 9 + fleet["gpus"]], recorded
