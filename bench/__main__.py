"""``python -m bench``: run the benchmark, print the tables and rewrite bench/RESULTS.md."""

from __future__ import annotations

import argparse
import gzip
import sys
import time
from pathlib import Path

from bench import load, report
from bench.node import BENCH, Daemon, ensure_peers, free_port, gpuload_command, nvitop_command
from exporter.sim.scenario import load_scenario

SCENARIOS = BENCH / "scenarios"
# (node, scenario file, exporters): the slow-NVML node runs gpuload alone, to show that its
# scrape does not depend on NVML's latency and that GPUs are read in parallel.
NODES = (
    ("1 x H100", "h100x1", ("gpuload", "nvitop")),
    ("8 x H100", "h100x8", ("gpuload", "nvitop")),
    ("16 x H100", "h100x16", ("gpuload", "nvitop")),
    ("8 x A100, 7 MIG each", "a100x8-mig", ("gpuload", "nvitop")),
    ("16 x H100, slow NVML", "h100x16-slow", ("gpuload",)),
)
# One call per GPU per cycle in both exporters (and per MIG instance in nvitop's): counts cycles.
_CYCLE_MARKER = "nvmlDeviceGetPowerUsage"
# Blocking waits outside the collection cycle (gpuload's XID thread).
_NOT_IN_CYCLE = {"nvmlEventSetWait_v2"}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short windows (a smoke run)")
    parser.add_argument("--only", choices=("gpuload", "nvitop"), help="run one exporter")
    parser.add_argument("--nodes", nargs="*", help="scenario names to run (default: all)")
    parser.add_argument("--no-relay", action="store_true", help="skip the relay benchmark")
    parser.add_argument(
        "--no-evaluation", action="store_true", help="skip the local alerting benchmark"
    )
    parser.add_argument("--no-write", action="store_true", help="do not rewrite RESULTS.md")
    return parser.parse_args()


def measure(
    exporter: str,
    scenario: Path,
    *,
    cpu_window: float,
    profile: float,
    py_spy: Path,
    quick: bool = False,
) -> dict[str, float]:
    """Start one exporter on one simulated node and measure it."""
    port = free_port()
    command = gpuload_command(port) if exporter == "gpuload" else nvitop_command(port)
    spec = load_scenario(scenario)
    gpus = len(spec.gpus)
    daemon = Daemon(exporter, scenario, command, port)
    result: dict[str, float] = {}
    try:
        daemon.wait_ready()
        time.sleep(3)  # past start-up: discovery, first GPM samples, imports
        counters_before, usage_before = daemon.simulator_counters(), daemon.usage()
        time.sleep(cpu_window)
        counters_after, usage_after = daemon.simulator_counters(), daemon.usage()
        elapsed = usage_after.at - usage_before.at
        cpu = usage_after.cpu_seconds - usage_before.cpu_seconds
        simulator_cpu = counters_after.cpu_seconds - counters_before.cpu_seconds
        delta = {k: v - counters_before.calls.get(k, 0) for k, v in counters_after.calls.items()}
        # nvitop-exporter also asks each MIG instance for its power (gpuload does not).
        mig = sum(len(gpu.mig) for gpu in spec.gpus) if exporter == "nvitop" else 0
        cycles = delta.get(_CYCLE_MARKER, 0) / (gpus + mig)
        result["cpu_per_minute"] = cpu / elapsed * 60
        result["cycles_per_minute"] = cycles / elapsed * 60
        result["cpu_ms_per_cycle"] = cpu / cycles * 1000 if cycles else float("nan")
        result["own_cpu_ms_per_cycle"] = (
            (cpu - simulator_cpu) / cycles * 1000 if cycles else float("nan")
        )
        in_cycle = {k: v for k, v in delta.items() if k not in _NOT_IN_CYCLE}
        result["calls_per_cycle"] = sum(in_cycle.values()) / cycles if cycles else float("nan")
        per_gpu = sum(
            count / cycles / gpus * load.sleep_cost(spec.driver.latency_of(name))
            for name, count in in_cycle.items()
            if cycles
        )
        result["nvml_ms_per_gpu"] = per_gpu * 1000
        share = load.profile_share(py_spy, daemon.pid, profile) if profile else None
        result["sim_share"] = float("nan") if share is None else share
        text, gzip_bytes = load.exposition(port)
        result["series"] = load.series(text)
        result["bytes"] = len(text.encode())
        result["gzip_bytes"] = gzip_bytes
        # A scrape a second apart, as Prometheus's every 15 s: each comes after a new snapshot.
        cycle_seconds, cold = [], []
        for _ in range(5):
            seconds, body = load.scrape(port, load.PROMETHEUS_HEADERS)
            cold.append(seconds)
            text = gzip.decompress(body).decode() if body[:2] == b"\x1f\x8b" else body.decode()
            cycle_seconds += load.values_of(text, "gpuload_collection_duration_seconds")
            time.sleep(1.1)
        result["cold_ms"] = load.median(cold) * 1000
        result["cycle_ms"] = load.median(cycle_seconds) * 1000 if cycle_seconds else float("nan")
        one = load.scrape_latencies(port, 1, 200)
        ten = load.scrape_latencies(port, 10, 30)
        result["p50_1"], result["p99_1"] = (
            load.median(one) * 1000,
            load.percentile(one, 0.99) * 1000,
        )
        result["p50_10"], result["p99_10"] = (
            load.median(ten) * 1000,
            load.percentile(ten, 0.99) * 1000,
        )
        spread = load.spread_latencies(port, 120 if quick else 400)
        result["p99_spread"] = load.percentile(spread, 0.99) * 1000
        result["rss_mb"] = daemon.peak_rss_bytes() / 2**20
        result["pss_mb"] = daemon.pss_bytes() / 2**20
    finally:
        daemon.stop()
    return result


def main() -> int:
    """Run everything, print, write RESULTS.md."""
    args = _arguments()
    started = time.monotonic()
    peers = ensure_peers()
    cpu_window = 5.0 if args.quick else 12.0
    rows: list[report.Row] = []
    for node, name, exporters in NODES:
        if args.nodes and name not in args.nodes:
            continue
        for exporter in exporters:
            if args.only and exporter != args.only:
                continue
            print(f"{node}: {exporter} ...", flush=True)
            profile = 0.0 if args.quick or "8" not in name else 6.0
            result = measure(
                exporter,
                SCENARIOS / f"{name}.yaml",
                cpu_window=cpu_window,
                profile=profile,
                py_spy=peers / "bin" / "py-spy",
                quick=args.quick,
            )
            rows.append(report.Row(node, exporter, result))
    relay_rows = []
    if not args.no_relay:
        from bench import relay

        print("relay ...", flush=True)
        relay_rows = relay.run(quick=args.quick)
    evaluation_table = ""
    if not args.no_evaluation:
        from bench import evaluation

        print("local alerting ...", flush=True)
        evaluation_table = evaluation.table(evaluation.run(rounds=3 if args.quick else 5))
    seconds = time.monotonic() - started
    table = report.table(rows)
    relay_table = report.relay_table(relay_rows)
    print()
    print(table)
    print()
    print(relay_table)
    print()
    print(evaluation_table)
    print(f"\n{seconds:.0f} s in all")
    if not args.no_write:
        report.write_results(
            table,
            relay_table,
            evaluation_table,
            rows,
            relay_rows,
            seconds,
            " ".join(sys.argv[1:]),
        )
        print(f"wrote {report.RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
