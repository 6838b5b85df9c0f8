"""The order of precedence places every alert that can be on a GPU, once."""

from __future__ import annotations

from exporter.alerting import health, precedence, rules, thresholds


def test_every_gpu_alert_has_one_place_in_the_order_of_precedence() -> None:
    loaded = thresholds.load()
    # The exporter's own alerts and a node's count of GPUs are on no GPU.
    exporter = {"Exporter", "Collector", "PodResources", "NVML", "Stale"}
    on_no_gpu = {"GPUCountDropped", "GPUVanished"}
    on_gpus = {
        name
        for name in loaded.alerts
        if name not in on_no_gpu and not any(name.startswith(f"GPULoad{w}") for w in exporter)
    }
    assert len(set(precedence.PRECEDENCE)) == len(precedence.PRECEDENCE)
    assert set(precedence.PRECEDENCE) == on_gpus
    assert {a for a in rules.BOTTLENECK_ALERTS.values() if a} <= set(precedence.PRECEDENCE)


def test_the_order_of_precedence_ranks_a_folded_faults_forms_as_its_fold_does() -> None:
    """One fault's alerts, worst first in its fold, stand in that order in the precedence too."""
    for fold in health.FOLDS:
        ranked = [name for name in fold.outranks if name in precedence.PRECEDENCE]
        assert ranked == sorted(ranked, key=precedence.rank), fold.alert
