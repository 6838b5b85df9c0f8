"""Every dashboard query, run by a real Prometheus against real gpuload daemons.

One Prometheus (Debian's package) scrapes simulated nodes every second with the rule files and
the dashboards rendered from the shipped thresholds with a 20s window instead of 5m (the rules
record a window's rate once a node has been scraped for a whole window; recording rules evaluated
every second). Each panel target of each dashboard is expanded the way Grafana would for one node
at a time, sent to the HTTP API, and must succeed everywhere and return data exactly where that
node's GPUs have the signal (EXPECTED). The `data-starved` node is then looked at as an operator
would: the fleet overview's "in use but underutilized" count and the bottleneck view's names.
Some nodes get a `node` label, as the Helm chart's ServiceMonitor gives them; the others are
known by their instance, as a bare `gpuload serve` is: the `$node` variable lists both.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from helpers import Daemon, start_daemon, wait_until

from exporter.alerting import thresholds
from exporter.alerting.rules import recording_names, rule_files
from tools.dashboards.render import render

# The rules' and the dashboards' averaging window here: a whole one is scraped in seconds.
WINDOW = "20s"
TEST_THRESHOLDS = replace(thresholds.load(), window=WINDOW)
NAMES = recording_names(TEST_THRESHOLDS)

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(
        not PROMETHEUS, reason="needs Debian's prometheus (scripts/test installs it)"
    ),
    pytest.mark.engines,
]

# Scenario -> seconds into the scenario at which its daemon starts. legacy-v100 logs XID 48 on
# GPU 6 at 5 minutes: starting just before shows the XID panels with data.
SCENARIOS = {
    "h100-nvlink": 0,
    "a100-mig": 0,
    "h100-mig": 0,
    "legacy-v100": 292,
    "data-starved": 0,
}
ALL = frozenset(SCENARIOS)
NOT_MIG_ONLY = ALL - {"a100-mig"}
# The nodes scraped with a `node` label (the chart's relabelling); the others have none.
NODE_LABELS = {"h100-nvlink": "gpu-node-1", "h100-mig": "gpu-node-2", "data-starved": "gpu-node-3"}

# Grafana's built-in variables as the test expands them (1 s scrapes).
BUILTINS = {
    "$__rate_interval": "30s",
    "$__interval_ms": "5000",
    "$__interval": "5s",
    "$__range": "5m",
}

# (dashboard uid, panel title, refIds) -> the scenarios whose node must return data; every other
# node must return none, and no error. Targets not listed have data on every node. None: depends
# on when the 5m windows started (a state a GPU passed through), only checked for errors.
GPM = frozenset({"h100-nvlink", "h100-mig", "data-starved"})  # GPM; the MIG H100's parent too
UTILIZATION = ALL - {"a100-mig"}  # whole-GPU utilization: absent in MIG mode
IN_USE_UTILIZATION = frozenset({"h100-nvlink", "legacy-v100", "data-starved"})  # h100-mig's
# whole GPU is busy without a process or memory: not in use
FLEET, NODE, BOTTLENECKS = "gpuload-fleet", "gpuload-node", "gpuload-bottlenecks"
EFFICIENCY = "gpuload-efficiency"
NO_PODS: frozenset[str] = frozenset()  # the accounting of pods: these nodes have none
EXPECTED_TABLE: list[tuple[str, str, str, frozenset[str] | None]] = [
    (FLEET, "Utilization across nodes", "A", UTILIZATION),
    # GPUECCUncorrectable: the uncorrectable error's XID 48 is folded into it (health.FOLDS).
    (FLEET, "Firing GPU alerts", "A", frozenset({"legacy-v100"})),
    (
        FLEET,
        "Top underutilized GPUs (hours in use below the threshold, over the range)",
        "A",
        frozenset({"data-starved"}),
    ),
    (FLEET, f"Average utilization by node ({WINDOW})", "A", UTILIZATION),
    (NODE, f"Average utilization ({WINDOW})", "A", UTILIZATION),
    (NODE, "GPU utilization", "A", UTILIZATION),
    (NODE, "SM active", "A", GPM),
    (NODE, "Tensor active", "A", GPM),
    (NODE, "DRAM bandwidth used", "A", GPM),
    (NODE, f"Busy vs. working per GPU ({WINDOW} averages)", "A", UTILIZATION),
    (NODE, f"Busy vs. working per GPU ({WINDOW} averages)", "BCDE", GPM),
    (NODE, "Link state", "F", frozenset({"h100-nvlink"})),  # GPU 5's link 3 is down
    (NODE, "XID errors since the exporter started", "A", frozenset({"legacy-v100"})),
    (NODE, "ECC errors and memory repair", "CDE", ALL - {"legacy-v100"}),  # row remapping
    (NODE, "ECC errors and memory repair", "FG", frozenset({"legacy-v100"})),  # page retirement
    (NODE, "Processes by memory", "B", ALL - {"a100-mig", "h100-mig"}),
    (NODE, "MIG instances", "AB", frozenset({"a100-mig", "h100-mig"})),
    (NODE, "MIG instances", "CD", frozenset({"h100-mig"})),  # GPM per instance
    (NODE, "MIG memory used / total", "A", frozenset({"a100-mig", "h100-mig"})),
    (BOTTLENECKS, "In-use GPUs by bottleneck", "A", IN_USE_UTILIZATION),
    (BOTTLENECKS, "What limits each in-use GPU", "A", IN_USE_UTILIZATION),
    # starved, and whatever the busy nodes' first seconds looked like
    (BOTTLENECKS, "Bottlenecks over time", "A", None),
    (BOTTLENECKS, f"Utilization ({WINDOW} average)", "A", IN_USE_UTILIZATION),
    (BOTTLENECKS, f"Input: time fully idle ({WINDOW})", "A", IN_USE_UTILIZATION),
    (BOTTLENECKS, f"Memory bandwidth vs. busiest compute pipe ({WINDOW}, GPM)", "AB", GPM),
    (BOTTLENECKS, f"Behind the node's busiest GPU ({WINDOW})", "A", IN_USE_UTILIZATION),
    (EFFICIENCY, "Namespaces and owners by idle GPU-hours", "ABC", NO_PODS),
    (EFFICIENCY, "Allocated against used", "AB", NO_PODS),
    # The GPUs no pod holds, recorded once a minute: there once the group first ran.
    (EFFICIENCY, "Allocated against used", "C", None),
    (EFFICIENCY, "Pods that held idle GPUs longest", "A", NO_PODS),
]
EXPECTED = {
    (uid, title, ref): scenarios for uid, title, refs, scenarios in EXPECTED_TABLE for ref in refs
}


@dataclass
class Stack:
    prometheus: str
    instances: dict[str, str]  # scenario -> instance label
    keys: dict[str, str]  # scenario -> its value of the $node variable

    def query(self, expr: str, *, instant: bool = True) -> dict[str, Any]:
        if instant:
            response = requests.get(
                self.prometheus + "/api/v1/query", params={"query": expr}, timeout=10
            )
        else:
            end = time.time()
            response = requests.get(
                self.prometheus + "/api/v1/query_range",
                params={"query": expr, "start": end - 60, "end": end, "step": 2},
                timeout=10,
            )
        body: dict[str, Any] = response.json()
        assert body["status"] == "success", f"{body.get('error')}\n{expr}"
        return body

    def vector(self, expr: str) -> list[dict[str, Any]]:
        return list(self.query(expr)["data"]["result"])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def grafana_regex(value: str) -> str:
    """Escape a value as Grafana does for a Prometheus regex matcher."""
    return re.sub(r"([\\^$*+?.()|\[\]{}])", r"\\\\\1", value)


def expand(expr: str, variables: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **variables}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr.replace("$1", ""), expr
    return expr


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("prometheus")
    now = time.time()

    def start(scenario: str) -> Daemon:
        return start_daemon(
            "--simulate",
            scenario,
            "--collect.interval",
            "1s",
            "--sim.epoch",
            str(now - SCENARIOS[scenario]),
        )

    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        daemons = dict(zip(SCENARIOS, pool.map(start, SCENARIOS), strict=True))
    instances = {
        scenario: daemon.url.removeprefix("http://").rstrip("/")
        for scenario, daemon in daemons.items()
    }
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in _write_rules(folder)],
        "scrape_configs": [
            {
                "job_name": "gpuload",
                "static_configs": [
                    {
                        "targets": [address],
                        "labels": {"scenario": scenario}
                        | ({"node": NODE_LABELS[scenario]} if scenario in NODE_LABELS else {}),
                    }
                    for scenario, address in instances.items()
                ],
            }
        ],
    }
    config_file = folder / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    log = folder / "prometheus.log"
    assert PROMETHEUS is not None
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _ok(url + "/-/ready") or process.poll() is not None, what="prometheus")
        assert process.poll() is None, log.read_text()
        keys = {
            scenario: NODE_LABELS.get(scenario, address) for scenario, address in instances.items()
        }
        result = Stack(url, instances, keys)
        wait_until(lambda: _settled(result), timeout=60, what="recording rules with data")
        yield result
    finally:
        process.kill()
        process.wait(timeout=10)
        for daemon in daemons.values():
            daemon.process.kill()
            daemon.process.wait(timeout=10)


def _write_rules(folder: Path) -> list[Path]:
    written = []
    for name, content in rule_files(TEST_THRESHOLDS).items():
        written.append(folder / name)
        written[-1].write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return written


def _settled(stack: Stack) -> bool:
    """The starved node classified, the link rates and the legacy node's XID recorded."""
    checks = (
        f'count({NAMES["bottleneck"]}{{scenario="data-starved", bottleneck="input_starved"}}) == 8',
        f'count({NAMES["pcie_busy"]}{{scenario="legacy-v100"}}) > 0',
        f'count({NAMES["nvlink_busy"]}{{scenario="h100-nvlink"}}) > 0',
        'count(gpu_xid_errors_total{scenario="legacy-v100"}) > 0',
        f'count({NAMES["avg"]}{{scenario="data-starved"}} < 0.3) == 8',
        # The fleet rules, a group of their own, have caught up: every node with a utilization.
        f"count({NAMES['node_busy']}) == {len(UTILIZATION)}",
        # ...for several evaluations: a subquery at 5 s steps finds them.
        f"count(count_over_time({NAMES['state']}"
        '{scenario="data-starved", state="underutilized"}[30s]) >= 8) == 8',
        'ALERTS{scenario="legacy-v100", alertname="GPUECCUncorrectable", alertstate="firing"}',
    )
    return all(stack.vector(check) for check in checks)


def dashboards() -> dict[str, dict[str, Any]]:
    return {
        name.removesuffix(".json"): json.loads(text)
        for name, text in sorted(render(TEST_THRESHOLDS).items())
    }


def targets() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every (dashboard uid, panel title, target) of the committed dashboards."""
    for board in dashboards().values():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield board["uid"], panel["title"], target


def results(stack: Stack, target: dict[str, Any], variables: dict[str, str]) -> list[Any]:
    body = stack.query(expand(target["expr"], variables), instant=target["instant"])
    return list(body["data"]["result"])


def node(stack: Stack, scenario: str) -> dict[str, str]:
    """The variables of a dashboard looking at one node: all its GPUs, no pod filter."""
    return {
        "$node": grafana_regex(stack.keys[scenario]),
        "$gpu": ".*",
        "$namespace": ".*",
        "$pod": ".*",
    }


def test_every_query_succeeds_and_has_data_where_its_signal_exists(stack: Stack) -> None:
    checked = 0
    wrong = []
    for uid, title, target in targets():
        expected = EXPECTED.get((uid, title, target["refId"]), ALL)
        everything = {"$node": ".+", "$gpu": ".*", "$namespace": ".*", "$pod": ".*"}
        results(stack, target, everything)
        for scenario in SCENARIOS:
            found = results(stack, target, node(stack, scenario))
            checked += 1
            if expected is not None and bool(found) != (scenario in expected):
                wrong.append(f"{uid} / {title} / {target['refId']} on {scenario}: {found}")
            # Whatever keeps its labels is the node's, under its key: node label or instance.
            nodes = {series["metric"].get("node", "") for series in found} - {""}
            if nodes - {stack.keys[scenario]}:
                wrong.append(f"{uid} / {title} / {target['refId']} on {scenario}: {nodes}")
    assert not wrong, "\n".join(wrong)
    assert checked > 100


def test_template_variable_queries(stack: Stack) -> None:
    """query_result() as Grafana runs it: an instant query, each value taken by the regex."""
    for board in dashboards().values():
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = re.fullmatch(r"query_result\((.+)\)", variable["definition"], re.DOTALL)
            assert match, variable["definition"]
            found = stack.vector(expand(match.group(1), {"$node": ".+", "$namespace": ".*"}))
            capture = re.compile(variable["regex"].strip("/"))
            lines = [
                "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(s["metric"].items())) + "}"
                for s in found
            ]
            values = {m.group(1) for line in lines if (m := capture.search(line))}
            if variable["name"] == "node":
                # The node label where there is one, else the instance: one key per node.
                assert values == set(stack.keys.values())
                assert len(values) == len(SCENARIOS)
            elif variable["name"] == "gpu":
                assert values == {str(index) for index in range(8)}
            else:  # gpu_pod_info does not exist yet: empty, and "All" filters nothing
                assert values == set()


def panel(uid: str, title: str) -> dict[str, Any]:
    for board in dashboards().values():
        if board["uid"] != uid:
            continue
        for item in board["panels"]:
            if item["title"] == title:
                return item
    raise AssertionError(f"no panel {title!r} in {uid}")


def test_operator_sees_the_starved_gpus_underutilized_and_input_starved(stack: Stack) -> None:
    low = thresholds.load().alert("GPUUtilizationLow").number("below")
    variables = node(stack, "data-starved")
    underutilized = panel("gpuload-fleet", f"In use, underutilized (< {low * 100:g}%)")
    result = stack.vector(expand(underutilized["targets"][0]["expr"], variables))
    assert [float(sample["value"][1]) for sample in result] == [8.0]

    limits = panel("gpuload-bottlenecks", "What limits each in-use GPU")
    rows = stack.vector(expand(limits["targets"][0]["expr"], variables))
    by_gpu: dict[str, set[str]] = {}
    for row in rows:
        by_gpu.setdefault(row["metric"]["gpu"], set()).add(row["metric"]["bottleneck"])
        assert row["metric"]["name"] == "NVIDIA H100 80GB HBM3"
        # The Node column, and its link to the node detail, carry the node's key.
        assert row["metric"]["node"] == NODE_LABELS["data-starved"]
    assert sorted(by_gpu) == [str(index) for index in range(8)]
    for bottlenecks in by_gpu.values():
        assert "input_starved" in bottlenecks
        assert not bottlenecks & {"none", "underutilized"}
    starved_rows = [row for row in rows if row["metric"]["bottleneck"] == "input_starved"]
    runbook = thresholds.load().runbook_url("GPUDataLoaderStarved")
    assert {row["metric"]["runbook_url"] for row in starved_rows} == {runbook}
    # The table shows the class by its name on screen.
    mappings = [
        prop["value"]
        for override in limits["fieldConfig"]["overrides"]
        if override["matcher"]["options"] == "Bottleneck"
        for prop in override["properties"]
        if prop["id"] == "mappings"
    ]
    assert mappings[0][0]["options"]["input_starved"]["text"] == "input-starved"
