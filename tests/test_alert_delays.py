"""When each alert fires after its condition starts, measured, against docs/runbooks.md's table.

Every alert gets a simulated exporter (tests/alert_timelines.py) scraped every 15 s whose
condition starts 10 minutes in, after its windows have filled with healthy readings. promtool runs
them all against the shipped rule files, and the first firing of each must fall in the range that
docs/runbooks.md's "When each alert fires" gives: the table is what these timelines measure.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from alert_timelines import Expect, Exporter, Gauge, run_promtool, steps

from exporter.alerting import rules, thresholds
from exporter.alerting.thresholds import duration_seconds
from tools import RULES_DIR

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")

RUNBOOKS = RULES_DIR.parent / "docs" / "runbooks.md"
INTERVAL = 15
START = 600.0  # the condition starts here
END = int(START) + 40 * 60
GIB = 2**30


def before_after(before: float | None, after: float | None) -> Gauge:
    """A gauge: ``before`` until the condition starts, ``after`` from then (None: absent)."""
    return lambda t: before if t < START else after


def timelines() -> dict[str, tuple[Exporter, dict[str, str]]]:
    """Each alert's exporter, and the labels of the alert it raises beside the target's."""
    e: dict[str, tuple[Exporter, dict[str, str]]] = {}

    def gpu(name: str) -> dict[str, str]:
        return {"gpu": "0", "uuid": f"GPU-{name}"}

    def add(alert: str, exporter: Exporter, labels: dict[str, str] | None = None) -> None:
        e[alert] = (exporter, gpu(exporter.name) if labels is None else labels)

    add("GPUUtilizationLow", Exporter("low", steps((0, 0.9), (START, 0.25))))
    add("GPUUtilizationHigh", Exporter("high", steps((0, 0.5), (START, 0.99))))
    hung = Exporter("hung", steps((0, 0.5), (START, 1.0)), power=steps((0, 560), (START, 77)))
    add("GPUJobHung", hung)
    starved = Exporter(
        "starved", steps((0, 0.9), (START, 0.4)), idle=steps((0, 0.02), (START, 0.35))
    )
    add("GPUDataLoaderStarved", starved)
    bound = Exporter("bound", lambda t: 0.9)
    bound.counters = {
        bound.gpu("gpu_dram_active_seconds_total"): steps((0, 0.2), (START, 0.9)),
        bound.gpu("gpu_tensor_active_seconds_total"): lambda t: 0.05,
    }
    add("GPUMemoryBandwidthBound", bound)
    full = Exporter("full")
    full.gauges = {
        full.gpu("gpu_memory_used_bytes"): before_after(40 * GIB, 78 * GIB),
        full.gpu("gpu_memory_total_bytes"): lambda t: 80 * GIB,
    }
    add("GPUMemoryNearlyFull", full)
    uneven = Exporter("uneven", lambda t: 0.9)
    uneven.counters = {
        uneven.gpu("gpu_utilization_seconds_total", 1): steps((0, 0.9), (START, 0.3))
    }
    uneven.gauges = {uneven.gpu("gpu_processes", 1): lambda t: 1.0}
    add("GPULoadImbalance", uneven, {})
    pod = {"pod": "p", "namespace": "ns", "container": "c"}
    held = Exporter("held", steps((0, 0.5), (START, 0.01)))
    held.gauges = {held.gpu("gpu_pod_info", mig_instance="", **pod): lambda t: 1.0}
    add("GPUIdleAllocated", held, {**gpu("held"), **pod})
    mig = {"mig_instance": "1", "mig_profile": "3g.40gb"}
    slice_ = Exporter("slice")
    slice_.counters = {
        slice_.gpu("gpu_mig_sm_active_seconds_total", **mig): steps((0, 0.6), (START, 0.1))
    }
    slice_.gauges = {slice_.gpu("gpu_mig_memory_used_bytes", **mig): lambda t: 10.0 * GIB}
    add("GPUMIGUtilizationLow", slice_, {**gpu("slice"), **mig})
    for alert, name, reason in (
        ("GPUThermalThrottling", "thermal", "sw_thermal"),
        ("GPUPowerCapped", "capped", "sw_power_cap"),
        ("GPUHardwareSlowdown", "slowdown", "hw_slowdown"),
    ):
        exporter = Exporter(name)
        exporter.gauges = {
            exporter.gpu("gpu_clock_event_active", reason=reason): before_after(0, 1)
        }
        add(alert, exporter)
    hot = Exporter("hot")
    hot.gauges = {
        hot.gpu("gpu_temperature_celsius", sensor="gpu"): before_after(60, 88),
        hot.gpu("gpu_temperature_slowdown_threshold_celsius"): lambda t: 90.0,
    }
    # `ignoring (sensor)` in a one-to-one comparison leaves the sensor label out.
    add("GPUTemperatureHigh", hot)
    hbm = Exporter("hbm")
    hbm.gauges = {hbm.gpu("gpu_temperature_celsius", sensor="memory"): before_after(70, 90)}
    add("GPUMemoryTemperatureHigh", hbm, {**gpu("hbm"), "sensor": "memory"})
    link = Exporter("link", lambda t: 0.9)
    link.gauges = {
        link.gpu("gpu_pcie_link_generation"): before_after(5, 4),
        link.gpu("gpu_pcie_link_max_generation"): lambda t: 5.0,
        link.gpu("gpu_pcie_link_width"): lambda t: 16.0,
        link.gpu("gpu_pcie_link_max_width"): lambda t: 16.0,
    }
    add("GPUPCIeLinkDegraded", link)
    nvlink = Exporter("nvlink")
    nvlink.gauges = {nvlink.gpu("gpu_nvlink_link_down", link="3"): before_after(None, 1)}
    add("GPUNVLinkDown", nvlink, {**gpu("nvlink"), "link": "3"})
    for alert, name, xid in (
        ("GPUXidError", "xid", "79"),
        ("GPURecoveryActionRequired", "recovery", "154"),
    ):
        exporter = Exporter(name)
        exporter.gauges = {exporter.gpu("gpu_xid_errors_total", xid=xid): before_after(None, 1)}
        add(alert, exporter, {**gpu(name), "xid": xid})
    lost = Exporter("lost")
    lost.gauges = {lost.gpu("gpu_up"): before_after(1, 0)}
    add("GPUFellOffBus", lost, {"gpu": "0"})
    ecc = Exporter("ecc")
    errors = {"type": "uncorrected", "counter": "volatile"}
    ecc.gauges = {ecc.gpu("gpu_ecc_errors_total", **errors): before_after(0, 1)}
    add("GPUECCUncorrectable", ecc, {**gpu("ecc"), **errors})
    for alert, name, family in (
        ("GPURowRemapPending", "remap", "gpu_row_remap_pending"),
        ("GPURowRemapFailed", "remapfail", "gpu_row_remap_failed"),
    ):
        exporter = Exporter(name)
        exporter.gauges = {exporter.gpu(family): before_after(0, 1)}
        add(alert, exporter)
    gone = Exporter("gone")
    gone.gauges = {
        gone.gpu("gpu_up"): lambda t: 1.0,
        gone.gpu("gpu_up", 1): before_after(1, None),
        "gpuload_nvml_up": lambda t: 1.0,
    }
    add("GPUCountDropped", gone, {})
    add("GPUVanished", gone, {"gpu": "1", "uuid": "GPU-gone-1"})
    add("GPULoadExporterDown", Exporter("down", down=[(START, 10**6)]), {})
    unwatched = Exporter("unwatched")
    unwatched.gauges = {
        'kube_node_status_capacity{node="n9",resource="nvidia_com_gpu"}': before_after(None, 8)
    }
    add("GPULoadExporterAbsent", unwatched, {"node": "n9"})
    for alert, name, gauge, labels in (
        ("GPULoadCollectorFailing", "failing", 'gpuload_collector_success{collector="pcie"}', {}),
        ("GPULoadPodResourcesDown", "kubelet", "gpuload_kubernetes_pod_resources_up", {}),
        ("GPULoadNVMLDown", "nvml", "gpuload_nvml_up", {}),
    ):
        exporter = Exporter(name)
        exporter.gauges = {gauge: before_after(1, 0)}
        if alert == "GPULoadCollectorFailing":
            exporter.gauges["gpuload_nvml_up"] = lambda t: 1.0
            labels = {"collector": "pcie"}
        add(alert, exporter, labels)
    stale = Exporter("stale")
    stale.gauges = {stale.gpu("gpuload_gpu_stale"): before_after(0, 1)}
    add("GPULoadStale", stale)
    return e


def documented_delays() -> dict[str, tuple[float, float]]:
    """docs/runbooks.md's "When each alert fires": alert -> (earliest, latest) seconds."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    section = text.split("\n## When each alert fires\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for name, low, high in re.findall(
        r"^\| (GPU\w+) \| [^|]+ \| (\w+) to (\w+) \|", section, re.MULTILINE
    ):
        found[name] = (float(duration_seconds(low)), float(duration_seconds(high)))
    return found


def test_the_table_covers_every_alert() -> None:
    every = {
        rule["alert"]
        for document in rules.rule_files(thresholds.load()).values()
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert set(documented_delays()) == every == set(timelines())


def fired(alert: str, exporter: Exporter, labels: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The ALERTS selector of the alert the exporter raises, and that alert's full labels."""
    full = {
        "alertname": alert,
        "alertstate": "firing",
        "severity": thresholds.load().alert(alert).severity,
        "instance": exporter.instance,
        "job": "gpuload",
        **labels,
    }
    if alert == "GPULoadExporterAbsent":
        del full["instance"], full["job"]  # grouped by node alone
    matchers = ",".join(f'{k}="{v}"' for k, v in full.items() if k != "severity")
    return f"ALERTS{{{matchers}}}", full


# GPUIdleAllocated waits 30 minutes on a 5-minute mean; every other alert fires within 15.
LONG = {"GPUIdleAllocated"}


@pytest.mark.parametrize("long", [False, True], ids=["within 15m", "GPUIdleAllocated"])
def test_each_alert_fires_when_the_runbooks_say(tmp_path: Path, long: bool) -> None:
    delays = documented_delays()
    end = END if long else int(START) + 15 * 60
    expects: list[Expect] = []
    cases = {alert: case for alert, case in timelines().items() if (alert in LONG) == long}
    before = int(START) - INTERVAL  # the evaluations before the condition starts
    for alert, (exporter, labels) in cases.items():
        low, high = delays[alert]
        selector, full = fired(alert, exporter, labels)
        when = f"min_over_time(timestamp({selector})[{end}s:{INTERVAL}s]) - {START}"
        expects.append(
            Expect(
                f"{alert} fires {low:g} s to {high:g} s after its condition starts",
                f"({when} >= bool {low}) * ({when} <= bool {high})",
                (full,),
            )
        )
        expects.append(
            Expect(
                f"{alert} does not fire before its condition starts",
                f"count_over_time({selector}[{before}s] offset {end - before}s)",
            )
        )
    exporters = list({id(exporter): exporter for exporter, _ in cases.values()}.values())
    run_promtool(tmp_path, exporters, expects, INTERVAL, end=end)
