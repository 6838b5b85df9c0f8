"""The `gpuload serve` process, started for real and reached over HTTP."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import ROOT, Daemon, free_port, gpuload, series, value_of, wait_until
from relay_helpers import start_relay_process, write_config


def test_without_nvml_the_daemon_stays_up_and_says_why(daemon_factory) -> None:
    # This machine has no NVIDIA driver: the real pynvml cannot load libnvidia-ml.so.1.
    daemon = daemon_factory("--collect.interval", "200ms")
    assert daemon.get("/healthz").status_code == 200
    samples = daemon.metrics()
    assert value_of(samples, "gpuload_nvml_up") == 0
    assert value_of(samples, "gpuload_build_info", version="0.1.0") == 1
    wait_until(
        lambda: (
            (
                value_of(
                    daemon.metrics(),
                    "gpuload_nvml_errors_total",
                    collector="nvml",
                    error="library_not_found",
                )
                or 0
            )
            >= 2
        ),
        what="a retried NVML initialisation",
    )
    # Retried with backoff, but said once: not one line per attempt.
    assert daemon.log().count("libnvidia-ml.so.1 not found") == 1
    assert "install the NVIDIA driver" in daemon.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("program", ["serve", "relay"])
def test_signal_stops_either_daemon_cleanly_through_the_shared_handler(
    daemon_factory, tmp_path: Path, program: str, sig: int
) -> None:
    if program == "serve":
        daemon = daemon_factory()
    else:
        # A target that is never reached: nothing is posted.
        target = {"type": "webhook", "url": "http://127.0.0.1:9/hook"}
        config = {"targets": {"hook": target}, "route": {"targets": ["hook"]}}
        daemon = start_relay_process(write_config(tmp_path, config))
    try:
        # A daemon that ignores the signal or hangs in its shutdown fails here
        # (TimeoutExpired), however fast or slow this machine is.
        daemon.stop(sig)
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
    assert daemon.process.returncode == 0
    wait_until(lambda: "stopped" in daemon.log(), what="the stop to be logged")
    # Said by exporter.web.signals, the one handler both daemons install.
    said = f"exporter.web.signals: received {signal.Signals(sig).name}, shutting down"
    assert said in daemon.log()


def test_metrics_honour_gzip_and_openmetrics(daemon_factory) -> None:
    daemon = daemon_factory()
    zipped = daemon.get("/metrics", headers={"Accept-Encoding": "gzip"}, stream=True)
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert b"gpuload_nvml_up" in gzip.decompress(zipped.raw.read())
    open_metrics = daemon.get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert open_metrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert open_metrics.text.rstrip().endswith("# EOF")
    plain = daemon.get("/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "# HELP gpuload_nvml_up" in plain.text


def test_unknown_path_is_404_and_landing_page_links_metrics(daemon_factory) -> None:
    daemon = daemon_factory()
    assert daemon.get("/nope").status_code == 404
    page = daemon.get("/")
    assert page.headers["Content-Type"].startswith("text/html")
    assert 'href="/metrics"' in page.text


def test_json_logs_are_one_object_per_line(daemon_factory) -> None:
    daemon = daemon_factory("--log-format", "json")
    daemon.stop()
    records = [json.loads(line) for line in daemon.lines if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any("listening on" in record["message"] for record in records)


def test_bad_flag_value_exits_2_naming_the_flag() -> None:
    result = gpuload("serve", "--collect.interval", "soon", timeout=30)
    assert result.returncode == 2
    assert "flag --collect.interval: 'soon' is not valid" in result.stderr


def test_port_in_use_is_a_clear_error(daemon_factory) -> None:
    daemon = daemon_factory()
    port = daemon.url.rstrip("/").rsplit(":", 1)[1]
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--web.listen-address", f"127.0.0.1:{port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_simulated_node_serves_every_gpu_and_stops_cleanly(daemon_factory) -> None:
    daemon = daemon_factory("--simulate", "training", "--collect.interval", "200ms")
    # A GPU whose reads outlast a cycle's timeout (a busy machine) reports from a later cycle.
    wait_until(lambda: len(series(daemon.metrics(), "gpu_utilization_ratio")) == 8, what="8 GPUs")
    assert value_of(daemon.metrics(), "gpuload_nvml_up") == 1
    page = daemon.get("/").text
    assert page.count("NVIDIA H100 80GB HBM3") == 8
    daemon.stop()
    assert daemon.process.returncode == 0


def test_metrics_appear_when_the_driver_loads(daemon_factory, tmp_path) -> None:
    # The scenario starts when the daemon installs the simulator (no --sim.epoch): its first
    # NVML initialisation, milliseconds later, meets the unloaded driver whenever the daemon
    # was started. The driver loads 5 s in, and a retry after that finds it (1, 3, 7 s...).
    scenario = tmp_path / "late-driver.yaml"
    scenario.write_text(
        "driver: {version: '550.90.07', cuda_version: 12040}\n"
        "gpus: [{model: l4, count: 2}]\n"
        "phases: [{duration: 1h, utilization: 0.5}]\n"
        "faults: [{kind: driver_not_loaded, at: 0, until: 5}]\n"
    )
    daemon = daemon_factory("--simulate", str(scenario), "--collect.interval", "200ms")
    wait_until(
        lambda: value_of(daemon.metrics(), "gpuload_nvml_up") == 1, timeout=40, what="NVML up"
    )
    wait_until(
        lambda: len(series(daemon.metrics(), "gpu_utilization_ratio")) == 2,
        what="both GPUs reporting",
    )
    # It was down first, and said so once.
    failures = value_of(
        daemon.metrics(), "gpuload_nvml_errors_total", collector="nvml", error="driver_not_loaded"
    )
    assert failures is not None and failures >= 1
    wait_until(lambda: "NVML initialised: 2 GPUs" in daemon.log(), what="the recovery logged")
    assert daemon.log().count("NVML initialisation failed") == 1


def test_listening_on_every_interface_says_so(daemon_factory: Callable[..., Daemon]) -> None:
    port = free_port()
    daemon = daemon_factory("--simulate", "idle", "--web.listen-address", f":{port}")
    assert f"listening on http://127.0.0.1:{port}/ on every interface" in daemon.log()


def test_collection_goes_on_after_a_failed_cycle_and_ends_when_stopped() -> None:
    from exporter.server.daemon import _collect_until

    stop = threading.Event()
    calls: list[int] = []

    def cycle() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("a collector's bug")
        if len(calls) == 3:
            stop.set()

    _collect_until(stop, 0.01, cycle)
    assert calls == [0, 1, 2]
