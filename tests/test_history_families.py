"""The local history keeps only what its readers declare; they see what they would with all."""

from __future__ import annotations

import pytest
from helpers import Clock
from prometheus_client.parser import text_string_to_metric_families

from exporter import sim
from exporter.alerting import states, thresholds
from exporter.alerting.evaluator import Evaluator, history_horizon
from exporter.alerting.history import History, Sample, labels_of, snapshot_samples
from exporter.collection import Collection
from exporter.collectors import REGISTRY
from exporter.doctor import xids
from exporter.server.exposition import TEXT, Exposition

ALL_ON = {name: True for name in REGISTRY}


def test_a_history_with_declared_names_refuses_any_other() -> None:
    history = History(lambda _name: 60.0, keep={"gpu_up"})
    history.add([Sample("gpu_up", (("gpu", "0"),), 1.0), Sample("gpu_x", (), 2.0)], at=10.0)
    assert history.names() == {"gpu_up"}
    assert history.latest("gpu_up") == {(("gpu", "0"),): 1.0}
    with pytest.raises(KeyError, match="gpu_x"):
        history.latest("gpu_x")


@pytest.mark.parametrize(
    ("scenario", "times"),
    [
        # GPUUtilizationLow holds from the first whole minute and fires after its `for:` (5m).
        ("data-starved", range(0, 400, 10)),
        ("thermal-throttle", range(0, 400, 10)),
        ("memory-bound", range(0, 400, 10)),
        ("ecc-remap", range(0, 400, 10)),
        # Every 5 s: GPU 1, lost from 60 to 120 s, is retried at 65, 70, 75, 85, 105 and 140 s
        # (backoff 1, 2, 4, 8, 16, 32 s), so GPUFellOffBus (1m) fires at 120 s and resolves.
        ("faulty", range(0, 400, 5)),
    ],
)
def test_alerts_verdicts_and_xids_are_the_same_as_with_every_family(
    scenario: str, times: range
) -> None:
    rules = thresholds.load()
    kept = Evaluator(rules, instance="n1:19400", also_keep=states.FAMILIES)
    everything = Evaluator(rules, instance="n1:19400", history=History(history_horizon(rules)))
    assert kept.history.keep is not None and everything.history.keep is None
    clock = Clock(float(times[0]))
    sim.install(scenario, clock=clock, epoch=0)
    # Retries on the scenario's clock too: a lost GPU comes back when the scenario says.
    collection = Collection(ALL_ON, timeout=5, clock=clock)
    fired: list[list[tuple[str, str]]] = []
    try:
        for t in times:
            clock.now = float(t)
            snapshot = collection.run_cycle()
            at = float(t)
            changes = [
                evaluator.observe(snapshot_samples(snapshot, evaluator.history.keep), at)
                for evaluator in (kept, everything)
            ]
            assert changes[0] == changes[1], f"t={t}"
            fired.append([(alert.name, alert.state) for alert in changes[0]])
            assert kept.alerts() == everything.alerts(), f"t={t}"
            # What the doctor and the status page print: each GPU's verdict read from the
            # evaluation, named by the snapshot's GPUs, and the XIDs each GPU reported.
            identities = {str(gpu.index): (gpu.name, gpu.uuid) for gpu in snapshot.gpus}
            found = [
                (
                    states.read(evaluator.evaluated, rules, identities),
                    xids.reported(evaluator.history, rules),
                )
                for evaluator in (kept, everything)
            ]
            assert found[0] == found[1], f"t={t}"
            assert found[0][0] is not None and found[0][0].gpus, f"t={t}"
    finally:
        collection.close()
        sim.uninstall()
    # The comparison means something only where something happened.
    assert any(fired), f"{scenario}: no alert fired or resolved in {times}"


def test_sorted_labels_are_kept_within_their_bound() -> None:
    from exporter.alerting import history

    for n in range(history.SORTED_LABELS_KEPT + 10):
        labels = history.labels_of({"uuid": f"GPU-{n}", "gpu": str(n), "empty": ""})
        assert labels == (("gpu", str(n)), ("uuid", f"GPU-{n}"))
        assert len(history._SORTED_LABELS) <= history.SORTED_LABELS_KEPT
    # Kept or not, the same label set gives the same sorted pairs.
    assert history.labels_of({"uuid": "GPU-1", "gpu": "1"}) == (("gpu", "1"), ("uuid", "GPU-1"))


@pytest.mark.parametrize("scenario", ["h100-nvlink", "a100-mig", "faulty", "ecc-remap"])
def test_a_snapshots_series_are_the_samples_its_exposition_writes(scenario: str) -> None:
    # The local history reads a snapshot's series, /metrics writes its rows; both must agree
    # sample for sample, counters' `_total` names and empty labels included.
    rules = thresholds.load()
    keep = Evaluator(rules, instance="n1:19400", also_keep=states.FAMILIES).history.keep
    clock = Clock(100.0)
    sim.install(scenario, clock=clock, epoch=0)
    collection = Collection(ALL_ON, timeout=5, clock=clock)
    writer = Exposition()
    try:
        for t in (100.0, 110.0, 130.0):
            clock.now = t
            snapshot = collection.run_cycle()
            written = list(text_string_to_metric_families(writer.encode(snapshot, TEXT).decode()))
            for names in (None, keep):
                from_series = sorted(snapshot_samples(snapshot, names))
                from_exposition = sorted(
                    Sample(point.name, labels_of(point.labels), float(point.value))
                    for family in written
                    if names is None or family.name in names or f"{family.name}_total" in names
                    for point in family.samples
                )
                assert from_series == from_exposition
                assert len(from_series) > (100 if names is None else 10)
    finally:
        collection.close()
        sim.uninstall()
