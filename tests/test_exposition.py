"""gpuload's writer of /metrics against prometheus_client's encoders: the same bytes."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Clock
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as text_encoder
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_encoder

from exporter import sim
from exporter.collection import Collection
from exporter.collectors import REGISTRY, CollectorSpec, Family, Sample
from exporter.server.exposition import (
    CONTENT_TYPES,
    OPENMETRICS,
    TEXT,
    Exposition,
    ProcessMetrics,
    negotiate,
)
from exporter.sim.scenario import scenario_names
from exporter.snapshot import CollectorRun, Layout, Snapshot, each_family_samples, shape_of

ROOT = Path(__file__).resolve().parents[1]
ENCODERS = {TEXT: text_encoder, OPENMETRICS: openmetrics_encoder}


class _Families:
    """A snapshot's rows as prometheus_client families, built as its users build them."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        for family, samples in each_family_samples(self._snapshot.layout, self._snapshot.all_runs):
            name, _, labels = shape_of(family)
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            built = kind(name, family.help, labels=list(labels))
            for gpu_labels, sample in samples:
                built.add_metric([*gpu_labels, *sample.labels], sample.value)
            yield built


def _registry_of(snapshot: Snapshot) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(snapshot))
    return registry


def _prometheus_client(snapshot: Snapshot, form: str) -> bytes:
    return ENCODERS[form](_registry_of(snapshot))


def _writer() -> Exposition:
    return Exposition()  # nothing after the snapshot


@pytest.mark.parametrize(
    "scenario",
    [*scenario_names(), *sorted(str(p) for p in (ROOT / "bench" / "scenarios").glob("*.yaml"))],
)
def test_every_scenarios_snapshots_are_written_as_prometheus_client_writes_them(
    scenario: str,
) -> None:
    clock = Clock(100.0)
    sim.install(scenario, clock=clock, epoch=0)
    # Slow reads on the scenario's clock: 101 s is a fast cycle, 112 s a slow one.
    collection = Collection(dict.fromkeys(REGISTRY, True), timeout=5, slow_interval=10, clock=clock)
    writer = _writer()
    try:
        for t in (100.0, 101.0, 112.0, 400.0):  # fast and slow cycles, faults coming and going
            clock.now = t
            snapshot = collection.run_cycle()
            for form in (TEXT, OPENMETRICS):
                written = writer.encode(snapshot, form)
                assert written == _prometheus_client(snapshot, form), (scenario, t, form)
    finally:
        collection.close()
        sim.uninstall()


def _awkward_snapshot() -> Snapshot:
    families = (
        Family(
            "gpu_test_value",
            "gauge",
            'A value; with a \\ backslash,\n a newline and "quotes".',
            ("process",),
        ),
        Family("gpu_test_events_total", "counter", "Events.", ("kind", "a_first")),
        Family("gpu_test_node", "gauge", "Node-wide, no labels.", per_gpu=False),
    )
    spec = CollectorSpec(name="test", families=families, factory=object)
    values = [
        0,
        -0.0,
        1.5,
        7,
        2**53 + 1,
        1e21,
        123456789.0,
        1234567.0,
        0.1,
        -2.5e-7,
        math.inf,
        -math.inf,
        math.nan,
    ]
    samples = [
        Sample("gpu_test_value", value, (name,))
        for value, name in zip(
            values,
            [
                'py"thon',
                "back\\slash",
                "new\nline",
                "ünïcödé ✓",
                "",
                " spaced ",
                "a,b=c",
                "{}",
                "x" * 200,
                "tab\there",
                "'single'",
                "\\n literal",
                "last",
            ],
            strict=True,
        )
    ]
    samples += [
        Sample("gpu_test_events_total", 3, ("xid", "z")),
        Sample("gpu_test_events_total", 0, ("", "")),
    ]
    runs = (
        CollectorRun(name="test", samples=tuple(samples), gpu=0, labels=("0", "GPU-aaa")),
        CollectorRun(name="test", samples=tuple(samples[:3]), gpu=1, labels=("1", "")),
        CollectorRun(name="test", samples=(Sample("gpu_test_node", 42.0),)),
    )
    return Snapshot(gpus=(), nvml_up=True, completed_at=0.0, runs=runs, layout=Layout([spec]))


@pytest.mark.parametrize("form", [TEXT, OPENMETRICS])
def test_awkward_label_values_and_numbers_are_written_as_prometheus_client_writes_them(
    form: str,
) -> None:
    snapshot = _awkward_snapshot()
    writer = _writer()
    first = writer.encode(snapshot, form)
    assert first == _prometheus_client(_awkward_snapshot(), form)
    assert writer.encode(snapshot, form) == first  # with the family's format kept
    assert b'process="py\\"thon"' in first and b"NaN" in first and b"+Inf" in first


@pytest.mark.parametrize(
    "accept",
    [
        "",
        "*/*",
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        # Prometheus 2.x and 3.x scrape headers.
        "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
        "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
        "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
        "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
        "application/openmetrics-text;version=1.0.0;escaping=underscores",
        "application/openmetrics-text",
        "application/openmetrics-text;version=0.0.1",
        "application/openmetrics-text;version=0.0.1,text/plain;version=1.0.0",
        "text/plain;version=1.0.0;escaping=values",
        "text/plain;version=1.0.0;escaping=nonsense",
        "text/plain; version=1.0.0",
        "application/json,text/html",
    ],
)
def test_a_scrape_gets_the_format_and_content_type_prometheus_client_would_give(
    accept: str,
) -> None:
    encoder, content_type = choose_encoder(accept)
    form, ours = negotiate(accept)
    written = _prometheus_client(_awkward_snapshot(), form)
    assert written == encoder(_registry_of(_awkward_snapshot()))
    assert ours == content_type


def test_an_openmetrics_version_not_written_here_is_answered_in_1_0_0_and_said_so() -> None:
    # prometheus_client would write its experimental 2.0.0; gpuload writes 1.0.0 and says so.
    assert negotiate("application/openmetrics-text;version=2.0.0") == (
        OPENMETRICS,
        f"{CONTENT_TYPES[OPENMETRICS]}; escaping=underscores",
    )


def _shapes(text: str) -> dict[str, tuple[str, ...]]:
    """HELP, TYPE and label names of each family in an exposition, by family name."""
    shapes: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            name = line.split()[2]
            shapes[name] = (*shapes.get(name, ()), line)
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            labels = tuple(re.findall(r'([a-z_]+)="', line))
            shapes[name] = (*shapes.get(name, ()), *labels)
    return shapes


def test_the_process_metrics_are_prometheus_clients_in_name_help_type_and_labels() -> None:
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    theirs = text_encoder(registry).decode()
    ours = Exposition(ProcessMetrics()).encode(Snapshot((), True, 0.0), TEXT).decode()
    assert _shapes(ours) == _shapes(theirs)
    assert len(_shapes(ours)) == 7
    # What does not move between two reads is the same value.
    for name in ("process_start_time_seconds", "process_max_fds", "python_info"):
        mine = [line for line in ours.splitlines() if line.startswith(name)]
        assert mine == [line for line in theirs.splitlines() if line.startswith(name)]


def test_name_filters_keep_the_families_asked_for_by_their_sample_names() -> None:
    snapshot = _awkward_snapshot()
    written = Exposition(ProcessMetrics()).encode(
        snapshot, TEXT, ["gpu_test_events_total", "process_open_fds"]
    )
    names = {line.split()[2] for line in written.decode().splitlines() if line.startswith("# TYPE")}
    assert names == {"gpu_test_events_total", "process_open_fds"}


def test_a_name_that_would_need_quoting_is_refused_when_the_layout_is_made() -> None:
    family = Family("gpu.dotted", "gauge", "A name Prometheus 2 cannot scrape.")
    with pytest.raises(ValueError, match=r"'gpu\.dotted' is not a name"):
        Layout([CollectorSpec(name="dotted", families=(family,), factory=object)])
