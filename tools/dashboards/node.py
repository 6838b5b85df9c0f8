"""The GPU node detail: every signal of the GPUs of one node, side by side.

Utilization sits next to the GPM profiling activity (SM, tensor, DRAM) so that "100% busy but
slow" shows. Each is the rate of its counter of seconds (``gpu_utilization_seconds_total``,
``gpu_sm_active_seconds_total``, ...) over each point's interval, the exact mean over it, or
the recorded rate over the rules' window; never the last second's ratio. GPM, MIG, NVLink, row
remapping and page retirement exist on some GPUs only, and their panels show "no data" elsewhere.
"""

from __future__ import annotations

import json

from exporter.alerting.thresholds import Thresholds
from tools.dashboards.fleet import utilization_steps
from tools.dashboards.grafana import (
    Field,
    Json,
    Layout,
    Query,
    Steps,
    bargauge,
    dashboard,
    dashed,
    gauge,
    override,
    stat,
    state_timeline,
    table,
    timeseries,
)
from tools.dashboards.queries import Scope, percent, variables

UID = "gpuload-node"
GPM = "GPM profiling metric (Hopper and newer): no data on older GPUs."
RATIO = Field("percentunit", Steps("green"), min=0, max=1)


def build(thresholds: Thresholds) -> Json:
    """Return the node detail dashboard."""
    scope = Scope(thresholds, gpu_variable=True)
    names = scope.names
    rate = scope.rate
    window = thresholds.window
    full = thresholds.alert("GPUMemoryNearlyFull").number("used_above")
    link_busy = thresholds.bottlenecks.link_busy_above
    fallback = thresholds.alert("GPUTemperatureHigh").number("fallback_celsius")
    utilization = Field("percentunit", utilization_steps(thresholds), min=0, max=1)
    memory_steps = Steps("green", ((full, "red"),))
    layout = Layout()

    layout.add(
        stat(
            "GPUs",
            "GPUs gpuload reports on this node.",
            Query(f"count({scope.gpus('gpu_up')}) or vector(0)", instant=True),
            Field("short", Steps("blue"), decimals=0),
        ),
        stat(
            "In use",
            "GPUs with a process or memory in use above the floor.",
            Query(f"count({scope.gpus(names['in_use'])}) or vector(0)", instant=True),
            Field("short", Steps("blue"), decimals=0),
        ),
        gauge(
            f"Average utilization ({window})",
            f"Mean of the selected GPUs' {window} average utilization (a GPU in MIG mode: its"
            " instances' SM activity, with GPM).",
            Query(f"avg({scope.gpus(names['busy'])})", instant=True),
            utilization,
        ),
        stat(
            "Power draw",
            "Power drawn by the selected GPUs together.",
            Query(f"sum({scope.gpus('gpu_power_usage_watts')})", instant=True),
            Field("watt", Steps("green")),
        ),
        stat(
            "Lost GPUs",
            "GPUs that answer 'GPU is lost' (gpu_up == 0).",
            Query(
                f"count({scope.pods(scope.select('gpu_up') + ' == 0')}) or vector(0)", instant=True
            ),
            Field("short", Steps("green", ((1, "red"),)), decimals=0),
        ),
        stat(
            "Driver",
            "NVIDIA driver version (gpuload_driver_info).",
            Query(scope.node("gpuload_driver_info"), instant=True, table=True),
            Field("none", Steps("text")),
            text_field="driver_version",
        ),
    )

    layout.row("Busy vs. actually working")
    layout.add(
        timeseries(
            "GPU utilization",
            "Fraction of time a kernel was running (NVML), over each point's interval: every"
            " NVML sample counts (rate of gpu_utilization_seconds_total). It says a kernel ran,"
            " not how much of the GPU it used; dashed: the"
            f" {percent(utilization.steps.steps[0][0])} and"
            f" {percent(utilization.steps.steps[1][0])} thresholds.",
            [Query(rate("gpu_utilization_seconds_total"), legend="GPU {{gpu}}")],
            utilization,
            width=6,
            threshold_lines=True,
        ),
    )
    for title, metric, what in (
        (
            "SM active",
            "gpu_sm_active_seconds_total",
            "Fraction of time the SMs had a resident warp.",
        ),
        (
            "Tensor active",
            "gpu_tensor_active_seconds_total",
            "Fraction of time the tensor cores worked.",
        ),
        (
            "DRAM bandwidth used",
            "gpu_dram_active_seconds_total",
            "Memory bandwidth used against peak; high DRAM with low SM means memory-bound.",
        ),
    ):
        layout.add(
            timeseries(
                title,
                f"{what} {GPM}",
                [Query(rate(metric), legend="GPU {{gpu}}")],
                RATIO,
                width=6,
            )
        )
    layout.add(
        table(
            f"Busy vs. working per GPU ({window} averages)",
            "Utilization next to the GPM ratios: a GPU at 100% utilization with low SM or"
            f" tensor activity is busy but slow. {GPM}",
            [
                Query(scope.gpus(names["avg"])),
                Query(scope.gpus(names["sm_active"])),
                Query(scope.gpus(names["tensor_active"])),
                Query(scope.gpus(names["dram_active"])),
                Query(scope.gpus(names["pipes"])),
            ],
            utilization,
            width=24,
            height=7,
            columns={
                "gpu": "GPU",
                "Value #A": "Utilization",
                "Value #B": "SM active",
                "Value #C": "Tensor active",
                "Value #D": "DRAM bandwidth",
                "Value #E": "Busiest compute pipe",
            },
            hidden=("Time", "__name__", "job", "instance", "node", "uuid"),
            overrides=[
                override(
                    "byRegexp",
                    "Utilization|SM active|Tensor active|DRAM bandwidth|Busiest compute pipe",
                    {"custom.cellOptions": {"type": "gauge", "mode": "basic"}},
                )
            ],
        ),
    )

    layout.row("Memory")
    layout.add(
        timeseries(
            "Memory used",
            "Device memory in use per GPU; the dashed lines are each GPU's total.",
            [
                Query(scope.gpus("gpu_memory_used_bytes"), legend="GPU {{gpu}}"),
                Query(scope.gpus("gpu_memory_total_bytes"), legend="GPU {{gpu}} total"),
            ],
            Field("bytes", Steps("green"), min=0),
            overrides=[dashed("total$")],
        ),
        bargauge(
            "Memory used / total",
            f"Fraction of device memory in use; red above {percent(full)} (GPUMemoryNearlyFull).",
            [Query(scope.gpus(names["memory_used"]), legend="GPU {{gpu}}", instant=True)],
            Field("percentunit", memory_steps, min=0, max=1),
        ),
    )

    layout.row("PCIe and NVLink")

    layout.add(
        timeseries(
            "PCIe throughput",
            "Bytes per second over the PCIe link; receive (host to GPU) up, transmit down.",
            [
                Query(
                    rate("gpu_pcie_receive_bytes_total"),
                    legend="GPU {{gpu}} rx",
                ),
                Query(
                    rate("gpu_pcie_transmit_bytes_total"),
                    legend="GPU {{gpu}} tx",
                ),
            ],
            Field("Bps", Steps("green")),
            width=8,
            overrides=[override("byRegexp", ".* tx", {"custom.transform": "negative-Y"})],
        ),
        timeseries(
            "NVLink throughput",
            "Bytes per second over all NVLinks of each GPU; receive up, transmit down.",
            [
                Query(
                    f"sum without (link) ({rate('gpu_nvlink_receive_bytes_total')})",
                    legend="GPU {{gpu}} rx",
                ),
                Query(
                    f"sum without (link) ({rate('gpu_nvlink_transmit_bytes_total')})",
                    legend="GPU {{gpu}} tx",
                ),
            ],
            Field("Bps", Steps("green")),
            width=8,
            overrides=[override("byRegexp", ".* tx", {"custom.transform": "negative-Y"})],
        ),
        bargauge(
            f"Link load ({window}, of bandwidth)",
            "The busier direction of each link as a fraction of its bandwidth; red above"
            f" {percent(link_busy)}, where the bottleneck view calls the GPU link-bound.",
            [
                Query(
                    f"max without (direction) ({scope.gpus(names['pcie_busy'])})",
                    legend="GPU {{gpu}} PCIe",
                    instant=True,
                ),
                Query(
                    f"max without (direction) ({scope.gpus(names['nvlink_busy'])})",
                    legend="GPU {{gpu}} NVLink",
                    instant=True,
                ),
            ],
            Field("percentunit", Steps("green", ((link_busy, "red"),)), min=0, max=1),
            width=8,
        ),
    )
    layout.add(
        table(
            "Link state",
            "PCIe generation and width against their maxima (a link below its maximum limits"
            " throughput), and the NVLinks up and down.",
            [
                Query(scope.gpus("gpu_pcie_link_generation")),
                Query(scope.gpus("gpu_pcie_link_max_generation")),
                Query(scope.gpus("gpu_pcie_link_width")),
                Query(scope.gpus("gpu_pcie_link_max_width")),
                Query(scope.gpus("gpu_nvlink_links_up")),
                Query(f"count without (link) ({scope.gpus('gpu_nvlink_link_down')})"),
            ],
            Field("short", Steps("green"), decimals=0),
            width=24,
            height=7,
            columns={
                "gpu": "GPU",
                "Value #A": "PCIe gen",
                "Value #B": "max gen",
                "Value #C": "PCIe width",
                "Value #D": "max width",
                "Value #E": "NVLinks up",
                "Value #F": "NVLinks down",
            },
            hidden=("Time", "__name__", "job", "instance", "node", "uuid"),
            overrides=[
                override(
                    "byName",
                    "NVLinks down",
                    {
                        "thresholds": Steps("green", ((1, "red"),)).json(),
                        "custom.cellOptions": {"type": "color-background"},
                    },
                )
            ],
        ),
    )

    layout.row("Temperature, power and clocks")
    layout.add(
        timeseries(
            "Temperature vs. slowdown threshold",
            "GPU temperature; dashed: each GPU's slowdown threshold, where the driver starts"
            f" cutting clocks. The red line is the {fallback:g} °C used for GPUs that report no"
            " threshold (GPUTemperatureHigh).",
            [
                Query(scope.gpus("gpu_temperature_celsius", 'sensor="gpu"'), legend="GPU {{gpu}}"),
                Query(
                    scope.gpus("gpu_temperature_slowdown_threshold_celsius"),
                    legend="GPU {{gpu}} slowdown",
                ),
            ],
            Field("celsius", Steps("green", ((fallback, "red"),))),
            width=8,
            threshold_lines=True,
            overrides=[dashed("slowdown$", "orange")],
        ),
        timeseries(
            "Power vs. limit",
            "Power draw; dashed: each GPU's enforced power limit.",
            [
                Query(scope.gpus("gpu_power_usage_watts"), legend="GPU {{gpu}}"),
                Query(scope.gpus("gpu_power_limit_watts"), legend="GPU {{gpu}} limit"),
            ],
            Field("watt", Steps("green"), min=0),
            width=8,
            overrides=[dashed("limit$")],
        ),
        timeseries(
            "SM clock vs. maximum",
            "SM clock; dashed: its maximum. A clock below its maximum under load is held down"
            " by one of the clock event reasons below.",
            [
                Query(scope.gpus("gpu_clock_hertz", 'clock="sm"'), legend="GPU {{gpu}}"),
                Query(scope.gpus("gpu_clock_max_hertz", 'clock="sm"'), legend="GPU {{gpu}} max"),
            ],
            Field("hertz", Steps("green"), min=0),
            width=8,
            overrides=[dashed("max$")],
        ),
    )
    active = Field(
        "none",
        Steps("green", ((1, "red"),)),
        mappings=[
            {
                "type": "value",
                "options": {
                    "0": {"text": "no", "color": "green", "index": 0},
                    "1": {"text": "active", "color": "red", "index": 1},
                },
            }
        ],
    )
    for title, reasons, what in (
        (
            "Thermal slowdown",
            "sw_thermal|hw_thermal|hw_slowdown",
            "Clocks cut by heat: software or hardware thermal slowdown, or hardware slowdown.",
        ),
        (
            "Power capping",
            "sw_power_cap|hw_power_brake",
            "Clocks held down by the power limit or an external power brake.",
        ),
    ):
        matcher = f"reason=~{json.dumps(reasons)}"
        layout.add(
            state_timeline(
                title,
                f"{what} Clock event reasons {reasons} (gpu_clock_event_active).",
                [
                    Query(
                        f"max without (reason) ({scope.gpus('gpu_clock_event_active', matcher)})",
                        legend="GPU {{gpu}}",
                    )
                ],
                active,
            )
        )

    layout.row("Errors and memory health")

    def ecc(kind: str) -> str:
        volatile = scope.gpus("gpu_ecc_errors_total", f'type="{kind}"', 'counter="volatile"')
        return f"sum without (type, counter) ({volatile})"

    layout.add(
        state_timeline(
            "Last XID",
            "The most recent critical XID event code of each GPU since the exporter started"
            " (0: none). See the GPUXidError runbook for what each code needs.",
            [Query(scope.gpus("gpu_last_xid_code"), legend="GPU {{gpu}}")],
            Field(
                "none",
                Steps("red"),
                mappings=[
                    {
                        "type": "value",
                        "options": {"0": {"text": "none", "color": "green", "index": 0}},
                    }
                ],
            ),
            width=12,
        ),
        table(
            "XID errors since the exporter started",
            "Critical XID events counted per GPU and code.",
            [Query(scope.pods(f"{scope.select('gpu_xid_errors_total')} > 0"))],
            Field("short", Steps("red"), decimals=0, no_value="No XID errors"),
            width=12,
            columns={"gpu": "GPU", "xid": "XID", "Value": "Events"},
            hidden=("Time", "__name__", "job", "instance", "node", "uuid"),
        ),
    )
    layout.add(
        table(
            "ECC errors and memory repair",
            "Volatile ECC error counts (since the driver loaded), remapped rows and pending or"
            " failed remaps (Ampere and newer), retired pages (older GPUs). A pending remap or"
            " retirement needs a GPU reset; a failed remap needs service.",
            [
                Query(ecc("corrected")),
                Query(ecc("uncorrected")),
                Query(f"sum without (type) ({scope.gpus('gpu_remapped_rows')})"),
                Query(scope.gpus("gpu_row_remap_pending")),
                Query(scope.gpus("gpu_row_remap_failed")),
                Query(f"sum without (cause) ({scope.gpus('gpu_retired_pages')})"),
                Query(scope.gpus("gpu_retired_pages_pending")),
            ],
            Field("short", Steps("green", ((1, "red"),)), decimals=0),
            width=24,
            height=7,
            columns={
                "gpu": "GPU",
                "Value #A": "ECC corrected",
                "Value #B": "ECC uncorrected",
                "Value #C": "Remapped rows",
                "Value #D": "Remap pending",
                "Value #E": "Remap failed",
                "Value #F": "Retired pages",
                "Value #G": "Retirement pending",
            },
            hidden=("Time", "__name__", "job", "instance", "node", "uuid"),
            overrides=[
                override(
                    "byRegexp",
                    "ECC uncorrected|Remap pending|Remap failed|Retirement pending",
                    {"custom.cellOptions": {"type": "color-background"}},
                )
            ],
        ),
    )

    layout.row("Processes and MIG")
    layout.add(
        table(
            "Processes by memory",
            "The compute processes holding the most GPU memory (the rest summed as (other)),"
            " with their SM utilization where the driver reports it.",
            [
                Query(f"sort_desc({scope.gpus('gpu_process_memory_used_bytes')})"),
                Query(scope.gpus("gpu_process_sm_utilization_ratio")),
            ],
            Field("bytes", Steps("green")),
            width=12,
            height=9,
            columns={
                "gpu": "GPU",
                "pid": "PID",
                "process": "Process",
                "Value #A": "Memory",
                "Value #B": "SM utilization",
            },
            hidden=("Time", "__name__", "job", "instance", "node", "uuid"),
            sort_by="Memory",
            overrides=[override("byName", "SM utilization", {"unit": "percentunit"})],
        ),
        table(
            "MIG instances",
            "Memory and (with GPM) SM and tensor activity of each MIG instance; no data on GPUs"
            " that are not in MIG mode.",
            [
                Query(scope.gpus("gpu_mig_memory_used_bytes")),
                Query(scope.gpus("gpu_mig_memory_total_bytes")),
                Query(rate("gpu_mig_sm_active_seconds_total")),
                Query(rate("gpu_mig_tensor_active_seconds_total")),
            ],
            Field("bytes", Steps("green")),
            width=12,
            height=9,
            columns={
                "gpu": "GPU",
                "mig_instance": "Instance",
                "mig_profile": "Profile",
                "Value #A": "Memory used",
                "Value #B": "Memory total",
                "Value #C": "SM active",
                "Value #D": "Tensor active",
            },
            hidden=("Time", "__name__", "job", "instance", "node", "uuid"),
            overrides=[
                override("byRegexp", "SM active|Tensor active", {"unit": "percentunit"}),
            ],
        ),
    )
    layout.add(
        bargauge(
            "MIG memory used / total",
            f"Fraction of each MIG instance's memory in use; red above {percent(full)}.",
            [
                Query(
                    scope.pods(
                        f"{scope.select('gpu_mig_memory_used_bytes')}\n"
                        f"/ {scope.select('gpu_mig_memory_total_bytes')}"
                    ),
                    legend="GPU {{gpu}} {{mig_profile}} #{{mig_instance}}",
                    instant=True,
                )
            ],
            Field("percentunit", memory_steps, min=0, max=1),
            width=24,
        ),
    )
    return dashboard(
        UID,
        "GPU node detail",
        "gpuload: the GPUs of one node: utilization next to GPM activity, memory, PCIe and"
        " NVLink, temperature, power, clocks and their event reasons, errors, processes, MIG.",
        variables(one_node=True, gpu=True),
        layout,
        time_from="now-1h",
    )
