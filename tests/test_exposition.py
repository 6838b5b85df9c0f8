"""gpuload's writer of /metrics against prometheus_client's encoders: the same bytes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import Clock
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.exposition import generate_latest as text_encoder
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_encoder

from exporter import sim
from exporter.collection import Collection, CollectorRun, Layout, Snapshot
from exporter.collectors import REGISTRY, CollectorSpec, Family, Sample
from exporter.server.exposition import OPENMETRICS, TEXT, Exposition, format_of
from exporter.server.http import SnapshotCollector
from exporter.sim.scenario import scenario_names

ROOT = Path(__file__).resolve().parents[1]
ENCODERS = {TEXT: text_encoder, OPENMETRICS: openmetrics_encoder}


def _prometheus_client(snapshot: Snapshot, form: str) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return ENCODERS[form](registry)


def _writer() -> Exposition:
    return Exposition(CollectorRegistry(auto_describe=False))  # nothing after the snapshot


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
                assert "families" not in vars(snapshot), "the writer built the families"
                assert written == _prometheus_client(snapshot, form), (scenario, t, form)
                vars(snapshot).pop("families", None)
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


def test_families_already_built_are_written_by_prometheus_client() -> None:
    snapshot = _awkward_snapshot()
    snapshot.families[0].add_metric(["9", "GPU-x", "added"], 1)  # only in the built families
    written = _writer().encode(snapshot, OPENMETRICS)
    assert b'gpu_test_value{gpu="9",process="added",uuid="GPU-x"} 1.0' in written


@pytest.mark.parametrize(
    ("accept", "form"),
    [
        ("", TEXT),
        ("text/plain;version=0.0.4;q=0.5,*/*;q=0.1", TEXT),
        # Prometheus 2.x and 3.x scrape headers.
        (
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
            "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
            OPENMETRICS,
        ),
        ("application/openmetrics-text;version=1.0.0;escaping=underscores", OPENMETRICS),
        ("application/openmetrics-text", OPENMETRICS),
        ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8", None),
        ("application/openmetrics-text;version=2.0.0", None),
        ("text/plain;version=1.0.0;escaping=values", None),
    ],
)
def test_only_the_formats_the_writer_reproduces_are_given_to_it(
    accept: str, form: str | None
) -> None:
    encoder, _content_type = choose_encoder(accept)
    assert format_of(encoder) == form
