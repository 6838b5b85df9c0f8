"""``python -m bench.accounting``: what the accounting rules cost at 1,000 GPUs and 5,000 pods.

A synthetic fleet of nodes of 8 GPUs (a tenth of the GPUs free, a quarter held whole, two fifths
H100s in MIG mode with 7 instances each held by a pod, the rest time-sliced by the remaining
pods; pods in 50 namespaces, two pods per Deployment, 20 teams, as kube-state-metrics reports
them) is written as 15 minutes of one-minute scrapes, loaded as blocks into a real Prometheus,
and the rules the accounting group reads are recorded level by level (:mod:`tools.backfill`).
Printed per size: the live series each accounting rule records, and the time one evaluation of
each takes (the median of 5 instant queries at the last minute). Two sizes by default.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from bench.node import free_port
from exporter.alerting import accounting, thresholds
from exporter.alerting.rules import rule_groups
from tools import backfill

START = 1_796_083_200  # 2026-12-01T00:00:00Z
MINUTES = 15
STEP = 60
NAMESPACES = 50
TEAMS = 20
SMS = 16  # an H100's SMs per compute slice: 7 instances of 1g


def fleet(gpus: int, pods: int, path: Path) -> None:
    """Write the fleet's scrapes as OpenMetrics."""
    free, whole, mig = gpus // 10, gpus // 4, gpus * 2 // 5
    shared = gpus - free - whole - mig
    holders: dict[int, list[tuple[int, str]]] = {g: [] for g in range(gpus)}
    pod = 0
    for g in range(free, free + whole):
        holders[g].append((pod, ""))
        pod += 1
    for g in range(free + whole, free + whole + mig):
        for instance in range(7):
            if pod < pods:
                holders[g].append((pod, str(instance + 1)))
                pod += 1
    sliced = list(range(free + whole + mig, gpus))
    while pod < pods and shared:
        holders[sliced[pod % shared]].append((pod, ""))
        pod += 1
    times = [START + STEP * i for i in range(MINUTES)]
    with path.open("w", encoding="utf-8") as out:
        for family, kind, series in _families(gpus, holders, free + whole + mig, free + whole):
            out.write(f"# TYPE {family} {'gauge' if kind == 'clock' else kind}\n")
            name = f"{family}_total" if kind == "counter" else family
            for labels, rate in series:
                text = backfill.labels_text(labels)
                for i, t in enumerate(times):
                    value = {"counter": rate * STEP * i, "clock": t}.get(kind, rate)
                    out.write(f"{name}{text} {value:.12g} {t}\n")
        out.write("# EOF\n")


def _families(
    gpus: int, holders: dict[int, list[tuple[int, str]]], shared_from: int, mig_from: int
) -> Iterator[tuple[str, str, list[tuple[dict[str, str], float]]]]:
    def gpu(g: int) -> dict[str, str]:
        node = f"node-{g // 8:04d}"
        return {"instance": f"{node}:19400", "job": "gpuload", "node": node, "gpu": str(g % 8),
                "uuid": f"GPU-{g:08d}"}  # fmt: skip

    def use(g: int) -> float:
        return (g * 37 % 100) / 100

    is_mig = [mig_from <= g < shared_from for g in range(gpus)]
    nodes = sorted({gpu(g)["node"] for g in range(gpus)})
    yield (
        "gpuload_last_collection_timestamp_seconds",
        "clock",
        [({"instance": f"{n}:19400", "job": "gpuload", "node": n}, 1.0) for n in nodes],
    )
    yield "gpu_up", "gauge", [(gpu(g), 1.0) for g in range(gpus)]
    model = "NVIDIA H100 80GB HBM3"
    yield "gpu_info", "gauge", [({**gpu(g), "name": model}, 1.0) for g in range(gpus)]
    yield "gpu_mig_mode_enabled", "gauge", [(gpu(g), float(is_mig[g])) for g in range(gpus)]
    yield "gpu_processes", "gauge", [(gpu(g), float(len(holders[g]))) for g in range(gpus)]
    yield (
        "gpu_utilization_seconds",
        "counter",
        [(gpu(g), use(g)) for g in range(gpus) if not is_mig[g]],
    )
    instances = [(g, str(i + 1)) for g in range(gpus) if is_mig[g] for i in range(7)]
    yield (
        "gpu_mig_multiprocessors",
        "gauge",
        [
            (
                {
                    **gpu(g),
                    "mig_instance": i,
                    "mig_compute_instance": "0",
                    "mig_profile": "1g.10gb",
                },
                SMS,
            )
            for g, i in instances
        ],
    )
    yield (
        "gpu_mig_sm_active_seconds",
        "counter",
        [
            ({**gpu(g), "mig_instance": i, "mig_profile": "1g.10gb"}, use(g + int(i)))
            for g, i in instances
        ],
    )
    held = [(g, p, i) for g in range(gpus) for p, i in holders[g]]

    def who(p: int) -> dict[str, str]:
        return {"namespace": f"ns-{p // 2 % NAMESPACES:02d}", "pod": f"app-{p // 2}-{p}"}

    yield (
        "gpu_pod_info",
        "gauge",
        [({**gpu(g), **who(p), "container": "main", "mig_instance": i}, 1.0) for g, p, i in held],
    )
    yield (
        "gpu_pod_utilization_seconds",
        "counter",
        [
            ({**gpu(g), **who(p), "container": "main"}, use(g) / len(holders[g]))
            for g, p, i in held
            if not i and len(holders[g]) > 1
        ],
    )
    ksm = {"instance": "ksm:8080", "job": "kube-state-metrics"}
    pods = sorted({p for _, p, _ in held})
    yield "kube_pod_owner", "gauge", [
        ({**ksm, **who(p), "uid": str(p), "owner_kind": "ReplicaSet",
          "owner_name": f"app-{p // 2}-rs", "owner_is_controller": "true"}, 1.0)
        for p in pods
    ]  # fmt: skip
    yield "kube_replicaset_owner", "gauge", [
        ({**ksm, "namespace": who(p)["namespace"], "replicaset": f"app-{p // 2}-rs",
          "owner_kind": "Deployment", "owner_name": f"app-{p // 2}",
          "owner_is_controller": "true"}, 1.0)
        for p in pods
        if p % 2 == 0 or p - 1 not in pods
    ]  # fmt: skip
    yield (
        "kube_pod_labels",
        "gauge",
        [
            ({**ksm, **who(p), "uid": str(p), "label_team": f"team-{p // 2 % TEAMS}"}, 1.0)
            for p in pods
        ],
    )


class Store:
    """A Prometheus on a data folder, looking back one step less a second."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, data: Path, name: str) -> str:
        """Start it on ``data``; its URL once ready."""
        port = free_port()
        config = self.folder / "prometheus.yml"
        config.write_text("global: {}\n", encoding="utf-8")
        with (self.folder / f"{name}.log").open("w") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=10y",
                 f"--query.lookback-delta={STEP - 1}s"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/-/ready", timeout=1).status_code == 200:
                    return url
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"Prometheus did not start: {self.folder / name}.log")

    def stop(self) -> None:
        """Stop it, if it runs."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=60)
            self.process = None


def measure(gpus: int, pods: int, folder: Path) -> list[tuple[str, int, float]]:
    """(record, live series, seconds per evaluation) of each accounting rule at one size."""
    fleet(gpus, pods, folder / "fleet.om")
    data = folder / "data"
    backfill.create_blocks(folder / "fleet.om", data)
    store = Store(folder)
    group = next(
        g
        for gs in rule_groups(thresholds.load()).values()
        for g in gs
        if g.name == accounting.GROUP
    )
    names = [rule.record for rule in group.recordings()]
    end = START + STEP * (MINUTES - 1)
    levels = backfill.rule_levels(names)
    # Every level but the accounting group's own rules: those are timed below, one at a time.
    backfill.record(
        [[r for r in level if r.record not in names] for level in levels if any(
            r.record not in names for r in level)],
        data, folder, store.start, store.stop, (START + 600, end, STEP),
    )  # fmt: skip
    rows = []
    url = store.start(data, "measure")
    try:
        for rule in group.recordings():
            seconds = []
            for _ in range(5):
                started = time.monotonic()
                answer = requests.post(
                    url + "/api/v1/query", data={"query": rule.expr, "time": end}, timeout=600
                ).json()
                seconds.append(time.monotonic() - started)
            count = len(answer["data"]["result"]) if answer["status"] == "success" else -1
            rows.append((rule.record, count, statistics.median(seconds)))
            # The next rules read this one's result: record its last minute as a sample.
            _append(url, data, folder, store, rule.record, answer)
            url = store.start(data, "measure")
    finally:
        store.stop()
    return rows


def _append(
    url: str, data: Path, folder: Path, store: Store, record: str, answer: dict[str, object]
) -> None:
    del url
    store.stop()
    path = folder / f"{record.replace(':', '_')}.om"
    result = answer["data"]["result"]  # type: ignore[index]
    with path.open("w", encoding="utf-8") as out:
        out.write(f"# TYPE {record} gauge\n")
        for series in result:
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            at, value = series["value"]
            for back in range(5):
                out.write(
                    f"{record}{backfill.labels_text(labels)} {value} {int(at) - back * STEP}\n"
                )
        out.write("# EOF\n")
    backfill.create_blocks(path, data)


def main() -> int:
    """Measure each size and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.accounting", description=__doc__)
    parser.add_argument(
        "--size", action="append", metavar="GPUS:PODS", help="default: 250:1250 and 1000:5000"
    )
    args = parser.parse_args()
    sizes = [tuple(map(int, s.split(":"))) for s in args.size or ["250:1250", "1000:5000"]]
    for gpus, pods in sizes:
        with tempfile.TemporaryDirectory(prefix="gpuload-accounting-") as folder:
            rows = measure(gpus, pods, Path(folder))
        print(f"\n{gpus} GPUs, {pods} pods")
        print(f"{'series':<44} {'live':>7} {'ms/eval':>8}")
        for record, count, seconds in rows:
            print(f"{record:<44} {count:>7} {seconds * 1000:>8.1f}")
        print(
            f"{'total':<44} {sum(c for _, c, _ in rows):>7} {sum(s for *_, s in rows) * 1000:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
