"""`gpuload report` against a real Prometheus holding a week of the `pods` scenario.

The week (tests/accounting_week.py) is backfilled as blocks, the rules recorded over it level by
level, and one Prometheus serves the result: no real-time waits. The report's GPU-hours
allocated, used and idle per namespace and owner must equal the week's truth within 1%, with
whole, MIG, shared and DRA GPUs, a pod that ends midway, a 20-minute scrape gap (coverage goes
down, no hours are invented) and an exporter restart (every counter back to 0).
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from accounting_week import GAP, MONDAY, Truth, backfill_rules, create_blocks, week
from helpers import answers, free_port, wait_until

from exporter import cli
from exporter.report import ledger, period
from exporter.report.source import Source

pytestmark = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="needs Debian's prometheus and promtool (scripts/test installs them)",
)
WEEK = ["--from", "2026-11-30", "--to", "2026-12-07"]


class Store:
    """A Prometheus on a data folder, started and stopped at will."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, data: Path, name: str) -> str:
        port = free_port()
        config = self.folder / "prometheus.yml"
        config.write_text("global: {}\n", encoding="utf-8")
        with (self.folder / f"{name}.log").open("w") as log:
            self.process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=10y",
                    "--query.lookback-delta=59s",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(url + "/-/ready"), timeout=60, what="prometheus")
        return url

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None


@pytest.fixture(scope="module")
def week_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Truth]:
    """The week's folder: its OpenMetrics, each level of recorded rules, the blocks of all."""
    folder = tmp_path_factory.mktemp("week")
    truth = week(folder / "week.om")
    create_blocks(folder / "week.om", folder / "data")
    store = Store(folder)
    try:
        backfill_rules(folder / "data", folder, store.start, store.stop)
    finally:
        store.stop()
    return folder, truth


@pytest.fixture(scope="module")
def recorded(week_files: tuple[Path, Truth]) -> Iterator[tuple[str, Truth]]:
    folder, truth = week_files
    store = Store(folder)
    url = store.start(folder / "data", "report")
    yield url, truth
    store.stop()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def report_json(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> dict[str, Any]:
    code, out, err = run(capsys, "--prometheus", url, *WEEK, "-o", "json", *args)
    assert code == 0, err
    return json.loads(out)


def test_hours_per_namespace_and_owner_equal_the_weeks_truth(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, truth = recorded
    lines = report_json(capsys, url)["lines"]
    owners = {
        (line["namespace"], line["owner_kind"], line["owner_name"]): line
        for line in lines
        if "namespace" in line
    }
    # Whole (trainer, notebook), shared (ranker, tagger, finetune), MIG (llm-serve, embed),
    # DRA (vllm) and the job that ends at 60% of the week (nightly-eval).
    assert set(owners) == set(truth.allocated)
    for key, line in owners.items():
        allocated, used = truth.allocated[key], truth.used[key]
        assert line["allocated_gpu_hours"] == pytest.approx(allocated, rel=0.01), key
        assert line["used_gpu_hours"] == pytest.approx(used, rel=0.01, abs=0.05), key
        assert line["idle_gpu_hours"] == pytest.approx(
            max(0.0, allocated - used), rel=0.01, abs=0.1
        ), key
    (free,) = [line for line in lines if line.get("line") == "unallocated"]
    assert free["allocated_gpu_hours"] == pytest.approx(truth.unallocated, rel=0.01)
    assert free["used_gpu_hours"] == pytest.approx(truth.unallocated_used, rel=0.01)
    # Ranked by idle GPU-hours: the idle notebook first among the pods.
    idle = [line["idle_gpu_hours"] for line in lines]
    assert idle == sorted(idle, reverse=True)


def test_a_scrape_gap_lowers_coverage_and_invents_no_hours(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, truth = recorded
    document = report_json(capsys, url)
    gap_minutes = GAP[1] / 60
    assert document["coverage"] == pytest.approx((truth.minutes) / (7 * 1440), abs=0.0005)
    assert document["coverage"] < 1 - (gap_minutes - 2) / (7 * 1440)
    trainer = next(line for line in document["lines"] if line.get("owner_name") == "trainer")
    # The trainer held its GPU all week: with the gap filled in it would be 168 hours.
    assert trainer["allocated_gpu_hours"] < 168 - (gap_minutes - 2) / 60


def test_a_period_before_the_data_is_partial_and_says_where_the_data_begins(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = recorded
    code, out, err = run(capsys, "--prometheus", url, "--from", "2026-11-23", "--to", "2026-12-07")
    assert code == 1
    assert "GPU-hours 2026-11-23 00:00 to 2026-12-07 00:00 (UTC)" in out
    assert err.count("\n") == 1
    assert "partial: data covers 50.0% of the period" in err
    assert "the data begins at 2026-11-29 23:40" in err  # the week's margin


def test_a_period_without_data_cannot_run(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = recorded
    code, out, err = run(capsys, "--prometheus", url, "--from", "2025-01-06", "--to", "2025-01-13")
    assert (code, out) == (2, "")
    assert err.startswith(f"gpuload report: no accounting data at {url} for 2025-01-06 00:00")
    assert err.count("\n") == 1


def test_prices_per_model_and_an_unknown_model_without_a_default(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, truth = recorded
    document = report_json(capsys, url, "--price", "H100=2.5", "--currency", "EUR")
    assert document["currency"] == "EUR"
    trainer = next(line for line in document["lines"] if line.get("owner_name") == "trainer")
    assert trainer["cost"] == pytest.approx(2.5 * trainer["allocated_gpu_hours"])
    code, out, err = run(capsys, "--prometheus", url, *WEEK, "--price", "A100=1.2")
    assert (code, out) == (2, "")
    assert err == (
        "gpuload report: no price for GPU model 'NVIDIA H100 80GB HBM3': give --price "
        "'NVIDIA H100 80GB HBM3=PRICE' or --default-price\n"
    )
    document = report_json(capsys, url, "--price", "A100=1.2", "--default-price", "3")
    total = sum(line["cost"] for line in document["lines"])
    assert total == pytest.approx(3 * 8 * truth.minutes / 60, rel=0.01)


def test_csv_and_table_carry_the_same_lines(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = recorded
    code, out, _ = run(capsys, "--prometheus", url, *WEEK, "-o", "csv", "--by", "namespace")
    assert code == 0
    rows = out.splitlines()
    assert rows[0].startswith("namespace,allocated_gpu_hours,used_gpu_hours,idle_gpu_hours")
    assert {row.split(",")[0] for row in rows[1:]} == {
        "notebooks",
        "inference",
        "research",
        "unallocated",
    }
    code, out, _ = run(capsys, "--prometheus", url, *WEEK, "--by", "team")
    assert code == 0
    assert "team vision" in out and "team (none)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "7x"], "--since '7x': expected a duration like 7d, 24h or 90m"),
        (["--from", "2026-11-31"], "--from '2026-11-31': expected an RFC 3339 time"),
        (["--from", "2026-11-30T00:00:00"], "an RFC 3339 time needs its offset"),
        (["--since", "7d", "--tz", "Europe/Atlantis"], "--tz 'Europe/Atlantis': not a time zone"),
        (["--since", "7d", "--from", "2026-11-30"], "give one of --since DURATION, --from"),
        (["--from", "2026-12-07", "--to", "2026-11-30"], "the period is empty"),
        (["--since", "7d", "--price", "H100"], "--price 'H100': expected MODEL=PRICE"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--prometheus", "http://127.0.0.1:9", *args)
    assert (code, out) == (2, "")
    assert err.startswith("gpuload report: ") and message in err
    assert err.count("\n") == 1


def test_an_unreachable_or_wrong_prometheus_cannot_run(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = recorded
    port = free_port()
    code, _, err = run(capsys, "--prometheus", f"http://127.0.0.1:{port}", "--since", "7d")
    assert code == 2
    assert err.startswith(f"gpuload report: cannot reach a Prometheus at http://127.0.0.1:{port}")
    # A server that is not a query API: Prometheus's own /metrics page as the base URL.
    code, _, err = run(capsys, "--prometheus", url + "/metrics", "--since", "7d")
    assert code == 2
    assert "answered HTTP 404" in err or "does not answer like a Prometheus query API" in err
    assert err.count("\n") == 1


def test_weeks_start_on_monday_in_the_time_zone_and_periods_are_half_open() -> None:
    # Wednesday 2026-12-09 01:00 UTC is still Wednesday in New York (Tuesday 20:00).
    now = dt.datetime(2026, 12, 9, 1, 0, tzinfo=dt.timezone.utc)
    utc = period.parse(now=now, last_week=True)
    assert (utc.start, utc.end) == (
        dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc),
        dt.datetime(2026, 12, 7, tzinfo=dt.timezone.utc),
    )
    york = period.parse(now=now, last_week=True, tz="America/New_York")
    assert york.start == dt.datetime(2026, 11, 30, 5, tzinfo=dt.timezone.utc)
    assert york.words() == "2026-11-30 00:00 to 2026-12-07 00:00 (America/New_York)"
    days = period.parse(now=now, start="2026-11-30", end="2026-12-01", tz="Europe/Berlin")
    assert days.seconds == 86400
    assert days.start == dt.datetime(2026, 11, 29, 23, tzinfo=dt.timezone.utc)
    assert dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc).timestamp() == MONDAY


def test_the_dashboards_tables_give_the_reports_numbers(
    recorded: tuple[str, Truth], capsys: pytest.CaptureFixture[str]
) -> None:
    """The "GPU efficiency" dashboard's queries over the same period: the report's numbers."""
    url, _ = recorded
    lines = report_json(capsys, url)["lines"]
    board = json.loads(
        (Path(__file__).parent.parent / "grafana/dashboards/gpuload-efficiency.json").read_text()
    )
    (owners,) = [p for p in board["panels"] if p["title"].startswith("Namespaces and owners")]
    span = period.parse(now=dt.datetime.now(dt.timezone.utc), start=WEEK[1], end=WEEK[3])
    w, at = ledger.window(span)
    source = Source(url)
    columns = ("idle_gpu_hours", "allocated_gpu_hours", "used_gpu_hours")
    keys = ("namespace", "owner_kind", "owner_name")
    expected = {tuple(line[k] for k in keys): line for line in lines if "namespace" in line}
    for target, column in zip(owners["targets"], columns, strict=True):
        answer = source.query(target["expr"].replace("$__range", w), at)
        got = {tuple(labels.get(k, "") for k in keys): value for labels, value in answer}
        assert set(got) == set(expected), column
        for key, value in got.items():
            assert value == pytest.approx(expected[key][column], rel=1e-9, abs=1e-9), (column, key)
    (pods,) = [p for p in board["panels"] if p["title"].startswith("Pods that held idle")]
    answer = source.query(pods["targets"][0]["expr"].replace("$__range", w), at)
    longest = max(answer, key=lambda sample: sample[1])
    # The notebook held its idle GPU all week but for the gap.
    assert longest[0]["pod"] == "notebook-ana"
    assert longest[1] == pytest.approx(168, rel=0.01)


@pytest.mark.skipif(not shutil.which("victoria-metrics"), reason="needs Debian's victoria-metrics")
def test_victoriametrics_gives_the_same_report(
    week_files: tuple[Path, Truth],
    recorded: tuple[str, Truth],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same samples imported into VictoriaMetrics: the same report, found data and all."""
    folder, _ = week_files
    url, _ = recorded
    port = free_port()
    with (folder / "victoria-metrics.log").open("w") as log:
        store = subprocess.Popen(
            [
                "victoria-metrics",
                f"-storageDataPath={folder / 'vm-data'}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y",
                "-search.latencyOffset=0s",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        vm = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(vm + "/health"), timeout=30, what="victoria-metrics")
        for path in [folder / "week.om", *sorted(folder.glob("level-*.om"))]:
            import_openmetrics(vm, path)
        requests.get(vm + "/internal/force_flush", timeout=30)
        expected = report_json(capsys, url)
        got = report_json(capsys, vm)
        assert got["coverage"] == pytest.approx(expected["coverage"], rel=1e-6)
        assert len(got["lines"]) == len(expected["lines"])
        for mine, theirs in zip(got["lines"], expected["lines"], strict=True):
            assert mine.keys() == theirs.keys()
            for key in ("allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours"):
                assert mine[key] == pytest.approx(theirs[key], rel=1e-6), (mine, key)
        code, _, err = run(capsys, "--prometheus", vm, "--from", "2026-11-23", "--to", "2026-12-07")
        assert code == 1 and "the data begins at 2026-11-29 23:40" in err
    finally:
        store.terminate()
        store.wait(timeout=30)


def import_openmetrics(url: str, path: Path) -> None:
    """Send OpenMetrics samples to VictoriaMetrics' Prometheus text import (milliseconds).

    https://docs.victoriametrics.com/victoriametrics/single-server-victoriametrics/#how-to-import-data-in-prometheus-exposition-format
    """
    batch: list[str] = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("#") or not line.strip():
                continue
            head, _, seconds = line.rstrip("\n").rpartition(" ")
            batch.append(f"{head} {int(seconds) * 1000}")
            if len(batch) >= 200_000:
                _post(url, batch)
                batch = []
    if batch:
        _post(url, batch)


def _post(url: str, batch: list[str]) -> None:
    response = requests.post(url + "/api/v1/import/prometheus", data="\n".join(batch).encode())
    response.raise_for_status()
